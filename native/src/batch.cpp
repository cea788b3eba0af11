// Batch kernels over one StateTable (see batch.h for the contract). Every kernel runs in two
// passes: a validation pass that touches no state (Arrow structure, formats, lengths, null keys,
// key groups — computed once and kept in a per-thread scratch vector) and an apply pass that
// encodes each row's key into one reused buffer and reads/writes the row's key-group map.
#include "statecore/batch.h"

#include "statecore/detail/map_impl.h"

#include <algorithm>

#include <cstring>
#include <string>
#include <type_traits>

#include "statecore/hash.h"
#include "statecore/key_codec.h"
#include "statecore/key_columns.h"
#include "statecore/ttl.h"

namespace statecore {
namespace {

[[noreturn]] void fail(const std::string& msg) { throw BatchError(msg); }

std::string row_str(int64_t row) { return "row " + std::to_string(row); }

// "ms" for the unit letter 'm' (ArrayView::time_unit), and so on.
std::string unit_name(char unit) {
  switch (unit) {
    case 's': return "s";
    case 'm': return "ms";
    case 'u': return "us";
    case 'n': return "ns";
  }
  return "?";
}

// The statecore name of a value type: "timestamp[ms]", "fixed_size_binary[16]", "int64", ...
std::string value_type_name(const ValueSpec& t) {
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
std::string arrow_type_name(const ArrayView& v) {
  if (v.kind() == ArrowKind::Timestamp) return "timestamp[" + unit_name(v.time_unit()) + "]";
  if (v.kind() == ArrowKind::FixedSizeBinary)
    return "fixed_size_binary[" + std::to_string(v.byte_width()) + "]";
  return arrow_kind_name(v.kind());
}

bool value_format_ok(const ValueSpec& t, const ArrayView& v) {
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
void check_spec(const ValueSpec& t) {
  if (t.type == ValueType::Timestamp && unit_name(t.unit) == "?")
    fail(std::string("value type timestamp: unit '") + t.unit + "' is not one of s, m, u, n");
  if (t.type == ValueType::FixedSizeBinary && t.width < 1)
    fail("value type fixed_size_binary: width " + std::to_string(t.width) + " must be >= 1");
}

bool is_fixed(const ValueSpec& t) { return value_width(t) != 0; }

KeyArrays make_keys(const BatchKeySpec& spec, ArrowInput in) {
  try {
    KeyArrays k(spec.key, in.schema, in.array);
    const int64_t bad = k.check_offsets();
    if (bad >= 0) fail("keys: invalid variable-width offsets at " + row_str(bad));
    return k;
  } catch (const BatchError&) {
    throw;
  } catch (const std::invalid_argument& e) {
    fail(std::string("keys: ") + e.what());
  }
}

ArrayView make_view(ArrowInput in, const char* role) {
  try {
    ArrayView v(in.schema, in.array);
    const int64_t bad = v.check_offsets();
    if (bad >= 0)
      fail(std::string(role) + ": invalid variable-width offsets at " + row_str(bad));
    return v;
  } catch (const BatchError&) {
    throw;
  } catch (const std::invalid_argument& e) {
    fail(std::string(role) + ": " + e.what());
  }
}

// Stored fixed-width values are little-endian regardless of the host (docs/architecture.md).
// memcpy + a byte swap on big-endian hosts: GCC did not merge the byte-by-byte loops into one
// load/store (8 stores a row in the add kernel's output, callgrind).
inline uint64_t le64(uint64_t v) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  return __builtin_bswap64(v);
#else
  return v;
#endif
}
inline uint32_t le32(uint32_t v) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  return __builtin_bswap32(v);
#else
  return v;
#endif
}
inline uint64_t be64(uint64_t v) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  return v;
#else
  return __builtin_bswap64(v);
#endif
}
inline uint64_t load_le64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return le64(v);
}
inline void store_le64(uint8_t* p, uint64_t v) {
  v = le64(v);
  std::memcpy(p, &v, 8);
}
inline int64_t load_i64(const uint8_t* p) { return static_cast<int64_t>(load_le64(p)); }
inline uint64_t load_u64(const uint8_t* p) { return load_le64(p); }
inline double load_f64(const uint8_t* p) {
  const uint64_t u = load_le64(p);
  double d;
  std::memcpy(&d, &u, 8);
  return d;
}
inline void store_i64(uint8_t* p, int64_t v) { store_le64(p, static_cast<uint64_t>(v)); }
inline int32_t load_i32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return static_cast<int32_t>(le32(v));
}
inline void store_i32(uint8_t* p, int32_t v) {
  const uint32_t u = le32(static_cast<uint32_t>(v));
  std::memcpy(p, &u, 4);
}
// The reference deserializer reads any nonzero byte as true; writes are always 00/01.
inline bool load_bool(const uint8_t* p) { return *p != 0; }
inline void store_bool(uint8_t* p, bool v) { *p = v ? 1 : 0; }
inline void store_f64(uint8_t* p, double d) {
  uint64_t u;
  std::memcpy(&u, &d, 8);
  store_le64(p, u);
}

[[noreturn]] void wrong_width(int64_t row, size_t got, size_t want) {
  fail(row_str(row) + ": the stored value holds " + std::to_string(got) + " bytes, expected " +
       std::to_string(want) + " (the table holds values of another type than declared, or "
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

void check_ttl(const TtlBatchSpec& ttl) {
  if (ttl.enabled && ttl.ttl_ms <= 0)
    fail("ttl: ttl_ms must be > 0, got " + std::to_string(ttl.ttl_ms));
}

// Callers may pass no counter; the kernels always count somewhere.
int64_t* expired_sink(int64_t* expired, int64_t* local) {
  int64_t* p = expired != nullptr ? expired : local;
  *p = 0;
  return p;
}

// Per-thread key-group scratch: one allocation per thread and growth, not per batch or row.
std::vector<int32_t>& kg_scratch() {
  thread_local std::vector<int32_t> kgs;
  return kgs;
}

// Validation pass over the keys: spec, table range, nulls, key groups (formats were checked by
// make_keys). Returns the key group of every row (kg_scratch()). Touches no state.
const int32_t* validate_keys(StateTable& table, const BatchKeySpec& spec, const KeyArrays& keys) {
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
  const int64_t n = keys.length();
  std::vector<int32_t>& kgs = kg_scratch();
  kgs.resize(static_cast<size_t>(n));
  try {
    keys.key_groups(spec.assigner, spec.max_parallelism, kgs.data());
  } catch (const std::invalid_argument& e) {
    fail(std::string("keys: ") + e.what());
  }
  for (int64_t i = 0; i < n; ++i) {
    if (kgs[i] < spec.kg_start || kgs[i] > spec.kg_end)
      fail("keys: " + row_str(i) + " belongs to key group " + std::to_string(kgs[i]) +
           ", outside this table's key-group range [" + std::to_string(spec.kg_start) + ", " +
           std::to_string(spec.kg_end) + "] (was the batch routed by the same assigner and "
           "max parallelism?)");
  }
  return kgs.data();
}

// Encodes row i's key as prefix | ser(key) | 00 (VoidNamespace) into the reused buffer, and keeps
// the cache ahead of the rows being applied: the working set of a large state does not fit in
// L2, and every row would otherwise pay two dependent cache misses (bucket slot, then entry).
// ahead(i), called before row i in a forward pass, hashes the group of rows two groups ahead and
// prefetches their bucket slots, and prefetches the first entry of the rows one group ahead
// (whose slots were requested a group earlier). Rows are still applied one by one in row order;
// a prefetch made stale by a rehash or a write in between only wastes a cache line.
class RowKeys {
 public:
  RowKeys(const BatchKeySpec& spec, const KeyArrays& keys, StateTable& table, const int32_t* kgs)
      : enc_(spec.key, NamespaceType::Void, spec.max_parallelism),
        ahead_enc_(spec.key, NamespaceType::Void, spec.max_parallelism),
        keys_(keys), table_(table), kgs_(kgs), n_(keys.length()),
        // A small state stays in cache; there the second hash per row only costs (measured:
        // 1k keys 11.6 -> 7.2 M rows/s with prefetching, 200k keys 1.95 -> 4.7 M rows/s).
        prefetch_(table.size() >= kPrefetchMinEntries),
        prefix_size_(key_group_prefix_size(spec.max_parallelism)) {
    enc_.bind(keys);
    ahead_enc_.bind(keys);
    // int64 keys (the common case) skip the general encoder: prefix | big-endian int64 | 00 is
    // written in place (the general encoder took ~390 instructions a row for it, callgrind).
    const ArrayView* col = keys.scalar_column();
    if (col && spec.key.columns[0].type == KeyType::Int64) int64_keys_ = col;
    // String/binary keys likewise: prefix | varlen(len + 1) | bytes | 00 (the general encoder
    // with its checks and vector appends was ~300 instructions a row, callgrind).
    if (col && (spec.key.columns[0].type == KeyType::String ||
                spec.key.columns[0].type == KeyType::Binary))
      bytes_keys_ = col;
  }

  // Row i's encoded key becomes data()/size(): the copy made when its group was hashed ahead,
  // or (small states, or a row outside the two groups kept, as an undo replay asks for) encoded
  // now. Each row is encoded once on the prefetching path.
  void encode(int64_t i, int32_t kg) {
    if (prefetch_) {
      const Group& g = groups_[(i / kGroup) & 1];
      if (g.start == i - i % kGroup) {
        const size_t j = static_cast<size_t>(i - g.start);
        cur_ = g.bytes.data() + g.offsets[j];
        cur_size_ = g.offsets[j + 1] - g.offsets[j];
        cur_hash_ = g.hashes[j];
        cur_row_ = i;
        return;
      }
    }
    cur_row_ = -1;
    if (int64_keys_) {
      cur_size_ = write_int64_key(i, kg, one_);
      cur_ = one_;
      return;
    }
    if (bytes_keys_) {
      one_bytes_.resize(bytes_key_bound(i));
      cur_size_ = write_bytes_key(i, kg, one_bytes_.data());
      cur_ = one_bytes_.data();
      return;
    }
    encode_into(enc_, i, kg);
    cur_ = enc_.data();
    cur_size_ = enc_.size();
  }

  void ahead(int64_t i) {
    if (!prefetch_ || i % kGroup != 0) return;
    if (i == 0) hash_group(0);
    const Group& g = groups_[(i / kGroup) & 1];
    for (int64_t j = i; j < std::min(i + kGroup, n_); ++j) {
      StateMap& m = table_.map_unchecked(kgs_[j]);
      if (!m.engine().flat) m.prefetch_entry(g.hashes[j - i]);  // a flat slot is its entry
    }
    hash_group(i + kGroup);
  }

  const uint8_t* data() const { return cur_; }
  size_t size() const { return cur_size_; }
  // The map hash of row i's encoded key (encode(i) done): computed ahead when prefetching.
  uint32_t hash(int64_t i, const StateMap& m) const {
    return cur_row_ == i ? cur_hash_ : m.hash(data(), size());
  }

 private:
  static constexpr int64_t kGroup = 16;
  // ~32 B header + key + value per entry: from about 16k entries on the state outgrows L2.
  static constexpr size_t kPrefetchMinEntries = 16 * 1024;
  static constexpr size_t kInt64KeyMax = 2 + 8 + 1;

  // The encoded keys and hashes of rows [start, start + kGroup).
  struct Group {
    int64_t start = -1;
    std::vector<uint8_t> bytes;
    uint32_t offsets[kGroup + 1] = {};
    uint32_t hashes[kGroup] = {};
  };

  size_t write_int64_key(int64_t i, int32_t kg, uint8_t* dst) const {
    size_t p = 0;
    if (prefix_size_ == 2) dst[p++] = static_cast<uint8_t>(kg >> 8);
    dst[p++] = static_cast<uint8_t>(kg);
    const uint64_t be = be64(static_cast<uint64_t>(int64_keys_->int64_at(i)));
    std::memcpy(dst + p, &be, 8);  // Flink LongSerializer: big-endian
    p += 8;
    dst[p++] = 0;  // VoidNamespace
    return p;
  }

  // Upper bound of row i's encoded string/binary key: prefix, varint (<= 10 bytes), bytes, 00.
  size_t bytes_key_bound(int64_t i) const {
    size_t sz;
    bytes_keys_->bytes_at(i, &sz);
    return 2 + 10 + sz + 1;
  }
  // Flink StringSerializer-style key bytes (key_codec append_ser_bytes) after the prefix; the
  // namespace is VoidNamespace, so no lenbytes (both would have to be variable-length).
  size_t write_bytes_key(int64_t i, int32_t kg, uint8_t* dst) const {
    size_t sz;
    const uint8_t* src = bytes_keys_->bytes_at(i, &sz);
    size_t p = 0;
    if (prefix_size_ == 2) dst[p++] = static_cast<uint8_t>(kg >> 8);
    dst[p++] = static_cast<uint8_t>(kg);
    uint64_t n = static_cast<uint64_t>(sz) + 1;
    while (n >= 0x80) {
      dst[p++] = static_cast<uint8_t>(n | 0x80);
      n >>= 7;
    }
    dst[p++] = static_cast<uint8_t>(n);
    if (sz) std::memcpy(dst + p, src, sz);
    p += sz;
    dst[p++] = 0;  // VoidNamespace
    return p;
  }

  void hash_group(int64_t start) {
    if (start >= n_) return;
    Group& g = groups_[(start / kGroup) & 1];
    g.start = start;
    g.offsets[0] = 0;
    if (int64_keys_) {
      g.bytes.resize(kGroup * kInt64KeyMax);
    } else if (bytes_keys_) {
      size_t bound = 0;
      for (int64_t j = start; j < std::min(start + kGroup, n_); ++j) bound += bytes_key_bound(j);
      if (g.bytes.size() < bound) g.bytes.resize(bound);
    } else {
      g.bytes.clear();
    }
    for (int64_t j = start; j < start + kGroup; ++j) {
      const size_t k = static_cast<size_t>(j - start);
      if (j >= n_) {
        g.offsets[k + 1] = g.offsets[k];
        continue;
      }
      const uint8_t* key;
      size_t ks;
      if (int64_keys_) {
        key = g.bytes.data() + g.offsets[k];
        ks = write_int64_key(j, kgs_[j], g.bytes.data() + g.offsets[k]);
      } else if (bytes_keys_) {
        key = g.bytes.data() + g.offsets[k];
        ks = write_bytes_key(j, kgs_[j], g.bytes.data() + g.offsets[k]);
      } else {
        encode_into(ahead_enc_, j, kgs_[j]);
        g.bytes.insert(g.bytes.end(), ahead_enc_.data(), ahead_enc_.data() + ahead_enc_.size());
        ks = ahead_enc_.size();
        key = g.bytes.data() + g.offsets[k];
      }
      g.offsets[k + 1] = static_cast<uint32_t>(g.offsets[k] + ks);
      StateMap& m = table_.map_unchecked(kgs_[j]);
      const StateMap::Impl& e = m.engine();
      const uint32_t h = e.hash_of(key, ks);
      g.hashes[k] = h;
      if (e.flat) e.prefetch(h);
      else m.prefetch_bucket(h);
    }
  }

  void encode_into(KeyEncoder& enc, int64_t i, int32_t kg) {
    enc.key_row(kg, i);
    enc.namespace_void();
  }

  KeyEncoder enc_;
  KeyEncoder ahead_enc_;
  const KeyArrays& keys_;
  StateTable& table_;
  const int32_t* kgs_;
  int64_t n_;
  bool prefetch_;
  int prefix_size_;
  const ArrayView* int64_keys_ = nullptr;  // the key column when keys are scalar int64
  const ArrayView* bytes_keys_ = nullptr;  // ... when they are scalar string/binary
  std::vector<uint8_t> one_bytes_;          // encode()'s buffer for a string/binary key
  uint8_t one_[kInt64KeyMax] = {};
  Group groups_[2];
  const uint8_t* cur_ = nullptr;
  size_t cur_size_ = 0;
  uint32_t cur_hash_ = 0;
  int64_t cur_row_ = -1;  // the row whose hash cur_hash_ is, or -1
};

// get_hashed() with the flat engine's common case inlined (StateMap::Impl::flat_fast_get).
inline bool kernel_get(StateMap& m, uint32_t h, const uint8_t* key, size_t ks, ByteView* v) {
  const int r = m.engine().flat_fast_get(h, key, ks, v);
  return r >= 0 ? r == 1 : m.get_hashed(h, key, ks, v);
}

// put() through the hashed, inlined path of the add kernels (flat_fast_upsert, else upsert(),
// which also completes a rehash in flight); an existing value of another size is replaced by put().
inline uint8_t* kernel_put(StateMap& m, uint32_t h, const uint8_t* key, size_t ks, size_t vs) {
  size_t cur = 0;
  bool inserted = false;
  uint8_t* p = m.engine().flat_fast_upsert(h, key, ks, vs, &cur, &inserted);
  if (p == nullptr) p = m.upsert(h, key, ks, vs, &cur, &inserted);
  return cur == vs ? p : m.put(key, ks, vs);
}

void check_values(const ValueSpec& vt, const KeyArrays& keys, const ArrayView& values) {
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
bool ttl_read(StateMap& m, const RowKeys& rk, int64_t i, size_t width, const TtlBatchSpec& ttl,
              int64_t* expired, Emit emit) {
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

template <class T>
inline T load_fixed(const uint8_t* p) {
  if constexpr (std::is_same<T, double>::value) return load_f64(p);
  else if constexpr (std::is_same<T, int32_t>::value) return load_i32(p);
  else if constexpr (std::is_same<T, bool>::value) return load_bool(p);
  else if constexpr (std::is_same<T, uint64_t>::value) return load_u64(p);
  else return load_i64(p);
}
template <class T>
inline void store_fixed(uint8_t* p, T v) {
  if constexpr (std::is_same<T, double>::value) store_f64(p, v);
  else if constexpr (std::is_same<T, int32_t>::value) store_i32(p, v);
  else if constexpr (std::is_same<T, bool>::value) store_bool(p, v);
  else if constexpr (std::is_same<T, uint64_t>::value) store_le64(p, v);
  else store_i64(p, v);
}
// The name of an integer accumulator type, for the Sum overflow message.
template <class T>
constexpr const char* int_type_name() {
  return std::is_same<T, int32_t>::value ? "int32"
         : std::is_same<T, uint64_t>::value ? "uint64" : "int64";
}

// A null value row leaves the aggregate unchanged and outputs it (null if none); with TTL it is a
// TTL read (ttl_read: may remove, show stale once, renew).
template <class T>
void emit_current(StateMap& m, const RowKeys& rk, int64_t i, T* out, uint8_t* valid,
                  const TtlBatchSpec& ttl, int64_t* expired) {
  out[i] = T{};
  if (ttl.enabled) {
    valid[i] = ttl_read(m, rk, i, fixed_width<T>(ttl), ttl, expired,
                        [&](const uint8_t* p, size_t) { out[i] = load_fixed<T>(p); })
                   ? 1 : 0;
    return;
  }
  ByteView v;
  if (kernel_get(m, rk.hash(i, m), rk.data(), rk.size(), &v)) {
    if (v.size != stored_width<T>()) wrong_width(i, v.size, stored_width<T>());
    out[i] = load_fixed<T>(v.data);
    valid[i] = 1;
  } else {
    valid[i] = 0;
  }
}

// add_batch apply pass for accumulator type T. `value_at(i)` gives row i's (non-null) input;
// `combine(acc, x, &result)` folds one value and returns false when the result does not fit T.
// With TTL an expired aggregate is replaced by x (counted in *expired) and every write is
// stamped ttl.now; null rows are TTL reads (emit_current).
//
// kUndo (the int64 Sum, whose overflow the reference backend rejects): a failed combine must
// leave the aggregates exactly as before the batch, and overflow can only be known while
// applying, so every write is recorded in an undo log (row, whether the key existed, its old value
// and timestamp: 32 bytes a row, reused per thread) and replayed backwards before the error is
// raised. Rows are applied in order, so undoing them in reverse restores every entry, keys
// repeated in the batch included. What null rows did (TTL removals and renewals) is not in the log
// and stays, as in the Python path (see batch.h "TTL"): undoing a later write on the same key
// restores the bytes as that null row left them. Without kUndo, combine never fails.
// Kept per thread for the next batch, unless a large batch grew it: 32 bytes a row would stay
// resident (3 bytes per entry of a state loaded in 1M-row batches).
template <class Buffer>
void release_undo(Buffer& b) {
  constexpr size_t kKeepUndoRows = 65536;
  if (b.capacity > kKeepUndoRows) {
    b.rows.reset();
    b.capacity = 0;
  }
}

template <class T, bool kUndo, class Combine, class ValueAt>
void fold_rows(StateTable& table, const int32_t* kgs, RowKeys& rk, const ArrayView& values,
               Combine combine, ValueAt value_at, T* out, uint8_t* valid, const TtlBatchSpec& ttl,
               int64_t* expired) {
  struct Undo {
    int64_t row;
    T old;           // meaningful when existed
    int64_t old_ts;  // meaningful when existed and TTL is on
    bool existed;
  };
  // A raw per-thread buffer sized for the batch up front: vector::push_back re-read the
  // thread_local's address (a __tls_get_addr call in a shared library) on every row.
  struct UndoBuffer {
    std::unique_ptr<Undo[]> rows;
    size_t capacity = 0;
  };
  thread_local UndoBuffer undo_tls;
  UndoBuffer& undo_buf = undo_tls;
  Undo* undo = nullptr;
  size_t undone = 0;  // rows logged
  if constexpr (kUndo) {
    const size_t need = static_cast<size_t>(values.length());
    if (undo_buf.capacity < need) {
      undo_buf.rows.reset(new Undo[need]);
      undo_buf.capacity = need;
    }
    undo = undo_buf.rows.get();
  }
  const size_t width = fixed_width<T>(ttl);
  constexpr size_t kTs = stored_width<T>();  // where the TTL timestamp starts
  const int64_t n = values.length();
  for (int64_t i = 0; i < n; ++i) {
    rk.ahead(i);
    rk.encode(i, kgs[i]);
    StateMap& m = table.map_unchecked(kgs[i]);
    if (!values.is_valid(i)) {
      emit_current(m, rk, i, out, valid, ttl, expired);
      continue;
    }
    const T x = value_at(i);
    size_t sz = 0;
    bool inserted = false;
    const uint32_t h = rk.hash(i, m);
    uint8_t* p = m.engine().flat_fast_upsert(h, rk.data(), rk.size(), width, &sz, &inserted);
    if (p == nullptr) p = m.upsert(h, rk.data(), rk.size(), width, &sz, &inserted);
    T acc;
    if (!inserted) {
      if (sz != width) wrong_width(i, sz, width);
      const T old = load_fixed<T>(p);
      const int64_t old_ts = ttl.enabled ? ttl::load_timestamp(p + kTs) : 0;
      if (ttl.enabled && ttl::expired(old_ts, ttl.ttl_ms, ttl.now)) {
        // Python `_unexpired`: counted, not removed; the write below overwrites it in place.
        ++*expired;
        acc = x;
      } else if (!combine(old, x, &acc)) {
        if constexpr (kUndo) {
          for (const Undo* it = undo + undone; it-- != undo;) {
            rk.encode(it->row, kgs[it->row]);
            StateMap& um = table.map_unchecked(kgs[it->row]);
            if (it->existed) {
              size_t usz = 0;
              uint8_t* up = um.get_for_update(rk.data(), rk.size(), &usz);
              store_fixed<T>(up, it->old);
              if (ttl.enabled) ttl::store_timestamp(up + kTs, it->old_ts);
            } else {
              um.remove(rk.data(), rk.size());
            }
          }
          release_undo(undo_buf);
        }
        fail("values: " + row_str(i) + ": " + int_type_name<T>() +
             " sum overflows (" + std::to_string(old) + " + " + std::to_string(x) +
             "); the batch was not applied");
      }
      if constexpr (kUndo) undo[undone++] = Undo{i, old, old_ts, true};
    } else {
      acc = x;
      if constexpr (kUndo) undo[undone++] = Undo{i, T{}, 0, false};
    }
    store_fixed<T>(p, acc);
    if (ttl.enabled) ttl::store_timestamp(p + kTs, ttl.now);
    out[i] = acc;
    valid[i] = 1;
  }
  if constexpr (kUndo) release_undo(undo_buf);
}

template <class T, class ValueAt>
void fold_reducer(Reducer r, StateTable& table, const int32_t* kgs, RowKeys& rk,
                  const ArrayView& values, ValueAt value_at, T* out, uint8_t* valid,
                  const TtlBatchSpec& ttl, int64_t* expired) {
  // add_batch validation rejects Sum/Min/Max on bool (the reference does); not instantiating
  // them keeps bool arithmetic out of the kernels.
  switch (r) {
    case Reducer::Sum:
      if constexpr (std::is_same<T, bool>::value) {
        break;
      } else if constexpr (std::is_integral<T>::value) {
        fold_rows<T, true>(table, kgs, rk, values,
                           [](T a, T b, T* res) { return !__builtin_add_overflow(a, b, res); },
                           value_at, out, valid, ttl, expired);
      } else {
        fold_rows<T, false>(table, kgs, rk, values,
                            [](T a, T b, T* res) { return *res = a + b, true; }, value_at, out,
                            valid, ttl, expired);
      }
      break;
    case Reducer::Min:
      if constexpr (std::is_same<T, bool>::value) break;
      else fold_rows<T, false>(table, kgs, rk, values,
                          [](T acc, T v, T* res) { return *res = v < acc ? v : acc, true; },
                          value_at, out, valid, ttl, expired);
      break;
    case Reducer::Max:
      if constexpr (std::is_same<T, bool>::value) break;
      else fold_rows<T, false>(table, kgs, rk, values,
                          [](T acc, T v, T* res) { return *res = v > acc ? v : acc, true; },
                          value_at, out, valid, ttl, expired);
      break;
    case Reducer::First:
      fold_rows<T, false>(table, kgs, rk, values,
                          [](T acc, T, T* res) { return *res = acc, true; }, value_at, out,
                          valid, ttl, expired);
      break;
    case Reducer::Last:
      fold_rows<T, false>(table, kgs, rk, values,
                          [](T, T v, T* res) { return *res = v, true; }, value_at, out, valid,
                          ttl, expired);
      break;
    case Reducer::Count:
      break;  // handled by the caller (different value input)
  }
}

// add_batch's checks of the value type, reducer and values (formats, length).
void check_add_values(const ValueSpec& value_type, Reducer reducer, const KeyArrays& keys,
                      const ArrayView& values) {
  const ValueType t = value_type.type;
  if (reducer == Reducer::Count) {
    if (t != ValueType::Int64)
      fail(std::string("add_batch: a Count state holds int64 counts, not ") +
           value_type_name(value_type));
    if (values.length() != keys.length())
      fail("values: length " + std::to_string(values.length()) + " differs from keys length " +
           std::to_string(keys.length()));
    return;
  }
  if (reducer == Reducer::Sum && t != ValueType::Int64 && t != ValueType::UInt64 &&
      t != ValueType::Float64 && t != ValueType::Int32)
    fail("add_batch: Sum needs an int64, uint64, float64 or int32 state, not " +
         value_type_name(value_type));
  const bool ordered = reducer == Reducer::Min || reducer == Reducer::Max;
  if (!is_fixed(value_type) || (ordered && t == ValueType::Bool))
    fail(std::string("add_batch: ") +
         (ordered ? "Min/Max need a fixed-width state other than bool, not "
                  : "First/Last need a fixed-width state, not ") +
         value_type_name(value_type));
  check_values(value_type, keys, values);
}

// A null value row of a FixedSizeBinary add_batch: emit_current over `w`-byte values.
void emit_current_bytes(StateMap& m, const RowKeys& rk, int64_t i, size_t w, uint8_t* out,
                        uint8_t* valid, const TtlBatchSpec& ttl, int64_t* expired) {
  std::memset(out, 0, w);
  if (ttl.enabled) {
    valid[i] = ttl_read(m, rk, i, fixed_width(w, ttl), ttl, expired,
                        [&](const uint8_t* p, size_t) { std::memcpy(out, p, w); })
                   ? 1 : 0;
    return;
  }
  ByteView v;
  if (kernel_get(m, rk.hash(i, m), rk.data(), rk.size(), &v)) {
    if (v.size != w) wrong_width(i, v.size, w);
    std::memcpy(out, v.data, w);
    valid[i] = 1;
  } else {
    valid[i] = 0;
  }
}

// add_batch apply pass of a FixedSizeBinary state: fold_rows over `w`-byte values, whose
// reducers (First, Last, Min, Max by memcmp) never fail, so there is no undo log. Row i's
// output is out[i * w, (i + 1) * w).
void fold_bytes(Reducer r, StateTable& table, const int32_t* kgs, RowKeys& rk,
                const ArrayView& values, size_t w, uint8_t* out, uint8_t* valid,
                const TtlBatchSpec& ttl, int64_t* expired) {
  const size_t width = fixed_width(w, ttl);
  const int64_t n = values.length();
  for (int64_t i = 0; i < n; ++i) {
    rk.ahead(i);
    rk.encode(i, kgs[i]);
    StateMap& m = table.map_unchecked(kgs[i]);
    uint8_t* o = out + static_cast<size_t>(i) * w;
    if (!values.is_valid(i)) {
      emit_current_bytes(m, rk, i, w, o, valid, ttl, expired);
      continue;
    }
    const uint8_t* x = values.fixed_at(i);
    size_t sz = 0;
    bool inserted = false;
    const uint32_t h = rk.hash(i, m);
    uint8_t* p = m.engine().flat_fast_upsert(h, rk.data(), rk.size(), width, &sz, &inserted);
    if (p == nullptr) p = m.upsert(h, rk.data(), rk.size(), width, &sz, &inserted);
    bool take = true;
    if (!inserted) {
      if (sz != width) wrong_width(i, sz, width);
      if (ttl.enabled && ttl::expired(ttl::load_timestamp(p + w), ttl.ttl_ms, ttl.now)) {
        ++*expired;  // Python `_unexpired`: counted, then overwritten in place
      } else if (r == Reducer::First) {
        take = false;
      } else if (r == Reducer::Min || r == Reducer::Max) {
        const int c = std::memcmp(x, p, w);
        take = r == Reducer::Min ? c < 0 : c > 0;
      }
    }
    if (take) std::memcpy(p, x, w);
    if (ttl.enabled) ttl::store_timestamp(p + w, ttl.now);
    std::memcpy(o, p, w);
    valid[i] = 1;
  }
}

}  // namespace

size_t value_width(const ValueSpec& t) {
  switch (t.type) {
    case ValueType::Int64:
    case ValueType::Float64:
    case ValueType::UInt64:
    case ValueType::Timestamp: return 8;
    case ValueType::Int32: return 4;
    case ValueType::Bool: return 1;
    case ValueType::FixedSizeBinary: return t.width > 0 ? static_cast<size_t>(t.width) : 0;
    case ValueType::String:
    case ValueType::Binary: return 0;
  }
  return 0;
}

void validate_batch(StateTable& table, const BatchKeySpec& spec, ArrowInput keys_in,
                    const ValueSpec& value_type, BatchOp op, Reducer reducer,
                    ArrowInput values_in, const TtlBatchSpec& ttl) {
  check_spec(value_type);
  const KeyArrays keys = make_keys(spec, keys_in);
  if (op == BatchOp::Put) {
    const ArrayView values = make_view(values_in, "values");
    check_values(value_type, keys, values);
  } else if (op == BatchOp::Add) {
    const ArrayView values = make_view(values_in, "values");
    check_add_values(value_type, reducer, keys, values);
  }
  check_ttl(ttl);
  validate_keys(table, spec, keys);
}

void get_batch_fixed(StateTable& table, const BatchKeySpec& spec, ArrowInput keys_in,
                     const ValueSpec& value_type, void* out_values, uint8_t* out_valid,
                     const TtlBatchSpec& ttl, int64_t* expired) {
  int64_t local = 0;
  expired = expired_sink(expired, &local);
  check_spec(value_type);
  const KeyArrays keys = make_keys(spec, keys_in);
  if (!is_fixed(value_type))
    fail(std::string("get_batch_fixed: value type ") + value_type_name(value_type) +
         " is not fixed-width (use get_batch_var)");
  check_ttl(ttl);
  const int32_t* kgs = validate_keys(table, spec, keys);
  const int64_t n = keys.length();
  if (n > 0 && (out_values == nullptr || out_valid == nullptr))
    fail("get_batch_fixed: null output buffer");
  RowKeys rk(spec, keys, table, kgs);
  const size_t user_width = value_width(value_type);
  if (ttl.enabled) {
    const size_t width = fixed_width(user_width, ttl);
    for (int64_t i = 0; i < n; ++i) {
      rk.ahead(i);
      rk.encode(i, kgs[i]);
      out_fixed(value_type, out_values, i, nullptr);
      out_valid[i] = ttl_read(table.map_unchecked(kgs[i]), rk, i, width, ttl, expired,
                              [&](const uint8_t* p, size_t) {
                                out_fixed(value_type, out_values, i, p);
                              })
                         ? 1 : 0;
    }
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    rk.ahead(i);
    rk.encode(i, kgs[i]);
    ByteView v;
    StateMap& m = table.map_unchecked(kgs[i]);
    const bool found = kernel_get(m, rk.hash(i, m), rk.data(), rk.size(), &v);
    if (found && v.size != user_width) wrong_width(i, v.size, user_width);
    out_fixed(value_type, out_values, i, found ? v.data : nullptr);
    out_valid[i] = found ? 1 : 0;
  }
}

void get_batch_var(StateTable& table, const BatchKeySpec& spec, ArrowInput keys_in,
                   const ValueSpec& value_type, std::vector<int64_t>& offsets,
                   std::vector<uint8_t>& data, uint8_t* out_valid, const TtlBatchSpec& ttl,
                   int64_t* expired) {
  int64_t local = 0;
  expired = expired_sink(expired, &local);
  check_spec(value_type);
  const KeyArrays keys = make_keys(spec, keys_in);
  if (value_type.type != ValueType::String && value_type.type != ValueType::Binary)
    fail(std::string("get_batch_var: value type ") + value_type_name(value_type) +
         " is not variable-width (use get_batch_fixed)");
  check_ttl(ttl);
  const int32_t* kgs = validate_keys(table, spec, keys);
  const int64_t n = keys.length();
  if (n > 0 && out_valid == nullptr) fail("get_batch_var: null validity output buffer");
  offsets.resize(static_cast<size_t>(n) + 1);
  data.clear();
  offsets[0] = 0;
  RowKeys rk(spec, keys, table, kgs);
  // Appends into a buffer trimmed at the end: vector::insert per row was ~40% of a 64-byte binary
  // get (callgrind). A growth assumes the remaining rows are as large as this one (values of one
  // size, the common case, grow it once) and at least doubles; resize() zero-fills, once per
  // growth.
  size_t used = 0;
  int64_t row = 0;
  auto append = [&](const uint8_t* p, size_t sz) {
    if (used + sz > data.size())
      data.resize(std::max({used + sz * static_cast<size_t>(n - row), 2 * data.size(),
                            size_t(4096)}));
    if (sz) std::memcpy(data.data() + used, p, sz);
    used += sz;
  };
  for (int64_t i = 0; i < n; ++i) {
    row = i;
    rk.ahead(i);
    rk.encode(i, kgs[i]);
    StateMap& m = table.map_unchecked(kgs[i]);
    bool found;
    if (ttl.enabled) {
      found = ttl_read(m, rk, i, 0, ttl, expired, append);
    } else {
      ByteView v;
      found = kernel_get(m, rk.hash(i, m), rk.data(), rk.size(), &v);
      if (found) append(v.data, v.size);
    }
    out_valid[i] = found ? 1 : 0;
    offsets[i + 1] = static_cast<int64_t>(used);
  }
  data.resize(used);
}

void put_batch(StateTable& table, const BatchKeySpec& spec, ArrowInput keys_in,
               const ValueSpec& value_type, ArrowInput values_in, const TtlBatchSpec& ttl) {
  check_spec(value_type);
  const KeyArrays keys = make_keys(spec, keys_in);
  const ArrayView values = make_view(values_in, "values");
  check_values(value_type, keys, values);
  check_ttl(ttl);
  const int32_t* kgs = validate_keys(table, spec, keys);
  const int64_t n = keys.length();
  const size_t suffix = ttl.enabled ? ttl::kTimestampBytes : 0;
  RowKeys rk(spec, keys, table, kgs);
  for (int64_t i = 0; i < n; ++i) {
    rk.ahead(i);
    rk.encode(i, kgs[i]);
    StateMap& m = table.map_unchecked(kgs[i]);
    if (!values.is_valid(i)) {
      m.remove(rk.data(), rk.size());
      continue;
    }
    uint8_t* dst;
    size_t sz = 8;
    switch (value_type.type) {
      case ValueType::Int64:
      case ValueType::Timestamp:
        dst = kernel_put(m, rk.hash(i, m), rk.data(), rk.size(), 8 + suffix);
        store_i64(dst, values.int64_at(i));
        break;
      case ValueType::UInt64:
        dst = kernel_put(m, rk.hash(i, m), rk.data(), rk.size(), 8 + suffix);
        store_le64(dst, values.uint64_at(i));
        break;
      case ValueType::FixedSizeBinary:
        sz = static_cast<size_t>(value_type.width);
        dst = kernel_put(m, rk.hash(i, m), rk.data(), rk.size(), sz + suffix);
        std::memcpy(dst, values.fixed_at(i), sz);
        break;
      case ValueType::Float64:
        dst = kernel_put(m, rk.hash(i, m), rk.data(), rk.size(), 8 + suffix);
        store_f64(dst, values.float64_at(i));
        break;
      case ValueType::Int32:
        sz = 4;
        dst = kernel_put(m, rk.hash(i, m), rk.data(), rk.size(), 4 + suffix);
        store_i32(dst, values.int32_at(i));
        break;
      case ValueType::Bool:
        sz = 1;
        dst = kernel_put(m, rk.hash(i, m), rk.data(), rk.size(), 1 + suffix);
        store_bool(dst, values.bool_at(i));
        break;
      case ValueType::String:
      case ValueType::Binary:
      default: {
        const uint8_t* src = values.bytes_at(i, &sz);
        dst = kernel_put(m, rk.hash(i, m), rk.data(), rk.size(), sz + suffix);
        if (sz > 0) std::memcpy(dst, src, sz);
        break;
      }
    }
    if (ttl.enabled) ttl::store_timestamp(dst + sz, ttl.now);
  }
}

void add_batch(StateTable& table, const BatchKeySpec& spec, ArrowInput keys_in,
               const ValueSpec& value_type, Reducer reducer, ArrowInput values_in,
               void* out_values, uint8_t* out_valid, const TtlBatchSpec& ttl, int64_t* expired) {
  int64_t local = 0;
  expired = expired_sink(expired, &local);
  check_spec(value_type);
  const KeyArrays keys = make_keys(spec, keys_in);
  const ArrayView values = make_view(values_in, "values");
  check_add_values(value_type, reducer, keys, values);
  check_ttl(ttl);
  const int32_t* kgs = validate_keys(table, spec, keys);
  const int64_t n = keys.length();
  if (n > 0 && (out_values == nullptr || out_valid == nullptr))
    fail("add_batch: null output buffer");
  RowKeys rk(spec, keys, table, kgs);
  if (reducer == Reducer::Count) {
    fold_rows<int64_t, false>(
        table, kgs, rk, values,
        [](int64_t a, int64_t b, int64_t* res) {
          *res = static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
          return true;
        },
        [](int64_t) { return int64_t{1}; }, static_cast<int64_t*>(out_values), out_valid, ttl,
        expired);
  } else if (value_type.type == ValueType::Int64 || value_type.type == ValueType::Timestamp) {
    // A timestamp is its int64 count of units (Sum was rejected above).
    fold_reducer<int64_t>(reducer, table, kgs, rk, values,
                          [&](int64_t i) { return values.int64_at(i); },
                          static_cast<int64_t*>(out_values), out_valid, ttl, expired);
  } else if (value_type.type == ValueType::UInt64) {
    fold_reducer<uint64_t>(reducer, table, kgs, rk, values,
                           [&](int64_t i) { return values.uint64_at(i); },
                           static_cast<uint64_t*>(out_values), out_valid, ttl, expired);
  } else if (value_type.type == ValueType::FixedSizeBinary) {
    fold_bytes(reducer, table, kgs, rk, values, static_cast<size_t>(value_type.width),
               static_cast<uint8_t*>(out_values), out_valid, ttl, expired);
  } else if (value_type.type == ValueType::Int32) {
    fold_reducer<int32_t>(reducer, table, kgs, rk, values,
                          [&](int64_t i) { return values.int32_at(i); },
                          static_cast<int32_t*>(out_values), out_valid, ttl, expired);
  } else if (value_type.type == ValueType::Bool) {
    // bool is one byte holding 0/1 on every platform the build supports (checked below), so the
    // caller's uint8_t[n] output is written as bool[n].
    static_assert(sizeof(bool) == 1, "bool outputs are written into uint8_t buffers");
    fold_reducer<bool>(reducer, table, kgs, rk, values,
                       [&](int64_t i) { return values.bool_at(i); },
                       static_cast<bool*>(out_values), out_valid, ttl, expired);
  } else {
    fold_reducer<double>(reducer, table, kgs, rk, values,
                         [&](int64_t i) { return values.float64_at(i); },
                         static_cast<double*>(out_values), out_valid, ttl, expired);
  }
}

}  // namespace statecore
