// Collection read / removal kernels and clear (contract: batch_reads.h). Same two passes as
// batch.cpp: validation touching no state, then one row at a time in row order through RowKeys.
// A map row reads or removes one entry, `encoded key | ser(user key)` (docs/formats.md "Map
// state"); a list row reads the chunks `encoded key | seq` of its list ("List state",
// list_chunks.h).
#include "statecore/batch_reads.h"

#include "batch_internal.h"

namespace statecore {
namespace {

using namespace batch_detail;

// Bytes one fixed-width element / value takes in the Arrow-layout output (bool: a 0/1 byte).
size_t out_width(const ValueSpec& t) { return t.type == ValueType::Bool ? 1 : value_width(t); }

[[noreturn]] void short_ttl_value(int64_t row, size_t size) {
  fail(row_str(row) + ": the stored value holds " + std::to_string(size) +
       " bytes, too few for the 8-byte TTL timestamp (was the state written without TTL?)");
}

struct MapKeys {
  KeyArrays keys;
  KeyArrays user_keys;
  const int32_t* kgs;
};

// ser(user_keys[i]) into uk. int64 user keys (8 bytes big-endian, key_codec.h) are written in
// place: the general append_ser would cost more than the rest of a map_get_batch row.
inline void user_key_ser(const KeyArrays& uks, const ArrayView* i64, int64_t i,
                         std::vector<uint8_t>& uk) {
  if (i64 != nullptr) {
    const uint64_t b = be64(static_cast<uint64_t>(i64->int64_at(i)));
    uk.resize(8);
    std::memcpy(uk.data(), &b, 8);
    return;
  }
  uk.clear();
  uks.append_ser(uk, i);
}

// The scalar column of int64 user keys, else null (user_key_ser's general path).
inline const ArrayView* int64_user_keys(const KeySchema& schema, const KeyArrays& uks) {
  const ArrayView* col = uks.scalar_column();
  return col != nullptr && schema.columns[0].type == KeyType::Int64 ? col : nullptr;
}

MapKeys validate_map_keys(StateTable& table, const BatchKeySpec& spec, ArrowInput keys_in,
                          const KeySchema& user_key, ArrowInput user_keys_in,
                          const TtlBatchSpec& ttl) {
  KeyArrays keys = make_keys(spec, keys_in);
  KeyArrays uks = make_user_keys(user_key, user_keys_in);
  if (uks.length() != keys.length())
    fail("user_keys: length " + std::to_string(uks.length()) + " differs from keys length " +
         std::to_string(keys.length()));
  const int64_t null_uk = uks.first_null(nullptr);
  if (null_uk >= 0)
    fail("user_keys: null at " + row_str(null_uk) + " (map user keys must not be null)");
  check_ttl(ttl);
  const int32_t* kgs = validate_keys(table, spec, keys);
  return MapKeys{std::move(keys), std::move(uks), kgs};
}

// The entry key of row i: the row's encoded key (rk) followed by ser(user key) (docs/formats.md
// "Map state").
inline void entry_key(const RowKeys& rk, const std::vector<uint8_t>& uk, std::vector<uint8_t>& ek) {
  ek.assign(rk.data(), rk.data() + rk.size());
  ek.insert(ek.end(), uk.begin(), uk.end());
}

// One map read of row i (`TableMapState.get` / `TtlMapState._read_one`): emit(user value bytes,
// size) runs before any mutation; returns whether a value is shown. `width`: the exact stored
// width of a fixed-width value type without the timestamp, 0 for String/Binary. An expired
// entry is removed and unlisted from `index` (when given).
template <class Emit>
bool map_read_row(StateMap& m, int32_t kg, const RowKeys& rk, int64_t i,
                  const std::vector<uint8_t>& ek, size_t width, const TtlBatchSpec& ttl,
                  int64_t* expired, CollectionIndex* index, Emit emit) {
  ByteView v;
  if (!kernel_get(m, m.hash(ek.data(), ek.size()), ek.data(), ek.size(), &v)) return false;
  const size_t suffix = ttl.enabled ? ttl::kTimestampBytes : 0;
  if (width != 0 && v.size != width + suffix) wrong_width(i, v.size, width + suffix);
  if (!ttl.enabled) {
    emit(v.data, v.size);
    return true;
  }
  if (v.size < suffix) short_ttl_value(i, v.size);
  const size_t user = v.size - suffix;
  if (ttl::expired(ttl::load_timestamp(v.data + user), ttl.ttl_ms, ttl.now)) {
    if (ttl.return_expired) emit(v.data, user);
    m.remove(ek.data(), ek.size());
    if (index != nullptr)
      index->erase(kg, rk.data(), rk.size(), ek.data() + rk.size(), ek.size() - rk.size());
    ++*expired;
    return ttl.return_expired;
  }
  emit(v.data, user);
  if (ttl.update_on_read) {
    // Always written (the per-record path puts the entry back): it counts as changed.
    size_t sz = 0;
    uint8_t* p = m.get_for_update(ek.data(), ek.size(), &sz);
    ttl::store_timestamp(p + user, ttl.now);
  }
  return true;
}

// Shared by map_get_batch and map_contains_batch: row i's result goes through on_row(i, row's
// user value bytes or null, size).
template <class OnRow>
void map_read_batch(StateTable& table, const BatchKeySpec& spec, ArrowInput keys_in,
                    const KeySchema& user_key, ArrowInput user_keys_in, const ValueSpec& vt,
                    const TtlBatchSpec& ttl, int64_t* expired_out, CollectionIndex* index,
                    OnRow on_row) {
  int64_t local = 0;
  int64_t* expired = expired_sink(expired_out, &local);
  check_spec(vt);
  const MapKeys mk = validate_map_keys(table, spec, keys_in, user_key, user_keys_in, ttl);
  const int64_t n = mk.keys.length();
  const size_t width = value_width(vt);
  std::vector<uint8_t> uk, ek;
  const ArrayView* uk_i64 = int64_user_keys(user_key, mk.user_keys);
  RowKeys rk(spec, mk.keys, table, mk.kgs);
  for (int64_t i = 0; i < n; ++i) {
    if (ttl.cleanup != nullptr) ttl::cleanup_row(*ttl.cleanup);
    rk.ahead(i);
    rk.encode(i, mk.kgs[i]);
    user_key_ser(mk.user_keys, uk_i64, i, uk);
    entry_key(rk, uk, ek);
    StateMap& m = table.map_unchecked(mk.kgs[i]);
    const bool shown = map_read_row(m, mk.kgs[i], rk, i, ek, width, ttl, expired, index,
                                    [&](const uint8_t* p, size_t s) { on_row(i, p, s); });
    if (!shown) on_row(i, nullptr, 0);
  }
}

struct Element {
  size_t start, size;
  int64_t ts;
};

// Parses a list chunk (list_chunks.h) into element spans; bad_blob(row) when it does not parse
// (a fixed-width chunk not a whole number of elements, a varlen or an element running past the
// end).
void parse_chunk(const uint8_t* blob, size_t size, size_t width, size_t suffix, int64_t row,
                 std::vector<Element>& out) {
  out.clear();
  size_t pos = 0;
  while (pos < size) {
    size_t len = width;
    if (width == 0) len = blob_varlen(blob, size, &pos, row);
    if (len > size - pos || suffix > size - pos - len) bad_blob(row);
    out.push_back(Element{pos, len, suffix ? ttl::load_timestamp(blob + pos + len) : 0});
    pos += len + suffix;
  }
}

void check_key_batch(StateTable& table, const BatchKeySpec& spec, const KeyArrays& keys,
                     const TtlBatchSpec& ttl, const int32_t** kgs) {
  check_ttl(ttl);
  *kgs = validate_keys(table, spec, keys);
}

}  // namespace

void validate_key_batch(StateTable& table, const BatchKeySpec& spec, ArrowInput keys_in,
                        const TtlBatchSpec& ttl) {
  const KeyArrays keys = make_keys(spec, keys_in);
  const int32_t* kgs = nullptr;
  check_key_batch(table, spec, keys, ttl, &kgs);
}

void validate_map_key_batch(StateTable& table, const BatchKeySpec& spec, ArrowInput keys_in,
                            const KeySchema& user_key, ArrowInput user_keys_in,
                            const TtlBatchSpec& ttl) {
  validate_map_keys(table, spec, keys_in, user_key, user_keys_in, ttl);
}

void clear_batch(StateTable& table, const BatchKeySpec& spec, ArrowInput keys_in,
                 CollectionIndex* index, ListIndex* list_index, ttl::IncrementalCleanup* cleanup) {
  const KeyArrays keys = make_keys(spec, keys_in);
  const int32_t* kgs = nullptr;
  check_key_batch(table, spec, keys, TtlBatchSpec(), &kgs);
  const int64_t n = keys.length();
  RowKeys rk(spec, keys, table, kgs);
  std::vector<uint8_t> ek;
  for (int64_t i = 0; i < n; ++i) {
    if (cleanup != nullptr) ttl::cleanup_row(*cleanup);
    rk.ahead(i);
    rk.encode(i, kgs[i]);
    StateMap& m = table.map_unchecked(kgs[i]);
    if (list_index != nullptr) {
      // A list: every chunk it has (list_index.h: chunk 0 of an unlisted list).
      ek.assign(rk.data(), rk.data() + rk.size());
      ek.resize(rk.size() + kListSeqBytes);
      for (uint64_t seq : list_index->take(kgs[i], rk.data(), rk.size())) {
        store_list_seq(ek.data() + rk.size(), seq);
        m.remove(ek.data(), ek.size());
      }
      continue;
    }
    if (index == nullptr) {
      m.remove(rk.data(), rk.size());
      continue;
    }
    // A map: every entry its index lists for the row's (key, namespace).
    for (const std::string& member : index->take(kgs[i], rk.data(), rk.size())) {
      ek.assign(rk.data(), rk.data() + rk.size());
      ek.insert(ek.end(), member.begin(), member.end());
      m.remove(ek.data(), ek.size());
    }
  }
}

void list_get_batch(StateTable& table, const BatchKeySpec& spec, ArrowInput keys_in,
                    const ValueSpec& et, std::vector<int64_t>& list_offsets,
                    std::vector<uint8_t>& elements, std::vector<int64_t>& element_offsets,
                    const TtlBatchSpec& ttl, int64_t* expired_out, ListIndex* index) {
  int64_t local = 0;
  int64_t* expired = expired_sink(expired_out, &local);
  check_spec(et);
  if (index == nullptr) fail("list_get_batch: the table's list index is required");
  if (list_offsets.empty() || (!is_fixed(et) && element_offsets.empty()))
    fail("list_get_batch: the offsets outputs must hold their running start (e.g. {0})");
  const KeyArrays keys = make_keys(spec, keys_in);
  const int32_t* kgs = nullptr;
  check_key_batch(table, spec, keys, ttl, &kgs);
  const int64_t n = keys.length();
  const size_t width = value_width(et), ow = out_width(et);
  const size_t suffix = ttl.enabled ? ttl::kTimestampBytes : 0;
  int64_t count = list_offsets.back();  // elements written so far (earlier chunks included)
  // Without TTL a fixed-width chunk other than bool is the elements' Arrow buffer itself on a
  // little-endian host (stored values are little-endian, docs/formats.md "Values").
  const bool raw_copy = !ttl.enabled && width != 0 && et.type != ValueType::Bool && le64(1) == 1;
  list_offsets.reserve(list_offsets.size() + static_cast<size_t>(n));
  std::vector<uint64_t> seqs, gone;
  std::vector<uint32_t> hashes;
  std::vector<uint8_t> ek;
  std::vector<Element> els;
  std::vector<uint8_t> rebuilt;
  constexpr size_t kPrefetch = 8;
  RowKeys rk(spec, keys, table, kgs);
  rk.skip_table_prefetch();  // a row looks up its chunks, chunk 0 prefetched by chunk0
  ListChunkAhead chunk0(rk, table, kgs, n);
  RowKey c0{};
  auto emit = [&](const uint8_t* blob, const Element& e) {
    if (width != 0) {
      const size_t at = elements.size();
      elements.resize(at + ow);
      out_fixed(et, elements.data() + at, 0, blob + e.start);
    } else {
      elements.insert(elements.end(), blob + e.start, blob + e.start + e.size);
      element_offsets.push_back(static_cast<int64_t>(elements.size()));
    }
    ++count;
  };
  for (int64_t i = 0; i < n; ++i) {
    if (ttl.cleanup != nullptr) ttl::cleanup_row(*ttl.cleanup);
    rk.ahead(i);
    chunk0.ahead(i);
    rk.encode(i, kgs[i]);
    StateMap& m = table.map_unchecked(kgs[i]);
    // `TableListState.get` / `TtlListState.get`: each chunk of the list in order (chunk 0 of an
    // unlisted list); a listed chunk whose entry is gone without the index being told (with
    // TTL) is unlisted.
    index->chunks(kgs[i], rk.data(), rk.size(), seqs);
    gone.clear();
    ek.assign(rk.data(), rk.data() + rk.size());
    ek.resize(rk.size() + kListSeqBytes);
    // A long list's chunks are scattered over the table: hash them all first and prefetch
    // kPrefetch ahead, so the lookups overlap their cache misses. Chunk 0 was hashed (and
    // prefetched) a group ahead.
    hashes.resize(seqs.size());
    for (size_t j = 0; j < seqs.size(); ++j) {
      if (seqs[j] == 0 && chunk0.get(i, &c0)) {
        hashes[j] = c0.hash;
        continue;
      }
      store_list_seq(ek.data() + rk.size(), seqs[j]);
      hashes[j] = m.hash(ek.data(), ek.size());
    }
    if (seqs.size() > 1)
      for (size_t j = 0; j < seqs.size() && j < kPrefetch; ++j) m.prefetch_bucket(hashes[j]);
    // Chunk 0 is looked up with the key built ahead: a compare of ek's bytes just written by
    // narrower stores would stall until the stores complete.
    const uint8_t* k0 = chunk0.get(i, &c0) ? c0.data : nullptr;
    for (size_t j = 0; j < seqs.size(); ++j) {
      if (j + kPrefetch < seqs.size()) m.prefetch_bucket(hashes[j + kPrefetch]);
      const uint64_t seq = seqs[j];
      store_list_seq(ek.data() + rk.size(), seq);
      ByteView v;
      const uint8_t* k = seq == 0 && k0 != nullptr ? k0 : ek.data();
      if (!kernel_get(m, hashes[j], k, ek.size(), &v)) {
        gone.push_back(seq);
        continue;
      }
      if (raw_copy) {
        // Stored = Arrow layout: the whole chunk at once rather than element by element.
        if (v.size % width != 0) bad_blob(i);
        elements.insert(elements.end(), v.data, v.data + v.size);
        count += static_cast<int64_t>(v.size / width);
        continue;
      }
      parse_chunk(v.data, v.size, width, suffix, i, els);
      if (!ttl.enabled) {
        for (const Element& e : els) emit(v.data, e);
        continue;
      }
      size_t live = 0;
      for (const Element& e : els) {
        const bool dead = ttl::expired(e.ts, ttl.ttl_ms, ttl.now);
        live += !dead;
        if (!dead || ttl.return_expired) emit(v.data, e);
      }
      const size_t dead = els.size() - live;
      if (dead != 0) {
        *expired += static_cast<int64_t>(dead);
        if (live == 0) {
          m.remove(ek.data(), ek.size());
          gone.push_back(seq);
        } else {
          // The unexpired elements, framed as stored, restamped under update_on_read.
          rebuilt.clear();
          uint8_t head[10];
          for (const Element& e : els) {
            if (ttl::expired(e.ts, ttl.ttl_ms, ttl.now)) continue;
            if (width == 0) rebuilt.insert(rebuilt.end(), head, head + put_varlen(head, e.size));
            rebuilt.insert(rebuilt.end(), v.data + e.start, v.data + e.start + e.size + suffix);
            if (ttl.update_on_read)
              ttl::store_timestamp(rebuilt.data() + rebuilt.size() - suffix, ttl.now);
          }
          uint8_t* out = m.put(ek.data(), ek.size(), rebuilt.size());
          std::memcpy(out, rebuilt.data(), rebuilt.size());
        }
      } else if (ttl.update_on_read) {
        // Every element renewed in place (the per-record path puts the chunk back).
        size_t sz = 0;
        uint8_t* p = m.get_for_update(ek.data(), ek.size(), &sz);
        for (const Element& e : els) ttl::store_timestamp(p + e.start + e.size, ttl.now);
      }
    }
    for (uint64_t seq : gone) index->erase(kgs[i], rk.data(), rk.size(), seq);
    list_offsets.push_back(count);
  }
}

void map_get_batch(StateTable& table, const BatchKeySpec& spec, ArrowInput keys,
                   const KeySchema& user_key, ArrowInput user_keys, const ValueSpec& vt,
                   const MapGetOutput& out, const TtlBatchSpec& ttl, int64_t* expired,
                   CollectionIndex* index) {
  check_spec(vt);
  const bool fixed = is_fixed(vt);
  const bool has_rows = keys.array != nullptr && keys.array->length > 0;
  if (has_rows &&
      (out.valid == nullptr || (fixed && out.fixed == nullptr) ||
       (!fixed && (out.offsets == nullptr || out.data == nullptr || out.offsets->empty()))))
    fail("map_get_batch: missing output buffers for value type " + value_type_name(vt));
  map_read_batch(table, spec, keys, user_key, user_keys, vt, ttl, expired, index,
                 [&](int64_t i, const uint8_t* p, size_t s) {
                   out.valid[i] = p != nullptr;
                   if (fixed) {
                     out_fixed(vt, out.fixed, i, p);
                     return;
                   }
                   if (p) out.data->insert(out.data->end(), p, p + s);
                   out.offsets->push_back(static_cast<int64_t>(out.data->size()));
                 });
}

void map_contains_batch(StateTable& table, const BatchKeySpec& spec, ArrowInput keys,
                        const KeySchema& user_key, ArrowInput user_keys, const ValueSpec& vt,
                        uint8_t* found, const TtlBatchSpec& ttl, int64_t* expired,
                        CollectionIndex* index) {
  if (found == nullptr && keys.array != nullptr && keys.array->length > 0)
    fail("map_contains_batch: missing output buffer");
  map_read_batch(table, spec, keys, user_key, user_keys, vt, ttl, expired, index,
                 [&](int64_t i, const uint8_t* p, size_t) { found[i] = p != nullptr; });
}

void map_remove_batch(StateTable& table, const BatchKeySpec& spec, ArrowInput keys_in,
                      const KeySchema& user_key, ArrowInput user_keys_in, CollectionIndex* index,
                      ttl::IncrementalCleanup* cleanup) {
  const MapKeys mk =
      validate_map_keys(table, spec, keys_in, user_key, user_keys_in, TtlBatchSpec());
  const int64_t n = mk.keys.length();
  std::vector<uint8_t> uk, ek;
  const ArrayView* uk_i64 = int64_user_keys(user_key, mk.user_keys);
  RowKeys rk(spec, mk.keys, table, mk.kgs);
  for (int64_t i = 0; i < n; ++i) {
    if (cleanup != nullptr) ttl::cleanup_row(*cleanup);
    rk.ahead(i);
    rk.encode(i, mk.kgs[i]);
    user_key_ser(mk.user_keys, uk_i64, i, uk);
    entry_key(rk, uk, ek);
    if (table.map_unchecked(mk.kgs[i]).remove(ek.data(), ek.size()) && index != nullptr)
      index->erase(mk.kgs[i], rk.data(), rk.size(), uk.data(), uk.size());
  }
}

}  // namespace statecore
