// The stored form of a checkpoint data-file block (src/statecore/checkpoint/format.py, "Block"):
// the uncompressed payload in the LZ4 block format without a stored size, checksummed with XXH64
// (seed 0). Exactly the bytes of Python's `lz4.block.compress(payload, store_size=False)` built
// on the same LZ4 release (native/third_party/lz4/README.md), so a file written here and one
// written by the pure-Python writer are byte-identical.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace statecore {

// Appends the LZ4-compressed `src[0, n)` to `out` and returns the number of bytes appended.
// Thread-safe (no shared state; 16 KiB of stack). std::invalid_argument when n exceeds LZ4's
// input limit (LZ4_MAX_INPUT_SIZE, about 2 GiB).
size_t lz4_block_compress(const uint8_t* src, size_t n, std::vector<uint8_t>* out);

// LZ4_compressBound(n): the most bytes lz4_block_compress can append; 0 when n is too large.
size_t lz4_block_bound(size_t n) noexcept;

}  // namespace statecore
