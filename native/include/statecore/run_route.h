// Routing a batch of encoded keys to their candidate blocks in one run of a checkpoint version,
// for the run lookups of the tiered mode (statecore.checkpoint.lookup): per key, the Bloom
// filter of its (state, key group) in the run, then the one block whose key range can hold it,
// the first whose footer last key is >= the key (docs/formats.md "Filters and block keys"). One
// call per run and batch, where a loop over key groups would cost one filter probe call and one
// block search call per (run, key group).
#pragma once
#include <cstddef>
#include <cstdint>

namespace statecore {

// One (state, key group) of a run as the router sees it.
struct RouteGroup {
  // The (state, key group)'s Bloom filter (`filter_bytes` bytes, `hashes` probes); null: no
  // filter to probe, every key passes.
  const uint8_t* filter = nullptr;
  size_t filter_bytes = 0;
  uint32_t hashes = 0;
  // Its blocks [first_block, first_block + block_count) of the file; block_count < 0: the run
  // holds no entry of the key group.
  int64_t first_block = 0;
  int64_t block_count = -1;
};

// Keys the router sent past the run, by reason (a key group the run lacks is not counted).
struct RouteCounts {
  int64_t filter_negatives = 0;  // the filter ruled the key out
  int64_t range_negatives = 0;   // after the last key of the key group's last block
};

// The batch's keys: key r is `data[offsets[r], offsets[r + 1])` (an Arrow binary array's
// offsets and data), of key group `key_groups[r]`, with XXH64 `hashes[r]`.
struct RouteKeys {
  const int32_t* offsets = nullptr;
  const uint8_t* data = nullptr;
  const int64_t* key_groups = nullptr;
  const uint64_t* hashes = nullptr;
};

// For each i < n, key r = rows[i]: out[i] = the file block number of its candidate block, or -1
// when the run cannot hold it -- a key group outside groups[0, group_count) (key group
// kg_base + j is groups[j]) or one the run lacks, a filter negative, or a key after the key
// group's last block key. Block b's last key is `block_key_data[block_key_offsets[b],
// block_key_offsets[b + 1])`, ascending within a key group, compared byte-wise (memcmp, then
// the shorter first). The caller checks that every block and row lies within its arrays.
void route_to_blocks(const RouteGroup* groups, size_t group_count, int64_t kg_base,
                     const int64_t* block_key_offsets, const uint8_t* block_key_data,
                     const RouteKeys& keys, const int64_t* rows, size_t n, int64_t* out,
                     RouteCounts* counts) noexcept;

}  // namespace statecore
