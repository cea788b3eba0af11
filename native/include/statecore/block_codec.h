// The stored form of a checkpoint data-file block (src/statecore/checkpoint/format.py, "Block"):
// the payload as its block table record's codec says -- kCodecLz4: the LZ4 block format without a
// stored size, exactly the bytes of Python's `lz4.block.compress(payload, mode="fast",
// acceleration=kLz4Acceleration, store_size=False)` built on the same LZ4 release
// (native/third_party/lz4/README.md), so a file written here and one written by the pure-Python
// writer are byte-identical; kCodecNone: the payload itself -- checksummed with XXH64 (seed 0).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "statecore/hash.h"

namespace statecore {

// LZ4's acceleration for checkpoint blocks (format.py LZ4_ACCELERATION; 1 is LZ4's default
// mode). A block is mostly int32 offsets and hashed or random key bytes that no setting
// compresses; 2 skips through them faster at about the same ratio on such blocks, and costs
// little ratio on compressible text. Decompression does not depend on it: files written with
// another setting read the same.
constexpr int kLz4Acceleration = 2;

// Block codecs (the block table record's `codec`, docs/formats.md "Data file"; a file's meta
// `compression` names the one all its blocks use). Stored uncompressed, a block costs its reader
// a copy instead of a decompression: what a tiered run, read block by block on every miss,
// prefers over the smaller file (RocksDB's per-block kNoCompression makes the same trade).
constexpr uint32_t kCodecLz4 = 0;
constexpr uint32_t kCodecNone = 1;

// Appends `src[0, n)` stored with `codec` to `out` and returns the number of bytes appended.
// std::invalid_argument for an unknown codec or, with LZ4, as lz4_block_compress.
size_t block_encode(uint32_t codec, const uint8_t* src, size_t n, std::vector<uint8_t>* out);
// The most bytes block_encode can append for n payload bytes (0 when n is too large for LZ4).
size_t block_encode_bound(uint32_t codec, size_t n) noexcept;

// Appends the LZ4-compressed `src[0, n)` to `out` and returns the number of bytes appended.
// Thread-safe (no shared state; 16 KiB of stack). std::invalid_argument when n exceeds LZ4's
// input limit (LZ4_MAX_INPUT_SIZE, about 2 GiB).
size_t lz4_block_compress(const uint8_t* src, size_t n, std::vector<uint8_t>* out);

// LZ4_compressBound(n): the most bytes lz4_block_compress can append; 0 when n is too large.
size_t lz4_block_bound(size_t n) noexcept;

// Bloom filters of format-6 data files (docs/formats.md "Filters and block keys"; format.py's
// bloom_filter builds the same bytes): `bloom_filter_bytes(n, bits_per_key)` bytes (n * bits
// rounded up to whole 64-bit words, at least one), bloom_hashes(bits_per_key) probes per key at
// (h1 + i * h2) mod bits for i < k, h1/h2 the low/high 32 bits of the key's XXH64 (seed 0)
// (Kirsch-Mitzenmacher double hashing); bit p is bit p % 8 of byte p / 8.
uint32_t bloom_hashes(uint32_t bits_per_key) noexcept;
size_t bloom_filter_bytes(size_t n, uint32_t bits_per_key) noexcept;

// The probe positions of one filter size, computed without a division per probe: (h1 + i * h2)
// mod bits equals p_i with p_0 = h1 mod bits, p_{i+1} = p_i + (h2 mod bits), less bits when that
// reaches bits; the two remainders by Lemire's "Faster Remainder by Direct Computation" (2019)
// with a multiplier fixed per filter (h1, h2 < 2^32; a filter of 2^32 bits or more holds them
// unreduced). The same bits as the definition above, bit for bit.
class BloomShape {
 public:
  BloomShape(size_t bytes, uint32_t k) noexcept
      : bits_(static_cast<uint64_t>(bytes) * 8),
        small_(bits_ - 1 < 0xFFFFFFFFu),  // 1 <= bits <= 2^32 - 1 (0 bytes: no division)
        m_(small_ ? ~uint64_t{0} / bits_ + 1 : 0),
        k_(k) {}
  // Sets the probes of the key whose XXH64 is `hash` in a filter of this shape's bytes.
  void add(uint8_t* filter, uint64_t hash) const noexcept {
    each_probe(hash, [filter](uint64_t p) {
      filter[p >> 3] |= static_cast<uint8_t>(1u << (p & 7));
      return true;
    });
  }
  // Whether the filter may hold the key whose XXH64 is `hash` (false: certainly not).
  bool may_contain(const uint8_t* filter, uint64_t hash) const noexcept {
    return each_probe(hash,
                      [filter](uint64_t p) { return (filter[p >> 3] & (1u << (p & 7))) != 0; });
  }
  // Starts loading the bytes may_contain(filter, hash) reads into the cache. Why: a large
  // filter's probes are cache misses, one after another in may_contain; a caller probing many
  // keys prefetches a few keys ahead so that their misses overlap.
  void prefetch(const uint8_t* filter, uint64_t hash) const noexcept {
    each_probe(hash, [filter](uint64_t p) {
      __builtin_prefetch(filter + (p >> 3));
      // GCC deletes a loop whose only effect is a prefetch (it counts none); this empty
      // statement, which it must keep, keeps the loop.
      asm volatile("" : : "r"(p));
      return true;
    });
  }
  // Adds the keys data[offsets[i], offsets[i + 1]) for i in [begin, end), their XXH64s (seed 0)
  // taken a group at a time before their probes are set: one key's hashing then does not wait
  // behind the previous key's stores.
  template <class Offset>
  void add_keys(uint8_t* filter, const Offset* offsets, const uint8_t* data, size_t begin,
                size_t end) const noexcept {
    constexpr size_t kGroup = 32;
    uint64_t h[kGroup];
    for (size_t i = begin; i < end; i += kGroup) {
      const size_t m = end - i < kGroup ? end - i : kGroup;
      for (size_t j = 0; j < m; ++j)
        h[j] = xxh64(data + offsets[i + j],
                     static_cast<size_t>(offsets[i + j + 1] - offsets[i + j]), 0);
      for (size_t j = 0; j < m; ++j) add(filter, h[j]);
    }
  }

 private:
  // Calls fn(bit) for the k probe bits of `hash` (double hashing: h1 + i * h2 mod bits), in
  // order, while fn returns true; returns whether every call did.
  template <class Fn>
  bool each_probe(uint64_t hash, Fn&& fn) const noexcept {
    uint64_t p = reduce(hash & 0xFFFFFFFFu);
    const uint64_t d = reduce(hash >> 32);
    for (uint32_t i = 0; i < k_; ++i) {
      if (!fn(p)) return false;
      p += d;
      if (p >= bits_) p -= bits_;
    }
    return true;
  }
  // x mod bits for x < 2^32.
  uint64_t reduce(uint64_t x) const noexcept {
    if (!small_) return x;
    const uint64_t low = m_ * x;
    return static_cast<uint64_t>((static_cast<unsigned __int128>(low) * bits_) >> 64);
  }
  uint64_t bits_;
  bool small_;
  uint64_t m_;
  uint32_t k_;
};

// Sets the probes of the key whose XXH64 is `hash` in `filter[0, bytes)` (bytes > 0).
void bloom_add(uint8_t* filter, size_t bytes, uint32_t k, uint64_t hash) noexcept;
// Whether the filter may hold the key whose XXH64 is `hash` (false: certainly not).
bool bloom_may_contain(const uint8_t* filter, size_t bytes, uint32_t k, uint64_t hash) noexcept;
// For each of the `n` XXH64s `hashes`, whether the filter may hold its key: out[i] = 1 or 0.
void bloom_probe_many(const uint8_t* filter, size_t bytes, uint32_t k, const uint64_t* hashes,
                      size_t n, uint8_t* out) noexcept;
// The filter of the `n` keys `data[offsets[i], offsets[i + 1])` (an Arrow binary array's
// offsets, non-decreasing) with `bits_per_key` bits per key, into `out` (resized to
// bloom_filter_bytes(n, bits_per_key)).
void bloom_filter_build(const int32_t* offsets, const uint8_t* data, size_t n,
                        uint32_t bits_per_key, std::vector<uint8_t>* out);

// One stored block as the data file's block table lists it; `offset` is relative to the bytes
// given to decode_blocks. Lengths in bytes; `codec` kCodecLz4 or kCodecNone (any other value is
// reported as a bad block).
struct StoredBlockRef {
  uint64_t offset = 0;
  uint64_t stored_length = 0;
  uint64_t raw_length = 0;
  uint64_t entries = 0;
  uint64_t xxh64 = 0;
  uint32_t codec = kCodecLz4;
};

// Caller-owned buffers of the entries of consecutive blocks, as two Arrow binary arrays (keys;
// values with a validity bitmap): offsets sum(entries) + 1 int32 each; data `data_capacity`
// bytes each (sum(raw_length) always suffices); validity ceil(sum(entries) / 8) bytes, LSB
// first, 0 = tombstone (written only with has_validity).
struct DecodeBuffers {
  int32_t* key_offsets = nullptr;
  int32_t* value_offsets = nullptr;
  uint8_t* key_data = nullptr;
  uint8_t* value_data = nullptr;
  size_t data_capacity = 0;
  uint8_t* validity = nullptr;
};

struct DecodeResult {
  int64_t failed_block = -1;  // index into the blocks of the first bad one; -1: all decoded
  std::string error;          // what is wrong with it (format.decode_block's wording)
  size_t key_bytes = 0;
  size_t value_bytes = 0;
  uint64_t tombstones = 0;
};

// Verifies (XXH64 of the stored bytes), decompresses and parses `blocks` of `data[0, size)` in
// order and appends their entries to `out` (format.py "Block" and decode_block: the payload
// checks are the same). Stops at the first bad block and reports it in the result; never reads
// outside `data` or writes outside `out`. Thread-safe, no allocation besides one scratch buffer
// of the largest raw_length.
DecodeResult decode_blocks(const uint8_t* data, size_t size, const StoredBlockRef* blocks,
                           size_t count, bool has_validity, const DecodeBuffers& out);

struct VerifyResult {
  int64_t failed_block = -1;  // index into the blocks of the first bad one; -1: all good
  std::string error;          // what is wrong with it (decode_blocks' wording)
  uint64_t raw_bytes = 0;     // the blocks' decompressed bytes (of those before a bad one)
};

// What decode_blocks does to `blocks` before it parses a payload -- bounds, XXH64 of the stored
// bytes, decoding (LZ4 decompression, or a copy of an uncompressed block) to exactly raw_length
// bytes -- into one reused scratch buffer,
// parsing and keeping nothing: the floor under decoding those blocks. Stops at the first bad
// block and reports it; never reads outside `data`. Thread-safe.
VerifyResult verify_blocks(const uint8_t* data, size_t size, const StoredBlockRef* blocks,
                           size_t count);

// One block of `data[0, size)` as decode_blocks takes it: bounds, XXH64 of the stored bytes, LZ4
// decompression into `*scratch` (resized to at least raw_length bytes, reused across calls) and
// the payload's checks. "" when the payload, scratch[0, raw_length), is well formed, else what is
// wrong (decode_blocks' wording). For a caller that consumes the entries of each payload in
// place (bulk_load.h load_blocks). Thread-safe.
std::string open_block(const uint8_t* data, size_t size, const StoredBlockRef& block,
                       bool has_validity, std::vector<uint8_t>* scratch);
// open_block with the payload decompressed straight into `out` (block.raw_length bytes, at least
// one; caller-owned): a caller that keeps each payload in a buffer of its own copies nothing
// (payload_lookup.h open_blocks_into). On a bad block `out` holds no meaningful bytes.
std::string open_block_into(const uint8_t* data, size_t size, const StoredBlockRef& block,
                            bool has_validity, uint8_t* out);

}  // namespace statecore
