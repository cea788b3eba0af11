// ListState append and MapState put kernels (contract: batch_collections.h). Same two passes as
// batch.cpp: validation touching no state, then one row at a time in row order through RowKeys.
// A blob that grows is read, copied to a per-thread scratch buffer and re-put at its new size:
// the map hands out value bytes of a fixed size, and the pointer it returned dies with the put.
#include "statecore/batch_collections.h"

#include "batch_internal.h"

namespace statecore {
namespace {

using namespace batch_detail;

std::vector<uint8_t>& blob_scratch() {
  thread_local std::vector<uint8_t> buf;
  return buf;
}

// Row i's stored bytes (docs/architecture.md "Values"): fixed-width numbers serialized into tmp
// (8 bytes at most), fixed_size_binary/string/binary pointed to in the Arrow buffers.
inline const uint8_t* value_bytes(const ValueSpec& vt, const ArrayView& v, int64_t i,
                                  uint8_t* tmp, size_t* size) {
  switch (vt.type) {
    case ValueType::Int64:
    case ValueType::Timestamp: store_i64(tmp, v.int64_at(i)); *size = 8; return tmp;
    case ValueType::UInt64: store_le64(tmp, v.uint64_at(i)); *size = 8; return tmp;
    case ValueType::Float64: store_f64(tmp, v.float64_at(i)); *size = 8; return tmp;
    case ValueType::Int32: store_i32(tmp, v.int32_at(i)); *size = 4; return tmp;
    case ValueType::Bool: store_bool(tmp, v.bool_at(i)); *size = 1; return tmp;
    case ValueType::FixedSizeBinary:
      *size = static_cast<size_t>(vt.width);
      return v.fixed_at(i);
    case ValueType::String:
    case ValueType::Binary: break;
  }
  return v.bytes_at(i, size);
}

// One lookup for both cases: an absent key is inserted at `vs` bytes, a present one is returned
// writable at its current size (*cur).
inline uint8_t* upsert_row(StateMap& m, uint32_t h, const uint8_t* key, size_t ks, size_t vs,
                           size_t* cur, bool* inserted) {
  uint8_t* p = m.engine().flat_fast_upsert(h, key, ks, vs, cur, inserted);
  return p != nullptr ? p : m.upsert(h, key, ks, vs, cur, inserted);
}

void check_no_nulls(const ArrayView& v, const char* role, const char* why) {
  if (v.null_count() == 0) return;
  for (int64_t i = 0; i < v.length(); ++i)
    if (!v.is_valid(i)) fail(std::string(role) + ": null at " + row_str(i) + " (" + why + ")");
}

// The validation shared by the kernel and its validate_ function; returns the key groups.
const int32_t* validate_list(StateTable& table, const BatchKeySpec& spec, const KeyArrays& keys,
                             const ValueSpec& et, const ArrayView& values,
                             const TtlBatchSpec& ttl) {
  check_values(et, keys, values);
  check_no_nulls(values, "values", "list state elements must not be null");
  check_ttl(ttl);
  return validate_keys(table, spec, keys);
}

const int32_t* validate_map(StateTable& table, const BatchKeySpec& spec, const KeyArrays& keys,
                            const KeyArrays& user_keys, const ValueSpec& vt,
                            const ArrayView& values, const TtlBatchSpec& ttl) {
  if (user_keys.length() != keys.length())
    fail("user_keys: length " + std::to_string(user_keys.length()) + " differs from keys length " +
         std::to_string(keys.length()));
  const int64_t null_uk = user_keys.first_null(nullptr);
  if (null_uk >= 0) fail("user_keys: null at " + row_str(null_uk) + " (map user keys must not be null)");
  check_values(vt, keys, values);
  check_no_nulls(values, "values", "use remove_batch to remove user keys");
  check_ttl(ttl);
  return validate_keys(table, spec, keys);
}

}  // namespace

void validate_list_append_batch(StateTable& table, const BatchKeySpec& spec, ArrowInput keys_in,
                                const ValueSpec& element_type, ArrowInput values_in,
                                const TtlBatchSpec& ttl) {
  check_spec(element_type);
  const KeyArrays keys = make_keys(spec, keys_in);
  const ArrayView values = make_view(values_in, "values");
  validate_list(table, spec, keys, element_type, values, ttl);
}

void list_append_batch(StateTable& table, const BatchKeySpec& spec, ArrowInput keys_in,
                       const ValueSpec& element_type, ArrowInput values_in,
                       const TtlBatchSpec& ttl) {
  check_spec(element_type);
  const KeyArrays keys = make_keys(spec, keys_in);
  const ArrayView values = make_view(values_in, "values");
  const int32_t* kgs = validate_list(table, spec, keys, element_type, values, ttl);
  const int64_t n = keys.length();
  const bool var = !is_fixed(element_type);
  const size_t suffix = ttl.enabled ? ttl::kTimestampBytes : 0;
  std::vector<uint8_t>& old = blob_scratch();
  RowKeys rk(spec, keys, table, kgs);
  uint8_t tmp[8];
  uint8_t head[10];
  for (int64_t i = 0; i < n; ++i) {
    rk.ahead(i);
    rk.encode(i, kgs[i]);
    StateMap& m = table.map_unchecked(kgs[i]);
    size_t es = 0;
    const uint8_t* e = value_bytes(element_type, values, i, tmp, &es);
    const size_t hs = var ? put_varlen(head, es) : 0;
    const size_t add = hs + es + suffix;
    size_t cur = 0;
    bool inserted = false;
    uint8_t* dst = upsert_row(m, rk.hash(i, m), rk.data(), rk.size(), add, &cur, &inserted);
    size_t at = 0;
    if (!inserted) {
      old.assign(dst, dst + cur);
      dst = m.put(rk.data(), rk.size(), cur + add);
      if (cur) std::memcpy(dst, old.data(), cur);
      at = cur;
    }
    if (hs) std::memcpy(dst + at, head, hs);
    if (es) std::memcpy(dst + at + hs, e, es);
    if (suffix) ttl::store_timestamp(dst + at + hs + es, ttl.now);
  }
}

void validate_map_put_batch(StateTable& table, const BatchKeySpec& spec, ArrowInput keys_in,
                            const KeySchema& user_key, ArrowInput user_keys_in,
                            const ValueSpec& value_type, ArrowInput values_in,
                            const TtlBatchSpec& ttl) {
  check_spec(value_type);
  const KeyArrays keys = make_keys(spec, keys_in);
  const KeyArrays uks = make_user_keys(user_key, user_keys_in);
  const ArrayView values = make_view(values_in, "values");
  validate_map(table, spec, keys, uks, value_type, values, ttl);
}

void map_put_batch(StateTable& table, const BatchKeySpec& spec, ArrowInput keys_in,
                   const KeySchema& user_key, ArrowInput user_keys_in, const ValueSpec& value_type,
                   ArrowInput values_in, const TtlBatchSpec& ttl) {
  check_spec(value_type);
  const KeyArrays keys = make_keys(spec, keys_in);
  const KeyArrays uks = make_user_keys(user_key, user_keys_in);
  const ArrayView values = make_view(values_in, "values");
  const int32_t* kgs = validate_map(table, spec, keys, uks, value_type, values, ttl);
  const int64_t n = keys.length();
  const size_t suffix = ttl.enabled ? ttl::kTimestampBytes : 0;
  std::vector<uint8_t>& blob = blob_scratch();
  std::vector<uint8_t> pair;  // the row's encoded pair; grows to the widest pair once
  std::vector<uint8_t> uk;
  RowKeys rk(spec, keys, table, kgs);
  uint8_t tmp[8];
  for (int64_t i = 0; i < n; ++i) {
    rk.ahead(i);
    rk.encode(i, kgs[i]);
    StateMap& m = table.map_unchecked(kgs[i]);
    uk.clear();
    uks.append_ser(uk, i);
    size_t vs = 0;
    const uint8_t* v = value_bytes(value_type, values, i, tmp, &vs);
    const size_t stored = vs + suffix;
    pair.resize(10 + uk.size() + 10 + stored);
    size_t ps = put_varlen(pair.data(), uk.size());
    std::memcpy(pair.data() + ps, uk.data(), uk.size());
    ps += uk.size();
    ps += put_varlen(pair.data() + ps, stored);
    const size_t value_at = ps;
    if (vs) std::memcpy(pair.data() + ps, v, vs);
    ps += vs;
    if (suffix) ttl::store_timestamp(pair.data() + ps, ttl.now);
    ps += suffix;

    size_t cur = 0;
    bool inserted = false;
    uint8_t* dst = upsert_row(m, rk.hash(i, m), rk.data(), rk.size(), ps, &cur, &inserted);
    if (inserted) {
      std::memcpy(dst, pair.data(), ps);
      continue;
    }
    // The insertion point: the first pair whose user key is not below this row's.
    size_t pos = 0, replace_end = 0;
    bool found = false;
    while (pos < cur) {
      size_t q = pos;
      const uint64_t kl = blob_varlen(dst, cur, &q, i);
      const int c = compare_bytes(dst + q, kl, uk.data(), uk.size());
      if (c > 0) break;
      q += kl;
      const uint64_t vl = blob_varlen(dst, cur, &q, i);
      q += vl;
      if (c == 0) {
        found = true;
        replace_end = q;
        break;
      }
      pos = q;
    }
    const size_t removed = found ? replace_end - pos : 0;
    if (found && removed == ps) {
      // Same layout: only the value bytes change, in place (dst is already writable).
      std::memcpy(dst + pos + value_at, pair.data() + value_at, ps - value_at);
      continue;
    }
    blob.assign(dst, dst + cur);
    const size_t tail = cur - pos - removed;
    uint8_t* out = m.put(rk.data(), rk.size(), cur - removed + ps);
    if (pos) std::memcpy(out, blob.data(), pos);
    std::memcpy(out + pos, pair.data(), ps);
    if (tail) std::memcpy(out + pos + ps, blob.data() + pos + removed, tail);
  }
}

}  // namespace statecore
