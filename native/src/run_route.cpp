#include "statecore/run_route.h"

#include <algorithm>
#include <cstring>

#include "statecore/block_codec.h"

namespace statecore {

namespace {

// Byte-wise order of a[0, al) against b[0, bl): < 0, 0 or > 0.
int compare_bytes(const uint8_t* a, size_t al, const uint8_t* b, size_t bl) noexcept {
  const size_t m = std::min(al, bl);
  const int c = m ? std::memcmp(a, b, m) : 0;
  if (c != 0) return c;
  return (al > bl) - (al < bl);
}

}  // namespace

void route_to_blocks(const RouteGroup* groups, size_t group_count, int64_t kg_base,
                     const int64_t* block_key_offsets, const uint8_t* block_key_data,
                     const RouteKeys& keys, const int64_t* rows, size_t n, int64_t* out,
                     RouteCounts* counts) noexcept {
  for (size_t i = 0; i < n; ++i) {
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
      if (compare_bytes(block_key_data + a, len, q, ql) < 0) {
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
