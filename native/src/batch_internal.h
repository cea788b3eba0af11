// Internals shared by the batch kernels (batch.cpp: value and reducing state;
// batch_collections.cpp: list and map state): validation helpers, little-endian loads/stores,
// the row key encoder with prefetching (RowKeys) and the map access helpers. Not a public header:
// everything here serves the kernels' contract in batch.h / batch_collections.h.
#pragma once

#include <algorithm>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "statecore/batch.h"
#include "statecore/collection_index.h"
#include "statecore/detail/flat_lane.h"
#include "statecore/detail/map_impl.h"
#include "statecore/hash.h"
#include "statecore/key_codec.h"
#include "statecore/key_columns.h"
#include "statecore/ttl.h"

namespace statecore {
namespace batch_detail {
[[noreturn]] inline void fail(const std::string& msg) { throw BatchError(msg); }

inline std::string row_str(int64_t row) { return "row " + std::to_string(row); }

// "ms" for the unit letter 'm' (ArrayView::time_unit), and so on.
inline std::string unit_name(char unit) {
  switch (unit) {
    case 's': return "s";
    case 'm': return "ms";
    case 'u': return "us";
    case 'n': return "ns";
  }
  return "?";
}

// The statecore name of a value type: "timestamp[ms]", "fixed_size_binary[16]", "int64", ...
inline std::string value_type_name(const ValueSpec& t) {
  switch (t.type) {
    case ValueType::Int64: return "int64";
    case ValueType::Float64: return "float64";
    case ValueType::String: return "string";
    case ValueType::Binary: return "binary";
    case ValueType::Int32: return "int32";
    case ValueType::Bool: return "bool";
    case ValueType::UInt64: return "uint64";
    case ValueType::Timestamp: return "timestamp[" + unit_name(t.unit) + "]";
    case ValueType::FixedSizeBinary: return "fixed_size_binary[" + std::to_string(t.width) + "]";
  }
  return "?";
}

// An Arrow array's type in the same words, for "expected ..., got ..." messages.
inline std::string arrow_type_name(const ArrayView& v) {
  if (v.kind() == ArrowKind::Timestamp) return "timestamp[" + unit_name(v.time_unit()) + "]";
  if (v.kind() == ArrowKind::FixedSizeBinary)
    return "fixed_size_binary[" + std::to_string(v.byte_width()) + "]";
  return arrow_kind_name(v.kind());
}

inline bool value_format_ok(const ValueSpec& t, const ArrayView& v) {
  const ArrowKind k = v.kind();
  switch (t.type) {
    case ValueType::Int64: return k == ArrowKind::Int64;
    case ValueType::Float64: return k == ArrowKind::Float64;
    case ValueType::String: return k == ArrowKind::Utf8 || k == ArrowKind::LargeUtf8;
    case ValueType::Binary: return k == ArrowKind::Binary || k == ArrowKind::LargeBinary;
    case ValueType::Int32: return k == ArrowKind::Int32;
    case ValueType::Bool: return k == ArrowKind::Bool;
    case ValueType::UInt64: return k == ArrowKind::UInt64;
    case ValueType::Timestamp: return k == ArrowKind::Timestamp && v.time_unit() == t.unit;
    case ValueType::FixedSizeBinary:
      return k == ArrowKind::FixedSizeBinary && v.byte_width() == t.width;
  }
  return false;
}

// A parameter outside its domain (ValueSpec) would make value_width() or the format check
// meaningless, so every kernel rejects it first.
inline void check_spec(const ValueSpec& t) {
  if (t.type == ValueType::Timestamp && unit_name(t.unit) == "?")
    fail(std::string("value type timestamp: unit '") + t.unit + "' is not one of s, m, u, n");
  if (t.type == ValueType::FixedSizeBinary && t.width < 1)
    fail("value type fixed_size_binary: width " + std::to_string(t.width) + " must be >= 1");
}

inline bool is_fixed(const ValueSpec& t) { return value_width(t) != 0; }

// The NamespaceType of a namespaced batch's namespace column (BatchKeySpec::ns).
inline NamespaceType namespace_type_of(const KeySchema& ns) {
  if (!ns.is_struct && ns.columns.size() == 1) {
    switch (ns.columns[0].type) {
      case KeyType::Int32: return NamespaceType::Int32;
      case KeyType::Int64: return NamespaceType::Int64;
      case KeyType::String: return NamespaceType::String;
      case KeyType::Binary: return NamespaceType::Binary;
      default: break;
    }
  }
  fail("namespace type " + ns.name() + " is not supported (int32, int64, string or binary)");
}

// BatchError "<what>: invalid Arrow data: row R: <why>" when check_column_data finds a bad row.
inline void check_data_row(int64_t row, const char* what, const std::string& why) {
  if (row >= 0) fail(std::string(what) + ": invalid Arrow data: " + row_str(row) + ": " + why);
}

// The keys of a kernel call, validated: formats (KeyArrays), then the offsets and UTF-8 of every
// variable-width column, the namespace column's reported as "namespaces" (check_column_data).
inline KeyArrays make_keys(const BatchKeySpec& spec, ArrowInput in) {
  try {
    if (spec.has_namespace) namespace_type_of(spec.ns);
    KeyArrays k = spec.has_namespace ? KeyArrays(spec.key, spec.ns, in.schema, in.array)
                                     : KeyArrays(spec.key, in.schema, in.array);
    std::string why;
    check_data_row(k.check_data(&why), "keys", why);
    if (const KeyArrays* ns = k.namespaces())
      check_data_row(ns->check_data(&why), "namespaces", why);
    return k;
  } catch (const BatchError&) {
    throw;
  } catch (const std::invalid_argument& e) {
    fail(std::string("keys: ") + e.what());
  }
}

// One column of a kernel call (values, list elements), validated as make_keys validates keys;
// `role` names it in errors.
inline ArrayView make_view(ArrowInput in, const char* role) {
  try {
    ArrayView v(in.schema, in.array);
    std::string why;
    check_data_row(check_column_data(v, &why), role, why);
    return v;
  } catch (const BatchError&) {
    throw;
  } catch (const std::invalid_argument& e) {
    fail(std::string(role) + ": " + e.what());
  }
}

// Stored fixed-width values are little-endian regardless of the host (docs/formats.md "Values").
using detail::be64;
using detail::le64;
using detail::load_le32;
using detail::load_le64;
using detail::store_le32;
using detail::store_le64;
inline int64_t load_i64(const uint8_t* p) { return static_cast<int64_t>(load_le64(p)); }
inline uint64_t load_u64(const uint8_t* p) { return load_le64(p); }
inline double load_f64(const uint8_t* p) {
  const uint64_t u = load_le64(p);
  double d;
  std::memcpy(&d, &u, 8);
  return d;
}
inline void store_i64(uint8_t* p, int64_t v) { store_le64(p, static_cast<uint64_t>(v)); }
inline int32_t load_i32(const uint8_t* p) { return static_cast<int32_t>(load_le32(p)); }
inline void store_i32(uint8_t* p, int32_t v) { store_le32(p, static_cast<uint32_t>(v)); }
// The reference deserializer reads any nonzero byte as true; writes are always 00/01.
inline bool load_bool(const uint8_t* p) { return *p != 0; }
inline void store_bool(uint8_t* p, bool v) { *p = v ? 1 : 0; }
inline void store_f64(uint8_t* p, double d) {
  uint64_t u;
  std::memcpy(&u, &d, 8);
  store_le64(p, u);
}

[[noreturn]] inline void wrong_width(int64_t row, size_t got, size_t want) {
  fail(row_str(row) + ": the stored value holds " + std::to_string(got) + " bytes, expected " +
       std::to_string(want) +
       " (the table holds values of another type than declared, or "
       "another TTL setting)");
}

// Stored bytes of a fixed-width accumulator type T (the reference serializers' widths).
template <class T>
constexpr size_t stored_width() {
  return std::is_same<T, bool>::value ? 1 : std::is_same<T, int32_t>::value ? 4 : 8;
}

// Bytes of a stored fixed-width value: its width, plus the timestamp suffix with TTL.
inline size_t fixed_width(size_t user_width, const TtlBatchSpec& ttl) {
  return ttl.enabled ? user_width + ttl::kTimestampBytes : user_width;
}
template <class T>
inline size_t fixed_width(const TtlBatchSpec& ttl) {
  return fixed_width(stored_width<T>(), ttl);
}

// Row i of a get_batch_fixed output: the stored value at p, or zeros for an absent key (p null).
inline void out_fixed(const ValueSpec& t, void* out, int64_t i, const uint8_t* p) {
  switch (t.type) {
    case ValueType::Int64:
    case ValueType::Timestamp: static_cast<int64_t*>(out)[i] = p ? load_i64(p) : 0; break;
    case ValueType::UInt64: static_cast<uint64_t*>(out)[i] = p ? load_u64(p) : 0; break;
    case ValueType::Float64: static_cast<double*>(out)[i] = p ? load_f64(p) : 0.0; break;
    case ValueType::Int32: static_cast<int32_t*>(out)[i] = p ? load_i32(p) : 0; break;
    case ValueType::Bool: static_cast<uint8_t*>(out)[i] = p && load_bool(p) ? 1 : 0; break;
    case ValueType::FixedSizeBinary: {
      uint8_t* dst = static_cast<uint8_t*>(out) + i * static_cast<int64_t>(t.width);
      if (p) std::memcpy(dst, p, static_cast<size_t>(t.width));
      else std::memset(dst, 0, static_cast<size_t>(t.width));
      break;
    }
    case ValueType::String:
    case ValueType::Binary: break;
  }
}

inline void check_ttl(const TtlBatchSpec& ttl) {
  if (ttl.enabled && ttl.ttl_ms <= 0)
    fail("ttl: ttl_ms must be > 0, got " + std::to_string(ttl.ttl_ms));
}

// Callers may pass no counter; the kernels always count somewhere.
inline int64_t* expired_sink(int64_t* expired, int64_t* local) {
  int64_t* p = expired != nullptr ? expired : local;
  *p = 0;
  return p;
}

// Per-thread key-group scratch: one allocation per thread and growth, not per batch or row.
inline std::vector<int32_t>& kg_scratch() {
  thread_local std::vector<int32_t> kgs;
  return kgs;
}

// Validation pass over the keys: spec, table range, nulls, key groups (formats were checked by
// make_keys). Returns the key group of every row (kg_scratch()). Touches no state.
inline const int32_t* validate_keys(StateTable& table, const BatchKeySpec& spec,
                                    const KeyArrays& keys) {
  try {
    check_max_parallelism(spec.max_parallelism);
  } catch (const std::invalid_argument& e) {
    fail(e.what());
  }
  if (spec.kg_start < 0 || spec.kg_start > spec.kg_end || spec.kg_end >= spec.max_parallelism)
    fail("key-group range [" + std::to_string(spec.kg_start) + ", " + std::to_string(spec.kg_end) +
         "] must satisfy 0 <= kg_start <= kg_end < max_parallelism (" +
         std::to_string(spec.max_parallelism) + ")");
  try {
    // StateTable ranges are contiguous, so holding both ends means holding every key group the
    // apply pass can reach; checking now keeps map() from throwing half-way through a batch.
    table.map(spec.kg_start);
    table.map(spec.kg_end);
  } catch (const std::out_of_range&) {
    fail("the state table does not hold the key-group range [" + std::to_string(spec.kg_start) +
         ", " + std::to_string(spec.kg_end) + "]");
  }
  int column = -1;
  const int64_t null_row = keys.first_null(&column);
  if (null_row >= 0) {
    if (column < 0 || !spec.key.is_struct) fail("keys: null key at " + row_str(null_row));
    fail("keys: null in field " + std::to_string(column) + " of the key at " + row_str(null_row) +
         " (a multi-column key must not have null fields)");
  }
  if (const KeyArrays* ns = keys.namespaces()) {
    const int64_t ns_null = ns->first_null(nullptr);
    if (ns_null >= 0) fail("namespaces: null namespace at " + row_str(ns_null));
  }
  const int64_t n = keys.length();
  std::vector<int32_t>& kgs = kg_scratch();
  kgs.resize(static_cast<size_t>(n));
  try {
    keys.key_groups(spec.assigner, spec.max_parallelism, kgs.data());
  } catch (const std::invalid_argument& e) {
    fail(std::string("keys: ") + e.what());
  }
  // key_groups() returns [0, maxP): a table over the whole range needs no check. Otherwise an
  // OR-reduction without a branch a row (the compiler vectorizes it, which it cannot do for a
  // loop with an early exit), and the row only looked for when one is out.
  if (spec.kg_start != 0 || spec.kg_end != spec.max_parallelism - 1) {
    const uint32_t lo = static_cast<uint32_t>(spec.kg_start);
    const uint32_t span = static_cast<uint32_t>(spec.kg_end - spec.kg_start);
    const int32_t* k = kgs.data();
    uint32_t out_of_range = 0;
    for (int64_t i = 0; i < n; ++i) out_of_range |= (static_cast<uint32_t>(k[i]) - lo) > span;
    for (int64_t i = 0; out_of_range && i < n; ++i) {
      if (kgs[i] < spec.kg_start || kgs[i] > spec.kg_end)
        fail("keys: " + row_str(i) + " belongs to key group " + std::to_string(kgs[i]) +
             ", outside this table's key-group range [" + std::to_string(spec.kg_start) + ", " +
             std::to_string(spec.kg_end) +
             "] (was the batch routed by the same assigner and "
             "max parallelism?)");
    }
  }
  return kgs.data();
}

// varlen(n) into dst (at most 10 bytes; key_codec.h); returns its size.
inline size_t put_varlen(uint8_t* dst, uint64_t n) {
  size_t p = 0;
  while (n >= 0x80) {
    dst[p++] = static_cast<uint8_t>(n | 0x80);
    n >>= 7;
  }
  dst[p++] = static_cast<uint8_t>(n);
  return p;
}

// The flat lanes (detail/flat_lane.h) of one kernel call, one per key group of the table, kept
// per thread across calls: a lane is open in a call iff its epoch is the call's, so a call
// touching few of many key groups costs no reset of the others.
class Lanes {
 public:
  // Always inlined, as get(): an outlined constructor let `this` escape, and every store of a
  // row (byte-typed, so aliasing anything) then reloaded the members a row.
  [[gnu::always_inline]] explicit Lanes(StateTable& table) : table_(table) {
    thread_local std::vector<detail::FlatLane> lanes;
    thread_local uint32_t epoch = 0;
    const size_t n = static_cast<size_t>(table.kg_end() - table.kg_start()) + 1;
    if (lanes.size() < n) lanes.resize(n);
    if (++epoch == 0) {  // wrapped: a lane of 2^32 calls ago must not look open
      for (detail::FlatLane& l : lanes) l.epoch = 0;
      epoch = 1;
    }
    lanes_ = lanes.data();
    kg_start_ = table.kg_start();
    epoch_ = epoch;
    detail::enter_kernel();
  }
  // The write-through pages the call's write lanes held are given back (WriteThrough::hold).
  ~Lanes() { detail::leave_kernel(); }
  Lanes(const Lanes&) = delete;
  Lanes& operator=(const Lanes&) = delete;
  // Key group kg's lane for a key of ks bytes (and, vs != 0, values of vs bytes), or nullptr.
  // Both sizes are checked on every row: string keys and put_batch's string values vary by row.
  [[gnu::always_inline]] detail::FlatLane* get(int32_t kg, const uint8_t* key, size_t ks, size_t vs,
                                               bool write) {
    detail::FlatLane& l = lanes_[kg - kg_start_];
    if (l.epoch == epoch_) return l.fits(ks) && (vs == 0 || l.value_size == vs) ? &l : nullptr;
    if (!l.open(table_.map_unchecked(kg).engine(), key, ks, vs, write)) return nullptr;
    l.epoch = epoch_;
    return &l;
  }
  // After any other call on key group kg's map (see FlatLane).
  void close(int32_t kg) {
    lanes_[kg - kg_start_].epoch = 0;
    ++generation_;
  }
  // Counts close() calls: a slot address a lane gave (FlatLane::home_slot) is sound for as long
  // as this has not changed since (a lane that closed may reopen on another table).
  uint32_t generation() const { return generation_; }
  const uint32_t* generation_ptr() const { return &generation_; }
  // The lanes as RowKeys' hasher sees them (it runs outside the kernel's row loop): a null
  // view has none.
  struct View {
    const detail::FlatLane* lanes = nullptr;
    // The address of key group 0's lane, lanes - kg_start (below the array when kg_start > 0):
    // a row finds its lane from its key group in one register instead of the base and
    // kg_start, which GCC kept on the stack and reloaded a row in the kernels' loops.
    uintptr_t lane0 = 0;
    uint32_t epoch = 0;

    // The lane of key group kg (kg_start <= kg, so at or past `lanes`).
    [[gnu::always_inline]] const detail::FlatLane& lane(int32_t kg) const {
      return *reinterpret_cast<const detail::FlatLane*>(
          lane0 + static_cast<uintptr_t>(static_cast<uint32_t>(kg)) * sizeof(detail::FlatLane));
    }
    // Key group kg's lane when it is open in this call, else nullptr.
    [[gnu::always_inline]] const detail::FlatLane* open_lane(int32_t kg) const {
      if (lanes == nullptr) return nullptr;
      const detail::FlatLane& l = lane(kg);
      return l.epoch == epoch ? &l : nullptr;
    }
    // FlatLane::prefetch of hash h through key group kg's lane; false, doing nothing, when the
    // lane is not open in this call.
    [[gnu::always_inline]] bool prefetch(int32_t kg, uint32_t h) const {
      const detail::FlatLane* l = open_lane(kg);
      if (l == nullptr) return false;
      l->prefetch(h);
      return true;
    }
  };
  View view() const {
    return View{lanes_,
                reinterpret_cast<uintptr_t>(lanes_) -
                    static_cast<uintptr_t>(kg_start_) * sizeof(detail::FlatLane),
                epoch_};
  }

 private:
  StateTable& table_;
  detail::FlatLane* lanes_;  // index kg - kg_start
  int32_t kg_start_;
  uint32_t epoch_;
  uint32_t generation_ = 0;
};

// Encodes row i's key as prefix | ser(key) | ser(namespace) (00 for the VoidNamespace; batch.h
// BatchKeySpec) into the reused buffer, and keeps the cache ahead of the rows being applied:
// the working set of a large state does not fit in L2, and every row would otherwise pay two
// dependent cache misses (bucket slot, then entry). ahead(i), called before the group of rows
// starting at i in a forward pass, hashes the next group and prefetches its slots (flat maps)
// or buckets (chained), and prefetches the first entry of group i's rows in chained maps (whose
// buckets were requested a group earlier). Rows are still applied one by one in row order; a
// prefetch made stale by a rehash or a write in between only wastes a cache line.
class RowKeys {
 public:
  RowKeys(const BatchKeySpec& spec, const KeyArrays& keys, StateTable& table, const int32_t* kgs)
      : enc_(spec.key, ns_type(keys), spec.max_parallelism),
        ahead_enc_(spec.key, ns_type(keys), spec.max_parallelism),
        ns_(keys.namespaces()),
        table_(table),
        kgs_(kgs),
        n_(keys.length()),
        // String keys (chained maps) of a small state are encoded and hashed row by row: the
        // state stays in cache, and a group's work ahead would only cost. int64 keys take the
        // groups at any size (below).
        prefetch_(table.size() >= kPrefetchMinEntries),
        prefix_size_(key_group_prefix_size(spec.max_parallelism)),
        hash_fn_(table.map_unchecked(table.kg_start()).engine().hash_fn) {
    enc_.bind(keys);
    ahead_enc_.bind(keys);
    // int64 keys (the common case) skip the general encoder: prefix | big-endian int64 | 00 is
    // written in place, far cheaper than the general encoder's checks and appends.
    // Namespaces are written in place too (write_ns) unless key and namespace are both
    // variable-length: Flink's lenbytes then follow each part, which only the encoder writes.
    if (ns_) {
      const KeyType t = ns_->schema().columns[0].type;
      ns_col_ = ns_->scalar_column();
      ns_width_ = t == KeyType::Int64 ? 8 : t == KeyType::Int32 ? 4 : 0;
    }
    const bool ambiguous = ns_ && ns_width_ == 0 && spec.key.variable_length();
    const ArrayView* col = ambiguous ? nullptr : keys.scalar_column();
    // int32 keys likewise, big-endian in 4 bytes (Flink IntSerializer): through the encoder
    // they cost ~4x an int64 row (add_batch, 200k keys).
    if (col && (spec.key.columns[0].type == KeyType::Int64 ||
                spec.key.columns[0].type == KeyType::Int32)) {
      int_keys_ = col;
      int_width_ = spec.key.columns[0].type == KeyType::Int64 ? 8 : 4;
    }
    // String/binary keys likewise: prefix | varlen(len + 1) | bytes | 00, without the general
    // encoder's checks and vector appends.
    if (col && (spec.key.columns[0].type == KeyType::String ||
                spec.key.columns[0].type == KeyType::Binary))
      bytes_keys_ = col;
    int_in_one_ = int_keys_ != nullptr && (ns_ == nullptr || ns_width_ != 0);
    bytes_void_ = bytes_keys_ != nullptr && ns_ == nullptr;
    int64_words_ = int_keys_ != nullptr && int_width_ == 8 && ns_ == nullptr &&
                   hash_fn_ == nullptr && !detail::kBigEndianHost;
    // Fixed-size keys are written in place into the groups' buffers: sized once here rather
    // than resized (a call) for every group.
    if (int_in_one_)
      for (Group& g : groups_) g.bytes.resize(kGroup * kInt64KeyMax);
    // int64 and int32 keys (flat maps) go through the groups at any state size: encoded row by
    // row, a key's hash reads bytes stored just before by narrower stores, which the CPU cannot
    // forward: a stall a row, even in a state that fits the cache.
    if (int_in_one_) prefetch_ = true;
  }

  // Row i's encoded key becomes data()/size(): the copy made when its group was hashed ahead,
  // or (small states, or a row outside the two groups kept, as an undo replay asks for) encoded
  // now. Each row is encoded once on the prefetching path.
  void encode(int64_t i, int32_t kg) {
    if (prefetch_) {
      // Unsigned: rows are >= 0, and signed / and % by 16 cost a sign fix-up each.
      const uint64_t u = static_cast<uint64_t>(i);
      const Group& g = groups_[(u / kGroup) & 1];
      const size_t j = static_cast<size_t>(u % kGroup);
      if (g.start == static_cast<int64_t>(u - j)) {
        const uint32_t off = g.fixed_size ? static_cast<uint32_t>(j) * g.fixed_size : g.offsets[j];
        cur_ = g.bytes.data() + off;
        cur_size_ = g.fixed_size ? g.fixed_size : g.offsets[j + 1] - off;
        cur_hash_ = g.hashes[j];
        cur_row_ = i;
        return;
      }
    }
    cur_row_ = -1;
    if (int_in_one_) {
      cur_size_ = ns_ ? write_int_key(i, kg, one_) : write_int_key<true>(i, kg, one_);
      cur_ = one_;
      return;
    }
    if (bytes_void_) {
      cur_ = one_buffer(bytes_key_bound(i));
      cur_size_ = write_bytes_key<true>(i, kg, one_bytes_.data());
      return;
    }
    encode_other(i, kg);
  }

  // For a kernel whose rows never look their encoded key itself up (list and map state: their
  // entries are `prefix | suffix`, EntryKeysAhead): groups are encoded and hashed, but no slot
  // or bucket of the bare prefix is prefetched (a cache line fetched for nothing a row, and
  // the line fill buffers it holds delay the prefetches that matter). Before the first ahead().
  void skip_table_prefetch() { table_prefetch_ = false; }

  // `lanes`: the calling kernel's, whose open lanes prefetch for less (Lanes::View).
  void ahead(int64_t i, const Lanes* lanes = nullptr) {
    if (!prefetch_ || static_cast<uint64_t>(i) % kGroup != 0) return;
    if (i == 0) hash_group(0, lanes);
    const Group& g = groups_[(static_cast<uint64_t>(i) / kGroup) & 1];
    for (int64_t j = i; !g.all_flat && j < std::min(i + kGroup, n_); ++j) {
      StateMap& m = table_.map_unchecked(kgs_[j]);
      if (!m.engine().flat) m.prefetch_entry(g.hashes[j - i]);  // a flat slot is its entry
    }
    hash_group(i + kGroup, lanes);
  }

  const uint8_t* data() const { return cur_; }
  size_t size() const { return cur_size_; }
  // The map hash of row i's encoded key (encode(i) done): computed ahead when prefetching.
  uint32_t hash(int64_t i, const StateMap& m) const {
    return cur_row_ == i ? cur_hash_ : m.hash(data(), size());
  }

  // Rows hashed and prefetched at a time, one group ahead of the rows applied. A group's
  // prefetches are issued in a burst, which the hasher may stall on, so larger is not better;
  // 16 suits the hasher that hands the hot rows their home slots (Group::slots).
  static constexpr int64_t kGroup = 16;
  // The keys and map hashes of rows [start, start + kGroup) as hash_group encoded them, for a
  // row loop that takes a group at a time (for_rows) and keeps the view in registers: encode()
  // wrote and data()/size()/hash() re-read RowKeys' members, which every byte store of a row
  // may alias, so they would be reloaded every row. `valid` is false when the
  // rows are not hashed ahead (small states); then encode() row by row.
  struct GroupView {
    const uint8_t* bytes = nullptr;
    const uint32_t* offsets = nullptr;
    const uint32_t* hashes = nullptr;
    // kInt64WordKey or kInt64WordKey + 1 (1- or 2-byte prefix): key j is
    // bytes + j * fixed_size (hash_int64_words; offsets are not written); 0: see offsets.
    uint32_t fixed_size = 0;
    bool valid = false;
    // fixed_size != 0: row j's home slot through its open lane (FlatLane::home_slot; nullptr
    // when the lane was not open or the page missing), computed while the kernel's Lanes had
    // generation `generation`.
    uint8_t* const* slots = nullptr;
    uint32_t generation = 0;
  };
  // The encoded size of an int64 key with the void namespace and a 1-byte prefix.
  static constexpr uint32_t kInt64WordKey = 10;
  GroupView group(int64_t start) const {
    if (!prefetch_) return GroupView{};
    const Group& g = groups_[(static_cast<uint64_t>(start) / kGroup) & 1];
    if (g.start != start) return GroupView{};
    return GroupView{g.bytes.data(), g.offsets, g.hashes,    g.fixed_size,
                     true,           g.slots,   g.generation};
  }

 private:
  // ~32 B header + key + value per entry: from about 16k entries on the state outgrows L2
  // (the groups' threshold for string and other keys; int64 keys always take them).
  static constexpr size_t kPrefetchMinEntries = 16 * 1024;
  // encode() of the rarer forms, out of line so that the common ones stay small enough to be
  // inlined into the kernels' row loops (inlined, this would enlarge every int64 row).
  [[gnu::noinline]] void encode_other(int64_t i, int32_t kg) {
    if (int_keys_ || bytes_keys_) {
      cur_ = one_buffer(int_keys_ ? int_key_bound(i) : bytes_key_bound(i));
      cur_size_ = int_keys_ ? write_int_key(i, kg, one_bytes_.data())
                            : write_bytes_key(i, kg, one_bytes_.data());
      return;
    }
    encode_into(enc_, i, kg);
    cur_ = enc_.data();
    cur_size_ = enc_.size();
  }

  // one_bytes_ with room for `bound` bytes. Grown, never shrunk: a resize a row would re-zero the
  // bytes past a shorter key's end (a vector append and a memset call a row).
  uint8_t* one_buffer(size_t bound) {
    if (one_bytes_.size() < bound) one_bytes_.resize(bound);
    return one_bytes_.data();
  }

  // The most an int key (int64 or int32) with a void (00) or fixed-width (<= 8 bytes)
  // namespace takes: prefix, key, namespace.
  static constexpr size_t kInt64KeyMax = 2 + 8 + 8;

  // Bytes write_ns may write for row i: 00 (void), 4 or 8 (int32/int64), varint + bytes.
  size_t ns_bound(int64_t i) const {
    if (ns_ == nullptr) return 1;
    if (ns_width_) return ns_width_;
    size_t sz;
    ns_col_->bytes_at(i, &sz);
    return 10 + sz;
  }
  size_t int_key_bound(int64_t i) const { return 2 + int_width_ + ns_bound(i); }

  // ser(namespace) of row i at dst (key_codec.h): the VoidNamespace's 00, an int32/int64
  // big-endian, or string/binary varlen(len + 1) | bytes. Not for the ambiguous case (the
  // constructor leaves that to the encoder).
  size_t write_ns(int64_t i, uint8_t* dst) const {
    if (ns_ == nullptr) {
      dst[0] = 0;
      return 1;
    }
    return write_ns_column(i, dst);
  }
  [[gnu::noinline]] size_t write_ns_column(int64_t i, uint8_t* dst) const {
    if (ns_width_ == 8) {
      const uint64_t be = be64(static_cast<uint64_t>(ns_col_->int64_at(i)));
      std::memcpy(dst, &be, 8);
      return 8;
    }
    if (ns_width_ == 4) {
      const uint32_t u = static_cast<uint32_t>(ns_col_->int32_at(i));
      dst[0] = static_cast<uint8_t>(u >> 24);
      dst[1] = static_cast<uint8_t>(u >> 16);
      dst[2] = static_cast<uint8_t>(u >> 8);
      dst[3] = static_cast<uint8_t>(u);
      return 4;
    }
    size_t sz;
    const uint8_t* src = ns_col_->bytes_at(i, &sz);
    size_t p = put_varlen(dst, static_cast<uint64_t>(sz) + 1);
    if (sz) std::memcpy(dst + p, src, sz);
    return p + sz;
  }

  // The encoded keys and hashes of rows [start, start + kGroup).
  struct Group {
    int64_t start = -1;
    std::vector<uint8_t> bytes;
    uint32_t offsets[kGroup + 1] = {};
    uint32_t hashes[kGroup] = {};
    bool all_flat = false;        // every row's map is flat: nothing for ahead() to prefetch
    uint32_t fixed_size = 0;      // GroupView::fixed_size
    uint8_t* slots[kGroup] = {};  // GroupView::slots (hash_int64_words)
    uint32_t generation = ~0u;    // GroupView::generation
  };

  // kVoid: the caller knows the namespace is void (the row loops are instantiated for both, so
  // the void case pays no namespace test per row).
  template <bool kVoid = false>
  size_t write_int_key(int64_t i, int32_t kg, uint8_t* dst) const {
    size_t p = 0;
    if (prefix_size_ == 2) dst[p++] = static_cast<uint8_t>(kg >> 8);
    dst[p++] = static_cast<uint8_t>(kg);
    if (int_width_ == 8) {
      const uint64_t be = be64(static_cast<uint64_t>(int_keys_->int64_at(i)));
      std::memcpy(dst + p, &be, 8);  // Flink LongSerializer: big-endian
      p += 8;
    } else {
      const uint32_t u = static_cast<uint32_t>(int_keys_->int32_at(i));
      dst[p] = static_cast<uint8_t>(u >> 24);  // Flink IntSerializer: big-endian
      dst[p + 1] = static_cast<uint8_t>(u >> 16);
      dst[p + 2] = static_cast<uint8_t>(u >> 8);
      dst[p + 3] = static_cast<uint8_t>(u);
      p += 4;
    }
    if (kVoid) {
      dst[p] = 0;  // VoidNamespace
      return p + 1;
    }
    return p + write_ns(i, dst + p);
  }

  // Upper bound of row i's encoded string/binary key: prefix, varint (<= 10 bytes), bytes,
  // namespace.
  size_t bytes_key_bound(int64_t i) const {
    size_t sz;
    bytes_keys_->bytes_at(i, &sz);
    return 2 + 10 + sz + ns_bound(i);
  }
  // Flink StringSerializer-style key bytes (key_codec append_ser_bytes) after the prefix; the
  // namespace is fixed-width or void here, so no lenbytes (both would have to be
  // variable-length).
  template <bool kVoid = false>
  size_t write_bytes_key(int64_t i, int32_t kg, uint8_t* dst) const {
    size_t sz;
    const uint8_t* src = bytes_keys_->bytes_at(i, &sz);
    size_t p = 0;
    if (prefix_size_ == 2) dst[p++] = static_cast<uint8_t>(kg >> 8);
    dst[p++] = static_cast<uint8_t>(kg);
    p += put_varlen(dst + p, static_cast<uint64_t>(sz) + 1);
    if (sz) std::memcpy(dst + p, src, sz);
    p += sz;
    if (kVoid) {
      dst[p] = 0;  // VoidNamespace
      return p + 1;
    }
    return p + write_ns(i, dst + p);
  }

  void hash_group(int64_t start, const Lanes* lanes) {
    if (ns_ == nullptr) hash_group_of<true>(start, lanes);
    else hash_group_of<false>(start, lanes);
  }

  template <bool kVoid>
  void hash_group_of(int64_t start, const Lanes* lanes) {
    if (start >= n_) return;
    Group& g = groups_[(static_cast<uint64_t>(start) / kGroup) & 1];
    g.start = start;
    g.offsets[0] = 0;
    if (kVoid && int64_words_ && start + kGroup <= n_) {
      if (prefix_size_ == 1) hash_int64_words<1>(g, start, lanes);
      else hash_int64_words<2>(g, start, lanes);
      return;
    }
    g.fixed_size = 0;
    const Lanes::View lv = lanes ? lanes->view() : Lanes::View{};
    bool all_flat = true;
    if (!int_in_one_) {  // int_in_one_: the constructor sized the buffer
      if (int_keys_ || bytes_keys_) {
        size_t bound = 0;
        for (int64_t j = start; j < std::min(start + kGroup, n_); ++j)
          bound += int_keys_ ? int_key_bound(j) : bytes_key_bound(j);
        if (g.bytes.size() < bound) g.bytes.resize(bound);
      } else {
        g.bytes.clear();
      }
    }
    for (int64_t j = start; j < start + kGroup; ++j) {
      const size_t k = static_cast<size_t>(j - start);
      if (j >= n_) {
        g.offsets[k + 1] = g.offsets[k];
        continue;
      }
      size_t ks;
      if (int_keys_) {
        ks = write_int_key<kVoid>(j, kgs_[j], g.bytes.data() + g.offsets[k]);
      } else if (bytes_keys_) {
        ks = write_bytes_key<kVoid>(j, kgs_[j], g.bytes.data() + g.offsets[k]);
      } else {
        encode_into(ahead_enc_, j, kgs_[j]);
        g.bytes.insert(g.bytes.end(), ahead_enc_.data(), ahead_enc_.data() + ahead_enc_.size());
        ks = ahead_enc_.size();
      }
      g.offsets[k + 1] = static_cast<uint32_t>(g.offsets[k] + ks);
    }
    // Hashed in a second pass: the hash's 8-byte loads of a key written just before by narrower
    // stores (prefix byte, varint, memcpy) could not be store-forwarded, a stall a row.
    const uint8_t* bytes = g.bytes.data();
    for (int64_t j = start; j < std::min(start + kGroup, n_); ++j) {
      const size_t k = static_cast<size_t>(j - start);
      const uint32_t h =
          detail::map_key_hash(hash_fn_, bytes + g.offsets[k], g.offsets[k + 1] - g.offsets[k]);
      g.hashes[k] = h;
      if (table_prefetch_ && !prefetch_row(lv, kgs_[j], h)) all_flat = false;
    }
    g.all_flat = all_flat;
  }

  // Prefetches the slot (flat engine) or bucket (chained) of hash h in key group kg's map; false
  // for a chained map, whose first entry ahead() prefetches too. Always inlined, as
  // StateMap::Impl::prefetch (GCC deletes an outlined prefetch as dead code).
  [[gnu::always_inline]] bool prefetch_slot(int32_t kg, uint32_t h) {
    StateMap& m = table_.map_unchecked(kg);
    const StateMap::Impl& e = m.engine();
    if (e.flat) {
      e.prefetch(h);
      return true;
    }
    m.prefetch_bucket(h);
    return false;
  }

  // prefetch_slot through the kernel's open lane when there is one.
  [[gnu::always_inline]] bool prefetch_row(const Lanes::View& lanes, int32_t kg, uint32_t h) {
    return lanes.prefetch(kg, h) || prefetch_slot(kg, h);
  }

  // A full group of int64 keys with the void namespace and the default map hash (the common
  // case): each key kg | be64(key) | 00 (10 bytes with a 1-byte prefix, 11 with a 2-byte one)
  // is two overlapping host-order words built in registers, stored as such and hashed from them
  // (short_key_hash_words), and the row loop tests neither the key kind nor the end of the batch
  // (the general loop re-read the bytes it had just written and tested both every row; its
  // 8-byte loads of bytes just written by narrower stores cannot be store-forwarded, a stall
  // every row). The hash is what map_key_hash(nullptr, key, size) computes
  // (short_key_hash: first and last 8 bytes).
  template <int kPrefix>
  void hash_int64_words(Group& g, int64_t start, const Lanes* lanes_in) {
    static_assert(kInt64WordKey == 10, "kg | be64(key) | 00");
    constexpr uint32_t kSize = kInt64WordKey + (kPrefix - 1);
    g.fixed_size = kSize;
    // Locals: the key byte stores below may alias the members, which would then be re-read
    // through `this` every row.
    const Lanes::View lanes = lanes_in ? lanes_in->view() : Lanes::View{};
    // ~0u: no lanes, so no slot is ever sound (a Lanes' generation starts at 0 and counts up).
    g.generation = lanes_in ? lanes_in->generation() : ~0u;
    const ArrayView keys = *int_keys_;
    const int32_t* kgs = kgs_;
    uint8_t* base = g.bytes.data();  // kGroup * kInt64KeyMax bytes (constructor)
    bool all_flat = true;
    for (size_t k = 0; k < static_cast<size_t>(kGroup); ++k) {
      const int64_t j = start + static_cast<int64_t>(k);
      const int32_t kg = kgs[j];
      // The key's big-endian bytes as a little-endian word (Flink LongSerializer).
      const uint64_t be = __builtin_bswap64(static_cast<uint64_t>(keys.int64_at(j)));
      // Bytes 0-7: the prefix (big-endian), then the key's first bytes; the last 8 bytes: the
      // key's bytes 1-7 and the VoidNamespace's 00.
      const uint64_t prefix = kPrefix == 1 ? static_cast<uint8_t>(kg)
                                           : (static_cast<uint64_t>(kg >> 8) & 0xff) |
                                                 (static_cast<uint64_t>(kg & 0xff) << 8);
      const uint64_t first = prefix | (be << (8 * kPrefix));
      const uint64_t last = be >> 8;
      uint8_t* dst = base + k * kSize;
      detail::store_u64(dst, first);
      detail::store_u64(dst + kSize - 8, last);
      const uint32_t h = detail::short_key_hash_words(first, last, kSize);
      g.hashes[k] = h;
      uint8_t* slot = nullptr;
      if (const detail::FlatLane* l = lanes.open_lane(kg)) {  // prefetch_row, keeping the slot
        slot = l->home_slot(h);
        l->prefetch_slot(slot);
      } else if (table_prefetch_ && !prefetch_slot(kg, h)) {
        all_flat = false;
      }
      g.slots[k] = slot;
    }
    g.all_flat = all_flat;
  }

  void encode_into(KeyEncoder& enc, int64_t i, int32_t kg) {
    enc.key_row(kg, i);
    if (ns_ == nullptr) {
      enc.namespace_void();
      return;
    }
    ns_buf_.clear();
    ns_->append_ser(ns_buf_, i);
    enc.namespace_serialized(ns_buf_.data(), ns_buf_.size());
  }

  static NamespaceType ns_type(const KeyArrays& keys) {
    return keys.namespaces() ? namespace_type_of(keys.namespaces()->schema()) : NamespaceType::Void;
  }

  KeyEncoder enc_;
  KeyEncoder ahead_enc_;
  const KeyArrays* ns_;                // the namespace column of namespaced keys, else nullptr
  const ArrayView* ns_col_ = nullptr;  // its column (write_ns)
  size_t ns_width_ = 0;                // 8 (int64), 4 (int32) or 0 (string/binary) namespaces
  bool int_in_one_ = false;      // int keys whose encoded form fits one_ (void/fixed namespace)
  bool bytes_void_ = false;      // string/binary keys, void namespace
  bool int64_words_ = false;     // int64 keys, void namespace, default hash (hash_int64_words)
  std::vector<uint8_t> ns_buf_;  // ser(namespace) of the row being encoded (encoder path)
  StateTable& table_;
  const int32_t* kgs_;
  int64_t n_;
  bool prefetch_;
  bool table_prefetch_ = true;  // skip_table_prefetch()
  int prefix_size_;
  KeyHashFunction hash_fn_;                // the table's maps' (they all have the StateTable's)
  const ArrayView* int_keys_ = nullptr;    // the key column when keys are scalar int64 or int32
  size_t int_width_ = 8;                   // its bytes: 8 (int64) or 4 (int32)
  const ArrayView* bytes_keys_ = nullptr;  // ... when they are scalar string/binary
  std::vector<uint8_t> one_bytes_;         // encode()'s buffer for a string/binary key
  uint8_t one_[kInt64KeyMax] = {};
  Group groups_[2];
  const uint8_t* cur_ = nullptr;
  size_t cur_size_ = 0;
  uint32_t cur_hash_ = 0;
  int64_t cur_row_ = -1;  // the row whose hash cur_hash_ is, or -1
};

// Row i's encoded key and its map hash, as a kernel's row loop sees it.
struct RowKey {
  const uint8_t* data;
  size_t size;
  uint32_t hash;
};

// A row lambda passed to for_rows: inlined into the row loop. Left to GCC, the add kernel's
// lambda becomes a call a row with its prologue and spills.
#define SC_INLINE_ROW __attribute__((always_inline))

// fn(i, kg, const RowKey&) for rows 0..n-1 in order, a group of RowKeys::kGroup rows at a time
// (ahead() once per group, through the kernel's lanes, the group's view in locals). fn may call
// rk.encode(i, kg) (a null row's read goes through rk) but not ahead(). A group of int64 keys
// with the void namespace has its own loop: the constant key size folds the lane's size test and
// the offsets' loads away.
//
// `hot` (optional; NoHotRows: none) takes the rows of such a group first: hot.run<kWord>(gv, g0,
// i, end) applies rows i, i+1, ... itself and returns the first it cannot (end: all), which fn
// then applies before hot resumes at the next. A kernel's hot rows are its common case in a
// function without calls (see FoldHotRows in batch.cpp); fn stays the one definition of a
// row, and hot must do exactly what fn would for the rows it takes.
struct NoHotRows {
  static constexpr bool kEnabled = false;
  template <uint32_t kWord>
  int64_t run(const RowKeys::GroupView&, int64_t, int64_t i, int64_t) const {
    return i;
  }
};

template <uint32_t kWord, class Fn, class Hot>
[[gnu::always_inline]] inline void for_word_rows(const RowKeys::GroupView& gv, const int32_t* kgs,
                                                 int64_t g0, int64_t end, Fn& fn, const Hot& hot) {
  for (int64_t i = g0; i < end; ++i) {
    if constexpr (Hot::kEnabled) {
      i = hot.template run<kWord>(gv, g0, i, end);
      if (i == end) break;
    }
    const size_t j = static_cast<size_t>(i - g0);
    fn(i, kgs[i], RowKey{gv.bytes + j * kWord, kWord, gv.hashes[j]});
  }
}

template <class Fn, class Hot = NoHotRows>
[[gnu::always_inline]] inline void for_rows(RowKeys& rk, StateTable& table, Lanes& lanes,
                                            const int32_t* kgs, int64_t n, Fn&& fn,
                                            const Hot& hot = Hot{}) {
  constexpr uint32_t kWord = RowKeys::kInt64WordKey;
  for (int64_t g0 = 0; g0 < n; g0 += RowKeys::kGroup) {
    rk.ahead(g0, &lanes);
    const RowKeys::GroupView gv = rk.group(g0);
    const int64_t end = std::min(n, g0 + RowKeys::kGroup);
    if (gv.valid && gv.fixed_size == kWord) {
      for_word_rows<kWord>(gv, kgs, g0, end, fn, hot);
      continue;
    }
    if (gv.valid && gv.fixed_size == kWord + 1) {  // a 2-byte key-group prefix
      for_word_rows<kWord + 1>(gv, kgs, g0, end, fn, hot);
      continue;
    }
    for (int64_t i = g0; i < end; ++i) {
      const int32_t kg = kgs[i];
      if (gv.valid) {
        const size_t j = static_cast<size_t>(i - g0);
        const uint32_t off = gv.offsets[j];
        fn(i, kg, RowKey{gv.bytes + off, gv.offsets[j + 1] - off, gv.hashes[j]});
      } else {
        rk.encode(i, kg);
        fn(i, kg, RowKey{rk.data(), rk.size(), rk.hash(i, table.map_unchecked(kg))});
      }
    }
  }
}

// get_hashed() with the flat engine's common case inlined (StateMap::Impl::flat_fast_get).
inline bool kernel_get(StateMap& m, uint32_t h, const uint8_t* key, size_t ks, ByteView* v) {
  const int r = m.engine().flat_fast_get(h, key, ks, v);
  return r >= 0 ? r == 1 : m.get_hashed(h, key, ks, v);
}

// The entry keys `prefix | suffix` of the rows a group ahead, for the kernels whose rows look up
// an entry other than their encoded key (docs/formats.md "List state", "Map state"): a list
// row's chunk 0 `prefix | seq 0` (the only chunk of a list of up to 32 elements), a map row's
// entry `prefix | ser(user key)`. Such a kernel's RowKeys skips the table prefetch of the bare
// prefix, which no entry has (RowKeys::skip_table_prefetch). In two stages, as RowKeys does for
// chained maps but with half a group between them so each request has time to land:
//  - ahead(i) at a group's start i builds the keys of the group after i's (from the prefixes
//    RowKeys encoded for it; suffix(j, out) appends row j's suffix), hashes them and prefetches
//    their slots (flat maps) or buckets (chained), and, given a collection index, each prefix's
//    slot there;
//  - ahead(i) half a group later prefetches that next group's first chained entries (whose
//    buckets have arrived by then) and the index's collections (CollectionIndex::prefetch);
//  - ahead(i) at that group's own start prefetches the second entry of each chain whose first
//    (now in cache) has another hash: a chained table at load 3/8-3/4 puts a fifth of the keys
//    behind another, and each such row otherwise stalls on the chain walk.
// get(i) then gives row i's key, its map hash and (with an index) its prefix's index hash.
// Without RowKeys' groups (a small state of string keys) nothing is ahead and get() is false.
// Hashes depend on the bytes only, so a row applied in between (a rehash, a TTL cleanup step)
// at most makes a prefetch useless.
template <class Suffix>
class EntryKeysAhead {
 public:
  EntryKeysAhead(const RowKeys& rk, StateTable& table, const int32_t* kgs, int64_t n,
                 Suffix suffix = Suffix(), const CollectionIndex* index = nullptr)
      : rk_(rk),
        table_(table),
        kgs_(kgs),
        n_(n),
        suffix_(std::move(suffix)),
        index_(index),
        hash_fn_(table.map_unchecked(table.kg_start()).engine().hash_fn),
        // The index hashes prefixes as the maps do when it shares their hash function: then the
        // prefix hash RowKeys computed is the index's too.
        shared_hash_(index != nullptr && index->hash_function() == hash_fn_) {}

  void ahead(int64_t i) {
    const uint64_t r = static_cast<uint64_t>(i) % RowKeys::kGroup;
    if (r == 0) {
      if (i == 0) {
        fill(0);
        settle(0);
      }
      chase(i);
      fill(i + RowKeys::kGroup);
    } else if (r == RowKeys::kGroup / 2) {
      settle(i + RowKeys::kGroup / 2);
    }
  }

  // Row i's entry key (valid until the next ahead() that builds a group), its map hash and
  // (with an index) its prefix's hash under the index into *prefix_hash, when built ahead.
  bool get(int64_t i, RowKey* key, uint32_t* prefix_hash = nullptr) const {
    const uint64_t u = static_cast<uint64_t>(i);
    const Slot& s = slots_[(u / RowKeys::kGroup) & 1];
    if (s.start != static_cast<int64_t>(u - u % RowKeys::kGroup)) return false;
    const size_t j = static_cast<size_t>(u % RowKeys::kGroup);
    *key = RowKey{s.bytes.data() + s.offsets[j], s.offsets[j + 1] - s.offsets[j], s.hashes[j]};
    if (prefix_hash != nullptr) *prefix_hash = s.prefix_hashes[j];
    return true;
  }

 private:
  struct Slot {
    int64_t start = -1;
    bool all_flat = true;  // every row's map is flat: no chained entry to prefetch in settle()
    std::vector<uint8_t> bytes;
    uint32_t offsets[RowKeys::kGroup + 1] = {};
    uint32_t hashes[RowKeys::kGroup] = {};
    uint32_t prefix_hashes[RowKeys::kGroup] = {};
  };

  void fill(int64_t start) {
    Slot& s = slots_[(static_cast<uint64_t>(start) / RowKeys::kGroup) & 1];
    s.start = -1;
    if (start >= n_) return;
    const RowKeys::GroupView g = rk_.group(start);
    if (!g.valid) return;
    const int64_t end = std::min(start + RowKeys::kGroup, n_);
    s.bytes.clear();
    for (int64_t j = start; j < end; ++j) {
      const size_t r = static_cast<size_t>(j - start);
      const uint8_t* k = g.fixed_size ? g.bytes + r * g.fixed_size : g.bytes + g.offsets[r];
      const size_t ks = g.fixed_size ? g.fixed_size : g.offsets[r + 1] - g.offsets[r];
      s.bytes.insert(s.bytes.end(), k, k + ks);
      suffix_(j, s.bytes);
      s.offsets[r + 1] = static_cast<uint32_t>(s.bytes.size());
      if (index_ != nullptr) s.prefix_hashes[r] = shared_hash_ ? g.hashes[r] : index_->hash(k, ks);
    }
    // Hashed in a second pass, once the bytes are written (see RowKeys::hash_group_of).
    bool all_flat = true;
    for (int64_t j = start; j < end; ++j) {
      const size_t r = static_cast<size_t>(j - start);
      const uint32_t h = detail::map_key_hash(hash_fn_, s.bytes.data() + s.offsets[r],
                                              s.offsets[r + 1] - s.offsets[r]);
      s.hashes[r] = h;
      StateMap& m = table_.map_unchecked(kgs_[j]);
      const StateMap::Impl& e = m.engine();
      if (e.flat) {
        e.prefetch(h);
      } else {
        m.prefetch_bucket(h);
        all_flat = false;
      }
      if (index_ != nullptr) index_->prefetch(kgs_[j], s.prefix_hashes[r]);
    }
    s.all_flat = all_flat;
    s.start = start;
  }

  // settle() and chase() always inlined: their only effects are prefetches, and GCC deletes a
  // call to an outlined function of that kind (StateMap::Impl::prefetch).
  [[gnu::always_inline]] void settle(int64_t start) {
    const Slot& s = slots_[(static_cast<uint64_t>(start) / RowKeys::kGroup) & 1];
    if (s.start != start || (s.all_flat && index_ == nullptr)) return;
    const int64_t end = std::min(start + RowKeys::kGroup, n_);
    for (int64_t j = start; j < end; ++j) {
      const size_t r = static_cast<size_t>(j - start);
      if (!s.all_flat) table_.map_unchecked(kgs_[j]).prefetch_entry(s.hashes[r]);
      if (index_ != nullptr) index_->prefetch_collection(kgs_[j], s.prefix_hashes[r]);
    }
  }

  [[gnu::always_inline]] void chase(int64_t start) {
    const Slot& s = slots_[(static_cast<uint64_t>(start) / RowKeys::kGroup) & 1];
    if (s.start != start || s.all_flat) return;
    const int64_t end = std::min(start + RowKeys::kGroup, n_);
    for (int64_t j = start; j < end; ++j) {
      const StateMap::Impl& e = table_.map_unchecked(kgs_[j]).engine();
      if (e.flat) continue;
      const uint32_t h = s.hashes[static_cast<size_t>(j - start)];
      // The bucket as table_for() picks it, read-only (StateMap::prefetch_entry's reads).
      const detail::Directory* d = e.primary;
      size_t b = h & (d->capacity - 1);
      if (e.rehash_table != nullptr && b < e.rehash_index) {
        d = e.rehash_table;
        b = h & (d->capacity - 1);
      }
      const detail::Entry* first = d->head(b);
      if (first == nullptr || first->hash == h || first->next == nullptr) continue;
      __builtin_prefetch(first->next, 1, 3);
      __builtin_prefetch(reinterpret_cast<const char*>(first->next) + 64, 1, 3);
    }
  }

  const RowKeys& rk_;
  StateTable& table_;
  const int32_t* kgs_;
  int64_t n_;
  Suffix suffix_;
  const CollectionIndex* index_;
  KeyHashFunction hash_fn_;
  bool shared_hash_;
  Slot slots_[2];
};

// A list row's chunk 0 suffix: sequence number 0, big-endian (list_index.h store_list_seq).
struct ChunkZeroSuffix {
  void operator()(int64_t, std::vector<uint8_t>& out) const { out.resize(out.size() + 8, 0); }
};
using ListChunkAhead = EntryKeysAhead<ChunkZeroSuffix>;

// put() of a row's key in key group kg through its lane, else upsert() (which also completes a
// rehash in flight); an existing value of another size is replaced by put().
inline uint8_t* kernel_put(StateTable& table, Lanes& lanes, int32_t kg, const RowKey& k,
                           size_t vs) {
  bool inserted = false;
  if (detail::FlatLane* ln = lanes.get(kg, k.data, k.size, vs, true)) {
    if (uint8_t* p = ln->upsert(k.hash, k.data, k.size, &inserted)) return p;
  }
  lanes.close(kg);
  StateMap& m = table.map_unchecked(kg);
  size_t cur = 0;
  uint8_t* p = m.upsert(k.hash, k.data, k.size, vs, &cur, &inserted);
  return cur == vs ? p : m.put(k.data, k.size, vs);
}

inline void check_values(const ValueSpec& vt, const KeyArrays& keys, const ArrayView& values) {
  if (!value_format_ok(vt, values))
    fail("values: expected an Arrow array of value type " + value_type_name(vt) + ", got " +
         arrow_type_name(values));
  if (values.length() != keys.length())
    fail("values: length " + std::to_string(values.length()) + " differs from keys length " +
         std::to_string(keys.length()));
}

// One TTL read of row i (Python `_Ttl._fresh`): absent -> false; expired -> the entry is removed
// and counted, and the stale user bytes are shown (emit) only under return_expired; fresh -> shown,
// and renewed to `now` under update_on_read. `width` is the exact stored width, or 0 for
// variable-width values (then at least the timestamp). emit(user bytes, size) runs before any
// mutation, since a removal or a copy-on-write invalidates the bytes read. Returns whether a value
// was shown.
template <class Emit>
inline bool ttl_read(StateMap& m, const RowKeys& rk, int64_t i, size_t width,
                     const TtlBatchSpec& ttl, int64_t* expired, Emit emit) {
  ByteView v;
  if (!kernel_get(m, rk.hash(i, m), rk.data(), rk.size(), &v)) return false;
  if (width != 0 && v.size != width) wrong_width(i, v.size, width);
  if (v.size < ttl::kTimestampBytes)
    fail(row_str(i) + ": the stored value holds " + std::to_string(v.size) +
         " bytes, too few for the 8-byte TTL timestamp (was the state written without TTL?)");
  const size_t user = v.size - ttl::kTimestampBytes;
  if (ttl::expired(ttl::load_timestamp(v.data + user), ttl.ttl_ms, ttl.now)) {
    if (ttl.return_expired) emit(v.data, user);
    m.remove(rk.data(), rk.size());
    ++*expired;
    return ttl.return_expired;
  }
  emit(v.data, user);
  if (ttl.update_on_read) {
    // Always written, even when the timestamp already equals `now`: the per-record path puts
    // too, so the entry counts as changed for incremental snapshots on both paths.
    size_t sz = 0;
    uint8_t* p = m.get_for_update(rk.data(), rk.size(), &sz);
    ttl::store_timestamp(p + user, ttl.now);
  }
  return true;
}
// The incremental cleanup hook (ttl.h IncrementalCleanup) of a kernel row with lanes: the maps a
// step wrote outside the lanes get their lanes closed, as after any other call on them.
inline void cleanup_row(ttl::IncrementalCleanup& c, Lanes& lanes) {
  if (ttl::cleanup_row(c))
    for (int32_t kg = c.first_written_kg; kg <= c.last_written_kg; ++kg) lanes.close(kg);
}

// ---- shared by the collection kernels (batch_collections.cpp, batch_reads.cpp)

// A per-thread buffer for a blob's bytes while the map rewrites it (one allocation per thread
// and growth).
inline std::vector<uint8_t>& blob_scratch() {
  thread_local std::vector<uint8_t> buf;
  return buf;
}

// The user keys of a map kernel as KeyArrays of the user-key type (one column, no struct).
inline KeyArrays make_user_keys(const KeySchema& schema, ArrowInput in) {
  if (schema.is_struct || schema.columns.size() != 1)
    fail("user_keys: a map user key is one column");
  try {
    KeyArrays k(schema, in.schema, in.array);
    std::string why;
    check_data_row(k.check_data(&why), "user_keys", why);
    return k;
  } catch (const BatchError&) {
    throw;
  } catch (const std::invalid_argument& e) {
    fail(std::string("user_keys: ") + e.what());
  }
}

[[noreturn]] inline void bad_blob(int64_t row) {
  fail(row_str(row) +
       ": the stored list/map blob does not parse (the table holds another "
       "state kind or value layout than declared)");
}

// Reads a varlen at blob[*pos, end); advances *pos. bad_blob(row) when truncated.
inline uint64_t blob_varlen(const uint8_t* blob, size_t end, size_t* pos, int64_t row) {
  if (*pos < end && blob[*pos] < 0x80) {
    // One-byte varlen (every length < 128): inline, without read_varlen's call and loop
    // (map_get_batch reads one per pair it scans).
    const uint64_t one = blob[*pos];
    if (one > end - *pos - 1) bad_blob(row);
    ++*pos;
    return one;
  }
  uint64_t v = 0;
  const size_t used = read_varlen(blob + *pos, end - *pos, &v);
  if (used == 0 || v > end - *pos - used) bad_blob(row);
  *pos += used;
  return v;
}

// ser(uk) order: bytes compared, a proper prefix first (Python's bytes order).
inline int compare_bytes(const uint8_t* a, size_t as, const uint8_t* b, size_t bs) {
  if (as == 8 && bs == 8) {  // int64-like user keys: one big-endian word compare, no memcmp call
    uint64_t x, y;
    std::memcpy(&x, a, 8);
    std::memcpy(&y, b, 8);
    x = be64(x);
    y = be64(y);
    return x < y ? -1 : x > y ? 1 : 0;
  }
  const int c = std::memcmp(a, b, std::min(as, bs));
  if (c != 0) return c;
  return as < bs ? -1 : as > bs ? 1 : 0;
}

}  // namespace batch_detail
}  // namespace statecore
