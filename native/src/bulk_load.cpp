// Bulk load of encoded entries (design: bulk_load.h).
#include "statecore/bulk_load.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "batch_internal.h"
#include "statecore/detail/bytes.h"

namespace statecore {

namespace {

using batch_detail::kernel_put;
using batch_detail::Lanes;
using batch_detail::RowKey;

constexpr int64_t kAhead = 16;  // a power of two: ring positions are masked

struct Entries {
  const ArrowBinaryRun& r;
  int pw;

  const uint8_t* key(int64_t i) const { return r.key_data + r.key_offsets[i]; }
  size_t key_size(int64_t i) const {
    return static_cast<size_t>(r.key_offsets[i + 1] - r.key_offsets[i]);
  }
  int32_t kg(int64_t i) const {
    const uint8_t* k = key(i);
    return pw == 1 ? int32_t{k[0]} : (int32_t{k[0]} << 8) | int32_t{k[1]};
  }
  bool removed(int64_t i) const {
    if (r.validity == nullptr) return false;
    const uint64_t bit = static_cast<uint64_t>(r.validity_bit + i);
    return ((r.validity[bit >> 3] >> (bit & 7)) & 1) == 0;
  }
};

}  // namespace

std::string check_entries(const ArrowBinaryRun& run, int32_t kg_lo, int32_t kg_hi, int prefix_bytes,
                          int64_t value_width, bool tombstones) {
  if (prefix_bytes != 1 && prefix_bytes != 2)
    throw std::invalid_argument("prefix_width must be 1 or 2, got " + std::to_string(prefix_bytes));
  const int64_t n = static_cast<int64_t>(run.size);
  const int64_t bad_key = first_bad_offset(run.key_offsets, run.size, run.key_data_size);
  const int64_t bad_value = first_bad_offset(run.value_offsets, run.size, run.value_data_size);
  if (bad_key >= 0 || bad_value >= 0)
    return std::string(bad_key >= 0 ? "keys" : "values") + ": offset " +
           std::to_string(bad_key >= 0 ? bad_key : bad_value) +
           " is negative, below the one before it or past the data buffer";
  const Entries e{run, prefix_bytes};
  const std::string at = "entry ";
  int32_t prev = kg_lo;
  for (int64_t i = 0; i < n; ++i) {
    if (e.key_size(i) <= static_cast<size_t>(prefix_bytes))
      return at + std::to_string(i) + ": its encoded key is not longer than the " +
             std::to_string(prefix_bytes) + "-byte key-group prefix";
    const int32_t kg = e.kg(i);
    if (kg < prev || kg > kg_hi)
      return at + std::to_string(i) + ": key-group prefix " + std::to_string(kg) + " is outside [" +
             std::to_string(kg_lo) + ", " + std::to_string(kg_hi) +
             "] or below the entry before it (entries must be sorted by key group)";
    prev = kg;
    const int64_t vs = run.value_offsets[i + 1] - run.value_offsets[i];
    if (e.removed(i)) {
      if (!tombstones)
        return at + std::to_string(i) + ": a NULL value (tombstone) where values must be non-null";
    } else if (value_width >= 0 && vs != value_width) {
      return at + std::to_string(i) + ": value is " + std::to_string(vs) +
             " bytes, the state's values are " + std::to_string(value_width);
    }
  }
  return "";
}

void load_entries(StateTable& table, const ArrowBinaryRun& run, int prefix_bytes) {
  const std::string bad =
      check_entries(run, table.kg_start(), table.kg_end(), prefix_bytes, -1, true);
  if (!bad.empty()) throw std::invalid_argument(bad);
  const Entries e{run, prefix_bytes};
  const int64_t n = static_cast<int64_t>(run.size);
  if (n == 0) return;
  const KeyHashFunction hash_fn = table.map_unchecked(table.kg_start()).engine().hash_fn;
  Lanes lanes(table);
  uint32_t ahead[kAhead];
  for (int64_t start = 0; start < n;) {
    const int32_t kg = e.kg(start);
    int64_t end = start + 1;
    while (end < n && e.kg(end) == kg) ++end;
    StateMap& m = table.map_unchecked(kg);
    m.reserve(static_cast<size_t>(end - start));  // a no-op unless the map is empty
    m.give_up_write_log();
    auto hash_and_prefetch = [&](int64_t i) {
      const uint32_t h = detail::map_key_hash(hash_fn, e.key(i), e.key_size(i));
      if (!lanes.view().prefetch(kg, h)) m.prefetch_bucket(h);
      return h;
    };
    for (int64_t j = start; j < std::min(end, start + kAhead); ++j)
      ahead[j & (kAhead - 1)] = hash_and_prefetch(j);
    for (int64_t i = start; i < end; ++i) {
      const uint32_t h = ahead[i & (kAhead - 1)];
      if (i + kAhead < end) ahead[(i + kAhead) & (kAhead - 1)] = hash_and_prefetch(i + kAhead);
      const uint8_t* key = e.key(i);
      const size_t ks = e.key_size(i);
      if (e.removed(i)) {
        m.remove(key, ks);
        lanes.close(kg);
        continue;
      }
      const size_t vs = static_cast<size_t>(run.value_offsets[i + 1] - run.value_offsets[i]);
      if (vs == 0) {  // a lane takes vs == 0 as "any value size": not for an empty value
        lanes.close(kg);
        size_t cur = 0;
        bool inserted = false;
        m.upsert(h, key, ks, 0, &cur, &inserted);
        if (cur != 0) m.put(key, ks, 0);
        continue;
      }
      uint8_t* dst = kernel_put(table, lanes, kg, RowKey{key, ks, h}, vs);
      detail::copy_small(dst, run.value_data + run.value_offsets[i], vs);
    }
    start = end;
  }
}

}  // namespace statecore
