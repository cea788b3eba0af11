// Batch keys read against a KeySchema (see key_columns.h).
#include "statecore/key_columns.h"

#include "multiversion.h"
#include "statecore/detail/bytes.h"
#include "statecore/detail/spark_pmod.h"
#include "statecore/detail/utf8.h"
#include "statecore/hash.h"

#include <cstring>
#include <stdexcept>
#include <string>

namespace statecore {
namespace {

[[noreturn]] void bad(const std::string& msg) { throw std::invalid_argument(msg); }

// Spark key groups of a column, `hash(i)` = row i's xxhash64 (seed 42) as unsigned: one loop
// with the hash inlined, instead of a per-row key_group_for_* call (a max-parallelism check, an
// assigner switch, a 64-bit division), which would cost more than the hash itself. A
// power-of-two max parallelism (the default) takes Spark's pmod as a mask: in two's complement
// ((h % m) + m) % m == h & (m - 1) for m = 2^k.
// Any other takes it without a division (detail::SparkPmod).
template <class Hash>
void spark_key_groups(int32_t maxp, int64_t n, int32_t* out, Hash hash) {
  if ((maxp & (maxp - 1)) == 0) {
    const uint64_t mask = static_cast<uint64_t>(maxp) - 1;
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<int32_t>(hash(i) & mask);
    return;
  }
  const detail::SparkPmod pmod(static_cast<uint32_t>(maxp));
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<int32_t>(pmod(hash(i)));
}

// spark_key_groups of n int64 keys (8 little-endian bytes each at `keys`, any alignment) with a
// power-of-two max parallelism (mask = maxP - 1). SC_MULTIVERSION: on AVX-512 CPUs the loop runs
// 8 keys at a time, on AVX2 ones 4.
SC_MULTIVERSION_INLINE void spark_int64_key_groups_pow2_loop(const uint8_t* keys, int64_t n,
                                                             uint64_t mask, int32_t* out) {
  for (int64_t i = 0; i < n; ++i) {
    uint64_t v;
    std::memcpy(&v, keys + i * 8, 8);
    out[i] = static_cast<int32_t>(xxh64_u64(v, kSparkXxhashSeed) & mask);
  }
}
SC_MULTIVERSION(void, spark_int64_key_groups_pow2,
                (const uint8_t* keys, int64_t n, uint64_t mask, int32_t* out), (keys, n, mask, out),
                spark_int64_key_groups_pow2_loop)

// The Spark hashes (xxhash64, seed 42) of n int64 keys as above, for the other max
// parallelisms: vectorized the same way, the pmod follows per row (spark_int64_key_groups).
SC_MULTIVERSION_INLINE void spark_int64_hashes_loop(const uint8_t* keys, int64_t n, uint64_t* out) {
  for (int64_t i = 0; i < n; ++i) {
    uint64_t v;
    std::memcpy(&v, keys + i * 8, 8);
    out[i] = xxh64_u64(v, kSparkXxhashSeed);
  }
}
SC_MULTIVERSION(void, spark_int64_hashes, (const uint8_t* keys, int64_t n, uint64_t* out),
                (keys, n, out), spark_int64_hashes_loop)

// spark_key_groups of n int64 keys at `keys` for any max parallelism.
void spark_int64_key_groups(const uint8_t* keys, int64_t n, int32_t maxp, int32_t* out) {
  if ((maxp & (maxp - 1)) == 0) {
    spark_int64_key_groups_pow2(keys, n, static_cast<uint64_t>(maxp) - 1, out);
    return;
  }
  const detail::SparkPmod pmod(static_cast<uint32_t>(maxp));
  constexpr int64_t kChunk = 256;
  uint64_t h[kChunk];
  for (int64_t s = 0; s < n; s += kChunk) {
    const int64_t m = n - s < kChunk ? n - s : kChunk;
    spark_int64_hashes(keys + s * 8, m, h);
    for (int64_t j = 0; j < m; ++j) out[s + j] = static_cast<int32_t>(pmod(h[j]));
  }
}

char unit_letter(TimeUnit u) {
  switch (u) {
    case TimeUnit::Second: return 's';
    case TimeUnit::Milli: return 'm';
    case TimeUnit::Micro: return 'u';
    case TimeUnit::Nano: return 'n';
  }
  return '?';
}

std::string arrow_name(const ArrayView& v) {
  if (v.kind() == ArrowKind::Timestamp) {
    const char u = v.time_unit();
    return std::string("timestamp[") +
           (u == 's'   ? "s"
            : u == 'm' ? "ms"
            : u == 'u' ? "us"
                       : "ns") +
           "]";
  }
  if (v.kind() == ArrowKind::FixedSizeBinary)
    return "fixed_size_binary[" + std::to_string(v.byte_width()) + "]";
  return arrow_kind_name(v.kind());
}

bool accepts(const KeyColumn& c, const ArrayView& v) {
  const ArrowKind k = v.kind();
  switch (c.type) {
    case KeyType::Int32: return k == ArrowKind::Int32;
    case KeyType::Int64: return k == ArrowKind::Int64;
    case KeyType::UInt64: return k == ArrowKind::UInt64;
    case KeyType::Float64: return k == ArrowKind::Float64;
    case KeyType::Bool: return k == ArrowKind::Bool;
    case KeyType::Timestamp:
      return k == ArrowKind::Timestamp && v.time_unit() == unit_letter(c.unit);
    case KeyType::String: return k == ArrowKind::Utf8 || k == ArrowKind::LargeUtf8;
    case KeyType::Binary: return k == ArrowKind::Binary || k == ArrowKind::LargeBinary;
    case KeyType::FixedSizeBinary:
      return k == ArrowKind::FixedSizeBinary && v.byte_width() == c.width;
  }
  return false;
}

ArrayView column_view(const KeyColumn& c, const ArrowSchema* s, const ArrowArray* a,
                      const std::string& where, bool child, int64_t offset, int64_t length) {
  try {
    ArrayView v = child ? ArrayView(s, a, offset, length) : ArrayView(s, a);
    if (!accepts(c, v))
      bad(where + "expected an Arrow array of key type " + key_column_name(c) + ", got " +
          arrow_name(v));
    return v;
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    if (msg.rfind(where, 0) == 0) throw;
    bad(where + msg);
  }
}

// The slow path of check_column_data: each non-null element of a utf8 column on its own, for the
// first bad one and why.
int64_t first_bad_utf8_row(const ArrayView& v, std::string* why) {
  for (int64_t i = 0; i < v.length(); ++i) {
    if (!v.is_valid(i)) continue;
    size_t size, at = 0;
    const uint8_t* p = v.bytes_at(i, &size);
    const detail::Utf8Error err = detail::utf8_check(p, size, &at);
    if (err != detail::Utf8Error::kNone) {
      if (why != nullptr)
        *why = "invalid UTF-8 at byte " + std::to_string(at) + " (" + detail::utf8_error_name(err) +
               ")";
      return i;
    }
  }
  return -1;
}

}  // namespace

int64_t check_column_data(const ArrayView& v, std::string* why) {
  const int64_t n = v.length();
  if (!is_variable_width(v.kind()) || n == 0) return -1;
  const auto fail_at = [why](int64_t row, const std::string& msg) {
    if (why != nullptr) *why = msg;
    return row;
  };
  int64_t first, last, unused;
  v.offsets_at(0, &first, &unused);
  v.offsets_at(n - 1, &unused, &last);
  if (first < 0) return fail_at(0, "negative offset " + std::to_string(first));
  const uint8_t* values = v.values_buffer();
  const bool utf8 = v.kind() == ArrowKind::Utf8 || v.kind() == ArrowKind::LargeUtf8;
  // A row boundary inside a multi-byte sequence (the next row starting with a continuation
  // byte): the rows' concatenation may be valid while the rows are not.
  bool split = false;
  for (int64_t i = 0; i < n; ++i) {
    int64_t b, e;
    v.offsets_at(i, &b, &e);
    if (e < b)
      return fail_at(i, "offsets go backwards (end " + std::to_string(e) + " < start " +
                            std::to_string(b) + ")");
    // Past the last offset means backwards later on; caught here, before the byte read below.
    if (e > last)
      return fail_at(i, "offset " + std::to_string(e) + " past the array's last offset " +
                            std::to_string(last));
    if (e > b && values == nullptr)
      return fail_at(i, "no values buffer for its " + std::to_string(e - b) + " bytes");
    if (utf8 && e < last && values != nullptr) split |= (values[e] & 0xC0) == 0x80;
  }
  if (!utf8 || last == first) return -1;
  // The common case in one run over the bytes: valid throughout and no row boundary splitting
  // a sequence means every row is valid. Otherwise row by row, skipping nulls, for the row and
  // the reason (and garbage only in null rows passes, as with pyarrow).
  if (!split && detail::utf8_valid(values + first, static_cast<size_t>(last - first))) return -1;
  return first_bad_utf8_row(v, why);
}

KeyArrays::KeyArrays(const KeySchema& schema, const ArrowSchema* s, const ArrowArray* a)
    : schema_(schema) {
  schema_.validate();
  if (s == nullptr || a == nullptr) bad("null ArrowSchema/ArrowArray pointer");
  if (!schema_.is_struct) {
    columns_.push_back(column_view(schema_.columns[0], s, a, "", false, 0, 0));
    length_ = columns_[0].length();
    return;
  }
  if (s->release == nullptr || a->release == nullptr)
    bad("ArrowSchema/ArrowArray has already been released");
  const size_t n = schema_.columns.size();
  if (s->format == nullptr || std::string(s->format) != "+s")
    bad("expected a struct array of " + std::to_string(n) + " fields for key type " +
        schema_.name() + ", got Arrow format '" + (s->format ? s->format : "(null)") + "'");
  if (s->n_children != static_cast<int64_t>(n) || a->n_children != static_cast<int64_t>(n) ||
      s->children == nullptr || a->children == nullptr)
    bad("expected a struct array of " + std::to_string(n) + " fields for key type " +
        schema_.name() + ", got " + std::to_string(s->n_children) + " fields");
  if (a->length < 0 || a->offset < 0 || a->null_count < -1 || a->n_buffers != 1 ||
      a->buffers == nullptr)
    bad("malformed struct array (length, offset, null_count or buffers)");
  if (s->dictionary != nullptr || a->dictionary != nullptr)
    bad("dictionary-encoded arrays are not supported");
  length_ = a->length;
  struct_offset_ = a->offset;
  struct_validity_ = a->null_count == 0 ? nullptr : static_cast<const uint8_t*>(a->buffers[0]);
  for (size_t i = 0; i < n; ++i)
    columns_.push_back(column_view(schema_.columns[i], s->children[i], a->children[i],
                                   "field " + std::to_string(i) + ": ", true, a->offset,
                                   a->length));
}

KeyArrays::KeyArrays(const KeySchema& schema, const KeySchema& ns, const ArrowSchema* s,
                     const ArrowArray* a)
    : schema_(schema) {
  if (s == nullptr || a == nullptr) bad("null ArrowSchema/ArrowArray pointer");
  if (s->release == nullptr || a->release == nullptr)
    bad("ArrowSchema/ArrowArray has already been released");
  if (ns.is_struct || ns.columns.size() != 1) bad("a namespace type has exactly one column");
  if (s->format == nullptr || std::string(s->format) != "+s" || s->n_children != 2 ||
      a->n_children != 2 || s->children == nullptr || a->children == nullptr)
    bad("namespaced keys must be a struct array {key, namespace}");
  if (a->offset != 0 || a->length < 0 ||
      (a->null_count != 0 && a->n_buffers > 0 && a->buffers != nullptr && a->buffers[0] != nullptr))
    bad("namespaced keys: the {key, namespace} struct must have offset 0 and no null rows");
  try {
    *this = KeyArrays(schema, s->children[0], a->children[0]);
  } catch (const std::invalid_argument& e) {
    bad(std::string("key: ") + e.what());
  }
  try {
    ns_ = std::make_shared<const KeyArrays>(ns, s->children[1], a->children[1]);
  } catch (const std::invalid_argument& e) {
    bad(std::string("namespaces: ") + e.what());
  }
  if (length_ != a->length || ns_->length() != a->length)
    bad("namespaced keys: key and namespace columns must be as long as their struct");
}

int64_t KeyArrays::check_data(std::string* why) const {
  for (size_t c = 0; c < columns_.size(); ++c) {
    const int64_t r = check_column_data(columns_[c], why);
    if (r >= 0) {
      if (why != nullptr && schema_.is_struct) *why = "field " + std::to_string(c) + ": " + *why;
      return r;
    }
  }
  return -1;
}

int64_t KeyArrays::first_null(int* column) const {
  bool any = struct_validity_ != nullptr;
  for (const ArrayView& v : columns_) any = any || v.null_count() != 0;
  if (!any) return -1;
  for (int64_t i = 0; i < length_; ++i) {
    if (struct_validity_ != nullptr) {
      const int64_t j = struct_offset_ + i;
      if (!((struct_validity_[j >> 3] >> (j & 7)) & 1)) {
        if (column != nullptr) *column = -1;
        return i;
      }
    }
    for (size_t c = 0; c < columns_.size(); ++c) {
      if (!columns_[c].is_valid(i)) {
        if (column != nullptr) *column = static_cast<int>(c);
        return i;
      }
    }
  }
  return -1;
}

void KeyArrays::add_to(KeyHasher& h, size_t column, int64_t row) const {
  const ArrayView& v = columns_[column];
  switch (schema_.columns[column].type) {
    case KeyType::Int32: h.add_int32(v.int32_at(row)); break;
    case KeyType::Int64:
    case KeyType::Timestamp: h.add_int64(v.int64_at(row)); break;
    case KeyType::UInt64: h.add_uint64(v.uint64_at(row)); break;
    case KeyType::Float64: h.add_float64(v.float64_at(row)); break;
    case KeyType::Bool: h.add_bool(v.bool_at(row)); break;
    case KeyType::String: {
      size_t sz;
      const uint8_t* p = v.bytes_at(row, &sz);
      h.add_string(reinterpret_cast<const char*>(p), sz);
      break;
    }
    case KeyType::Binary: {
      size_t sz;
      const uint8_t* p = v.bytes_at(row, &sz);
      h.add_binary(p, sz);
      break;
    }
    case KeyType::FixedSizeBinary:
      h.add_binary(v.fixed_at(row), static_cast<size_t>(v.byte_width()));
      break;
  }
}

void KeyArrays::key_groups(Assigner a, int32_t maxp, int32_t* out) const {
  check_max_parallelism(maxp);
  const int64_t n = length_;
  if (!schema_.is_struct) {
    // One column: a type switch per batch, not per row (the common case's hot loop).
    const ArrayView& v = columns_[0];
    switch (schema_.columns[0].type) {
      case KeyType::Int32:
        if (a == Assigner::Spark) {
          spark_key_groups(maxp, n, out, [&](int64_t i) {
            return xxh64_u32(static_cast<uint32_t>(v.int32_at(i)), kSparkXxhashSeed);
          });
          return;
        }
        for (int64_t i = 0; i < n; ++i) out[i] = key_group_for_int32(a, v.int32_at(i), maxp);
        return;
      case KeyType::Int64:
      case KeyType::Timestamp:
      case KeyType::UInt64:  // hashed as its int64 bits (Spark hashLong, Java Long)
        if (a == Assigner::Spark && !detail::kBigEndianHost) {
          spark_int64_key_groups(v.fixed_data(8), n, maxp, out);
        } else if (a == Assigner::Spark) {
          spark_key_groups(maxp, n, out, [&](int64_t i) {
            return xxh64_u64(static_cast<uint64_t>(v.int64_at(i)), kSparkXxhashSeed);
          });
        } else {
          for (int64_t i = 0; i < n; ++i) out[i] = key_group_for_int64(a, v.int64_at(i), maxp);
        }
        return;
      case KeyType::Float64:
        for (int64_t i = 0; i < n; ++i) out[i] = key_group_for_float64(a, v.float64_at(i), maxp);
        return;
      case KeyType::String:
      case KeyType::Binary: {
        if (a == Assigner::Spark) {  // the same bytes hashed for both (Spark UTF8String / binary)
          spark_key_groups(maxp, n, out, [&](int64_t i) {
            size_t sz;
            const uint8_t* p = v.bytes_at(i, &sz);
            return xxh64(p, sz, kSparkXxhashSeed);
          });
          return;
        }
        const bool str = schema_.columns[0].type == KeyType::String;
        int64_t i = 0;
        try {
          for (; i < n; ++i) {
            size_t sz;
            const uint8_t* p = v.bytes_at(i, &sz);
            out[i] = str ? key_group_for_string(a, reinterpret_cast<const char*>(p), sz, maxp)
                         : key_group_for_binary(a, p, sz, maxp);
          }
        } catch (const std::invalid_argument& e) {
          bad("row " + std::to_string(i) + ": " + e.what());
        }
        return;
      }
      default: break;  // the generic path below
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    KeyHasher h(a);
    try {
      for (size_t c = 0; c < columns_.size(); ++c) add_to(h, c, i);
    } catch (const std::invalid_argument& e) {
      bad("row " + std::to_string(i) + ": " + e.what());
    }
    out[i] = h.key_group(maxp);
  }
}

void KeyArrays::append_ser(std::vector<uint8_t>& out, int64_t row) const {
  for (size_t c = 0; c < columns_.size(); ++c) {
    const ArrayView& v = columns_[c];
    switch (schema_.columns[c].type) {
      case KeyType::Int32: append_ser_int32(out, v.int32_at(row)); break;
      case KeyType::Int64:
      case KeyType::Timestamp: append_ser_int64(out, v.int64_at(row)); break;
      case KeyType::UInt64: append_ser_uint64(out, v.uint64_at(row)); break;
      case KeyType::Float64: append_ser_float64(out, v.float64_at(row)); break;
      case KeyType::Bool: append_ser_bool(out, v.bool_at(row)); break;
      case KeyType::String:
      case KeyType::Binary: {
        size_t sz;
        const uint8_t* p = v.bytes_at(row, &sz);
        append_ser_bytes(out, p, sz);
        break;
      }
      case KeyType::FixedSizeBinary:
        append_ser_fixed(out, v.fixed_at(row), static_cast<size_t>(v.byte_width()));
        break;
    }
  }
}

}  // namespace statecore
