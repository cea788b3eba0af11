#include "statecore/tiered_batch.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "batch_internal.h"
#include "statecore/hash.h"

namespace statecore {

using batch_detail::fail;
using batch_detail::for_rows;
using batch_detail::kernel_get;
using batch_detail::Lanes;
using batch_detail::make_keys;
using batch_detail::RowKey;
using batch_detail::RowKeys;
using batch_detail::validate_keys;

namespace {

// The keys appended so far, by hash: open addressing over their indices, so that a key met
// again (hot keys repeat within a batch) is appended once.
class SeenKeys {
 public:
  explicit SeenKeys(int64_t rows) {
    size_t cap = 16;
    while (cap < 2 * static_cast<size_t>(rows)) cap <<= 1;
    slots_.assign(cap, 0);
  }
  // True when the key was not seen before; it is then recorded as key `index` (its bytes
  // data[off[index], off[index + 1]) once appended).
  bool insert(const uint8_t* key, size_t size, uint32_t index, const std::vector<int32_t>& off,
              const std::vector<uint8_t>& data) {
    const size_t mask = slots_.size() - 1;
    for (size_t at = xxh64(key, size, 0) & mask;; at = (at + 1) & mask) {
      const uint32_t s = slots_[at];
      if (s == 0) {
        slots_[at] = index + 1;
        return true;
      }
      const size_t a = static_cast<size_t>(off[s - 1]);
      const size_t len = static_cast<size_t>(off[s]) - a;
      if (len == size && (size == 0 || std::memcmp(data.data() + a, key, size) == 0)) return false;
    }
  }

 private:
  std::vector<uint32_t> slots_;  // 0: empty; else 1 + the key's index among the appended
};

}  // namespace

void batch_encoded_keys(StateTable& table, const BatchKeySpec& spec, ArrowInput keys_in,
                        const uint8_t* rows, bool only_absent, std::vector<int32_t>* offsets,
                        std::vector<uint8_t>* data) {
  const KeyArrays keys = make_keys(spec, keys_in);
  const int32_t* kgs = validate_keys(table, spec, keys);
  const int64_t n = keys.length();
  if (offsets->empty()) offsets->push_back(0);
  SeenKeys seen(n);  // keys appended by earlier calls are not looked at
  // The read kernels' row loop and probe (get_batch_fixed): a flat map's slot is found from its
  // read lane's geometry and prefetched a group ahead through it; StateMap::get would hash the
  // key again and walk map, engine, directory and page for every row, a dependent load each.
  Lanes lanes(table);
  RowKeys rk(spec, keys, table, kgs);
  for_rows(rk, table, lanes, kgs, n, [&](int64_t i, int32_t kg, const RowKey& k) SC_INLINE_ROW {
    if (rows != nullptr && rows[i] == 0) return;
    if (only_absent) {
      ByteView v;
      const detail::FlatLane* ln = lanes.get(kg, k.data, k.size, 0, false);
      if (ln ? ln->get(k.hash, k.data, k.size) != nullptr
             : kernel_get(table.map_unchecked(kg), k.hash, k.data, k.size, &v))
        return;
    }
    const auto index = static_cast<uint32_t>(offsets->size() - 1);
    if (!seen.insert(k.data, k.size, index, *offsets, *data)) return;
    if (data->size() + k.size > static_cast<size_t>(std::numeric_limits<int32_t>::max()))
      fail("the encoded keys of a batch exceed an Arrow binary array (2 GiB)");
    data->insert(data->end(), k.data, k.data + k.size);
    offsets->push_back(static_cast<int32_t>(data->size()));
  });
}

size_t load_clean_batch(StateTable& table, const int32_t* kgs, const int32_t* key_offsets,
                        const uint8_t* key_data, const int32_t* value_offsets,
                        const uint8_t* value_data, const uint8_t* validity, int64_t validity_offset,
                        size_t n) {
  // Rows hashed and prefetched ahead of the one inserted: far enough for the slot's cache line
  // to arrive, near enough to stay in cache (the kernels' RowKeys group is 16 rows).
  constexpr size_t kAhead = 16;
  std::vector<uint32_t> hashes(n);
  auto key = [&](size_t i) { return key_data + key_offsets[i]; };
  auto key_size = [&](size_t i) {
    return static_cast<size_t>(key_offsets[i + 1] - key_offsets[i]);
  };
  for (size_t i = 0; i < n; ++i) hashes[i] = table.map(kgs[i]).hash(key(i), key_size(i));
  for (size_t i = 0; i < std::min(n, kAhead); ++i) table.map(kgs[i]).prefetch_bucket(hashes[i]);
  size_t inserted = 0;
  for (size_t i = 0; i < n; ++i) {
    if (i + kAhead < n) table.map(kgs[i + kAhead]).prefetch_bucket(hashes[i + kAhead]);
    const int64_t bit = validity_offset + static_cast<int64_t>(i);
    if (validity != nullptr && !((validity[bit >> 3] >> (bit & 7)) & 1)) continue;
    inserted += table.map(kgs[i]).insert_clean(key(i), key_size(i), value_data + value_offsets[i],
                                               value_offsets[i + 1] - value_offsets[i]);
  }
  return inserted;
}

}  // namespace statecore
