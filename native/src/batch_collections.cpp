// ListState append and MapState put kernels (contract: batch_collections.h). Same two passes as
// batch.cpp: validation touching no state, then one row at a time in row order through RowKeys.
// A list append writes the last chunk of the row's list (docs/formats.md "List state",
// list_chunks.h), a map put one entry per row ("Map state").
#include "statecore/batch_collections.h"

#include "batch_internal.h"
#include "statecore/list_chunks.h"

namespace statecore {
namespace {

using namespace batch_detail;

// Row i's stored bytes (docs/formats.md "Values"): fixed-width numbers serialized into tmp
// (8 bytes at most), fixed_size_binary/string/binary pointed to in the Arrow buffers.
inline const uint8_t* value_bytes(const ValueSpec& vt, const ArrayView& v, int64_t i, uint8_t* tmp,
                                  size_t* size) {
  switch (vt.type) {
    case ValueType::Int64:
    case ValueType::Timestamp:
      store_i64(tmp, v.int64_at(i));
      *size = 8;
      return tmp;
    case ValueType::UInt64:
      store_le64(tmp, v.uint64_at(i));
      *size = 8;
      return tmp;
    case ValueType::Float64:
      store_f64(tmp, v.float64_at(i));
      *size = 8;
      return tmp;
    case ValueType::Int32:
      store_i32(tmp, v.int32_at(i));
      *size = 4;
      return tmp;
    case ValueType::Bool:
      store_bool(tmp, v.bool_at(i));
      *size = 1;
      return tmp;
    case ValueType::FixedSizeBinary: *size = static_cast<size_t>(vt.width); return v.fixed_at(i);
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
  if (null_uk >= 0)
    fail("user_keys: null at " + row_str(null_uk) + " (map user keys must not be null)");
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
                       const ValueSpec& element_type, ArrowInput values_in, const TtlBatchSpec& ttl,
                       ListIndex* index) {
  check_spec(element_type);
  if (index == nullptr) fail("list_append_batch: the table's list index is required");
  const KeyArrays keys = make_keys(spec, keys_in);
  const ArrayView values = make_view(values_in, "values");
  const int32_t* kgs = validate_list(table, spec, keys, element_type, values, ttl);
  const int64_t n = keys.length();
  const bool var = !is_fixed(element_type);
  const size_t width = var ? 0 : value_width(element_type);
  const size_t suffix = ttl.enabled ? ttl::kTimestampBytes : 0;
  std::vector<uint8_t> key;   // the chunk's entry key: prefix | seq
  std::vector<uint8_t> elem;  // the row's element as a chunk holds it
  RowKeys rk(spec, keys, table, kgs);
  rk.skip_table_prefetch();  // a row looks up its chunk 0, prefetched by chunk0
  ListChunkAhead chunk0(rk, table, kgs, n);
  uint8_t tmp[8];
  uint8_t head[10];
  for (int64_t i = 0; i < n; ++i) {
    if (ttl.cleanup != nullptr) ttl::cleanup_row(*ttl.cleanup);
    rk.ahead(i);
    chunk0.ahead(i);
    rk.encode(i, kgs[i]);
    StateMap& m = table.map_unchecked(kgs[i]);
    RowKey c0{};
    const bool ahead = chunk0.get(i, &c0);
    const uint32_t h0 = c0.hash;
    size_t es = 0;
    const uint8_t* e = value_bytes(element_type, values, i, tmp, &es);
    const size_t hs = var ? put_varlen(head, es) : 0;
    elem.resize(hs + es + suffix);
    if (hs) std::memcpy(elem.data(), head, hs);
    if (es) std::memcpy(elem.data() + hs, e, es);
    if (suffix) ttl::store_timestamp(elem.data() + hs + es, ttl.now);
    const size_t end = elem.size();
    try {
      list_append_encoded(m, *index, kgs[i], rk.data(), rk.size(), elem.data(), &end, 1, width,
                          suffix, key, ahead ? &h0 : nullptr, ahead ? c0.data : nullptr);
    } catch (const std::invalid_argument&) {
      bad_blob(i);
    }
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
                   ArrowInput values_in, const TtlBatchSpec& ttl, CollectionIndex* index) {
  check_spec(value_type);
  const KeyArrays keys = make_keys(spec, keys_in);
  const KeyArrays uks = make_user_keys(user_key, user_keys_in);
  const ArrayView values = make_view(values_in, "values");
  const int32_t* kgs = validate_map(table, spec, keys, uks, value_type, values, ttl);
  const int64_t n = keys.length();
  const size_t suffix = ttl.enabled ? ttl::kTimestampBytes : 0;
  // int64 / timestamp user keys (the common case) skip the general serializer: ser(uk) is the 8
  // bytes big-endian (key_codec.h), written straight after the prefix.
  const ArrayView* int64_uks = nullptr;
  if (uks.scalar_column() && (user_key.columns[0].type == KeyType::Int64 ||
                              user_key.columns[0].type == KeyType::Timestamp))
    int64_uks = uks.scalar_column();
  std::vector<uint8_t> ek;  // the row's entry key when not built ahead: prefix | ser(uk)
  RowKeys rk(spec, keys, table, kgs);
  rk.skip_table_prefetch();  // a row looks up its entry, prefetched by entries
  auto user_key_suffix = [&](int64_t j, std::vector<uint8_t>& out) {
    if (int64_uks) {
      const uint64_t be = be64(static_cast<uint64_t>(int64_uks->int64_at(j)));
      const size_t at = out.size();
      out.resize(at + 8);
      std::memcpy(out.data() + at, &be, 8);
    } else {
      uks.append_ser(out, j);
    }
  };
  EntryKeysAhead<decltype(user_key_suffix)> entries(rk, table, kgs, n, user_key_suffix, index);
  // The index hashes prefixes as the table's maps do when it shares their hash function: then
  // the prefix hash RowKeys computed ahead is the index's too.
  const bool shared_hash =
      index != nullptr &&
      index->hash_function() == table.map_unchecked(table.kg_start()).engine().hash_fn;
  uint8_t tmp[8];
  for (int64_t i = 0; i < n; ++i) {
    if (ttl.cleanup != nullptr) ttl::cleanup_row(*ttl.cleanup);
    rk.ahead(i);
    entries.ahead(i);
    rk.encode(i, kgs[i]);
    StateMap& m = table.map_unchecked(kgs[i]);
    RowKey e{};
    uint32_t ph = 0;  // the prefix's index hash
    if (!entries.get(i, &e, &ph)) {
      ek.assign(rk.data(), rk.data() + rk.size());
      user_key_suffix(i, ek);
      e = RowKey{ek.data(), ek.size(), m.hash(ek.data(), ek.size())};
      if (index != nullptr) ph = shared_hash ? rk.hash(i, m) : index->hash(rk.data(), rk.size());
    }
    size_t vs = 0;
    const uint8_t* v = value_bytes(value_type, values, i, tmp, &vs);
    size_t cur = 0;
    bool inserted = false;
    uint8_t* out = upsert_row(m, e.hash, e.data, e.size, vs + suffix, &cur, &inserted);
    if (!inserted && cur != vs + suffix) out = m.put(e.data, e.size, vs + suffix);
    if (vs) std::memcpy(out, v, vs);
    if (suffix) ttl::store_timestamp(out + vs, ttl.now);
    // Without TTL the index is exact: an overwrite is listed already, a new entry is not. With
    // TTL a user key still listed but without an entry (gone without the index being told, a
    // cleanup step that failed part way) is a new entry: it goes last.
    if (index != nullptr && (inserted || ttl.enabled)) {
      const uint8_t* member = e.data + rk.size();
      const size_t ms = e.size - rk.size();
      if (inserted && ttl.enabled)
        index->erase_hashed(kgs[i], ph, rk.data(), rk.size(), member, ms);
      index->insert_hashed(kgs[i], ph, rk.data(), rk.size(), member, ms);
    }
  }
}

}  // namespace statecore
