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

// Offsets o[0..n] non-negative, non-decreasing and within `size` bytes: the loop below reads
// through them unchecked.
void check_offsets(const int32_t* o, int64_t n, size_t size, const char* what) {
  if (n == 0) return;
  bool ok = o[0] >= 0;
  for (int64_t i = 0; ok && i < n; ++i) ok = o[i + 1] >= o[i];
  if (!ok || static_cast<size_t>(o[n]) > size)
    throw std::invalid_argument(std::string(what) +
                                " offsets are negative, decreasing or past their data");
}

void check(const StateTable& table, const Entries& e, int64_t n) {
  check_offsets(e.r.key_offsets, n, e.r.key_data_size, "key");
  check_offsets(e.r.value_offsets, n, e.r.value_data_size, "value");
  int32_t prev = table.kg_start();
  for (int64_t i = 0; i < n; ++i) {
    if (e.key_size(i) <= static_cast<size_t>(e.pw))
      throw std::invalid_argument("entry " + std::to_string(i) +
                                  ": its encoded key is not longer than the " +
                                  std::to_string(e.pw) + "-byte key-group prefix");
    const int32_t kg = e.kg(i);
    if (kg < prev || kg > table.kg_end())
      throw std::invalid_argument("entry " + std::to_string(i) + ": key-group prefix " +
                                  std::to_string(kg) + " is outside [" +
                                  std::to_string(table.kg_start()) + ", " +
                                  std::to_string(table.kg_end()) +
                                  "] or below the entry before it (entries must be sorted by "
                                  "key group)");
    prev = kg;
  }
}

}  // namespace

void load_entries(StateTable& table, const ArrowBinaryRun& run, int prefix_bytes) {
  if (prefix_bytes != 1 && prefix_bytes != 2)
    throw std::invalid_argument("prefix_bytes must be 1 or 2, got " + std::to_string(prefix_bytes));
  const Entries e{run, prefix_bytes};
  const int64_t n = static_cast<int64_t>(run.size);
  check(table, e, n);
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
