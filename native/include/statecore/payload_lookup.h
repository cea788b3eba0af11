// Point lookups in checked, decompressed block payloads (docs/formats.md "Block payload"), for
// the run lookups of the tiered mode (statecore.checkpoint.lookup): a block is opened once
// (open_block: bounds, XXH64, LZ4, payload checks) into a buffer of its own, kept in the
// lookup's block cache as it is, and searched in place -- no per-entry copy into Arrow arrays.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "statecore/block_codec.h"

namespace statecore {

// The parts of a payload that open_block (or check_payload) accepted. Offsets are read through
// little-endian loads: the payload's bytes need no alignment.
struct PayloadView {
  uint32_t entries = 0;
  const uint8_t* key_offsets = nullptr;    // (entries + 1) x int32 LE
  const uint8_t* value_offsets = nullptr;  // (entries + 1) x int32 LE
  const uint8_t* key_data = nullptr;
  const uint8_t* value_data = nullptr;
  const uint8_t* validity = nullptr;  // null: every entry holds a value (full files)

  // The view of the well-formed payload `p[0, size)`; `has_validity`: an incremental file's.
  static PayloadView of(const uint8_t* p, size_t size, bool has_validity);
  // Row of `key` (byte-wise binary search; keys ascending and unique), or -1.
  int64_t find(const uint8_t* key, size_t key_size) const;
  // Whether row `row` holds a value (false: a tombstone).
  bool has_value(int64_t row) const;
  uint32_t key_offset(int64_t row) const;
  uint32_t value_offset(int64_t row) const;
};

// Opens `count` stored blocks of `data[0, size)` (open_block) into caller-owned buffers:
// payload b is decompressed straight into `out[b]`, which holds max(blocks[b].raw_length, 1)
// bytes. Also checks that each payload's last key equals `last_keys[b]` (the footer's block key,
// `last_key_sizes[b]` bytes).
// Stops at the first bad block: its index (else -1) and what is wrong in *why. Thread-safe.
int64_t open_blocks_into(const uint8_t* data, size_t size, const StoredBlockRef* blocks,
                         size_t count, bool has_validity, const uint8_t* const* last_keys,
                         const size_t* last_key_sizes, uint8_t* const* out, std::string* why);

}  // namespace statecore
