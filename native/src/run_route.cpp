#include "statecore/run_route.h"

#include <algorithm>
#include <cstring>

#include "statecore/block_codec.h"
#include "statecore/sorted_run.h"

namespace statecore {

void route_to_blocks(const RouteGroup* groups, size_t group_count, int64_t kg_base,
                     const int64_t* block_key_offsets, const uint8_t* block_key_data,
                     const RouteKeys& keys, const int64_t* rows, size_t n, int64_t* out,
                     RouteCounts* counts) noexcept {
  // The filter probes of key i + kAhead are prefetched while key i is routed: a run's filters
  // together outgrow the caches, and a key the run holds reads every probe.
  constexpr size_t kAhead = 8;
  const auto prefetch = [&](size_t i) {
    const int64_t r = rows[i];
    const int64_t g = keys.key_groups[r] - kg_base;
    if (g < 0 || static_cast<uint64_t>(g) >= group_count) return;
    const RouteGroup& grp = groups[g];
    if (grp.filter != nullptr && grp.block_count >= 0)
      BloomShape(grp.filter_bytes, grp.hashes).prefetch(grp.filter, keys.hashes[r]);
  };
  for (size_t i = 0; i < std::min(n, kAhead); ++i) prefetch(i);
  for (size_t i = 0; i < n; ++i) {
    if (i + kAhead < n) prefetch(i + kAhead);
    const int64_t r = rows[i];
    const int64_t g = keys.key_groups[r] - kg_base;
    out[i] = -1;
    if (g < 0 || static_cast<uint64_t>(g) >= group_count) continue;
    const RouteGroup& grp = groups[g];
    if (grp.block_count < 0) continue;
    if (grp.filter != nullptr &&
        !bloom_may_contain(grp.filter, grp.filter_bytes, grp.hashes, keys.hashes[r])) {
      ++counts->filter_negatives;
      continue;
    }
    const uint8_t* q = keys.data + keys.offsets[r];
    const size_t ql = static_cast<size_t>(keys.offsets[r + 1] - keys.offsets[r]);
    // The first block whose last key is >= the key.
    int64_t lo = 0, hi = grp.block_count;
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      const int64_t b = grp.first_block + mid;
      const int64_t a = block_key_offsets[b];
      const size_t len = static_cast<size_t>(block_key_offsets[b + 1] - a);
      if (key_compare(ByteView{block_key_data + a, len}, ByteView{q, ql}) < 0) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    if (lo == grp.block_count) {
      ++counts->range_negatives;
      continue;
    }
    out[i] = grp.first_block + lo;
  }
}

}  // namespace statecore
