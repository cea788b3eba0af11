#include "statecore/block_codec.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

#include "lz4.h"
#include "statecore/detail/bytes.h"
#include "statecore/hash.h"

namespace statecore {

size_t lz4_block_bound(size_t n) noexcept {
  if (n > static_cast<size_t>(LZ4_MAX_INPUT_SIZE)) return 0;
  return static_cast<size_t>(LZ4_compressBound(static_cast<int>(n)));
}

size_t lz4_block_compress(const uint8_t* src, size_t n, std::vector<uint8_t>* out) {
  const size_t bound = lz4_block_bound(n);
  if (n > 0 && bound == 0)
    throw std::invalid_argument("block of " + std::to_string(n) +
                                " bytes exceeds the LZ4 input limit");
  const size_t at = out->size();
  out->resize(at + bound);
  // The calls of python-lz4's lz4.block.compress (mode "fast", no dictionary): a fresh stream
  // and the streaming compressor, whose output can differ from LZ4_compress_fast's.
  LZ4_stream_t stream;
  LZ4_initStream(&stream, sizeof(stream));
  const int written = LZ4_compress_fast_continue(
      &stream, reinterpret_cast<const char*>(src), reinterpret_cast<char*>(out->data() + at),
      static_cast<int>(n), static_cast<int>(bound), kLz4Acceleration);
  if (written <= 0 && n > 0) {  // cannot happen with a bound-sized destination
    out->resize(at);
    throw std::runtime_error("LZ4 compression failed");
  }
  out->resize(at + static_cast<size_t>(written));
  return static_cast<size_t>(written);
}

size_t block_encode_bound(uint32_t codec, size_t n) noexcept {
  return codec == kCodecNone ? n : lz4_block_bound(n);
}

size_t block_encode(uint32_t codec, const uint8_t* src, size_t n, std::vector<uint8_t>* out) {
  if (codec == kCodecLz4) return lz4_block_compress(src, n, out);
  if (codec != kCodecNone)
    throw std::invalid_argument("unknown block codec " + std::to_string(codec));
  out->insert(out->end(), src, src + n);
  return n;
}

uint32_t bloom_hashes(uint32_t bits_per_key) noexcept {
  // round(bits * ln 2) in integers, so that Python computes the same count.
  const uint64_t k = (static_cast<uint64_t>(bits_per_key) * 69 + 50) / 100;
  return static_cast<uint32_t>(std::clamp<uint64_t>(k, 1, 30));
}

size_t bloom_filter_bytes(size_t n, uint32_t bits_per_key) noexcept {
  const uint64_t words = (static_cast<uint64_t>(n) * bits_per_key + 63) / 64;
  return static_cast<size_t>(std::max<uint64_t>(words, 1) * 8);
}

void bloom_add(uint8_t* filter, size_t bytes, uint32_t k, uint64_t hash) noexcept {
  BloomShape(bytes, k).add(filter, hash);
}

bool bloom_may_contain(const uint8_t* filter, size_t bytes, uint32_t k, uint64_t hash) noexcept {
  return BloomShape(bytes, k).may_contain(filter, hash);
}

void bloom_probe_many(const uint8_t* filter, size_t bytes, uint32_t k, const uint64_t* hashes,
                      size_t n, uint8_t* out) noexcept {
  const BloomShape shape(bytes, k);
  for (size_t i = 0; i < n; ++i) out[i] = shape.may_contain(filter, hashes[i]) ? 1 : 0;
}

void bloom_filter_build(const int32_t* offsets, const uint8_t* data, size_t n,
                        uint32_t bits_per_key, std::vector<uint8_t>* out) {
  out->assign(bloom_filter_bytes(n, bits_per_key), 0);
  if (n == 0) return;
  BloomShape(out->size(), bloom_hashes(bits_per_key)).add_keys(out->data(), offsets, data, 0, n);
}

namespace {

constexpr uint64_t kInt32Max = static_cast<uint64_t>(std::numeric_limits<int32_t>::max());

// The format's integers are little-endian (checkpoint/format.py).
using detail::load_le32;

// The checks of format.decode_block on one payload; "" when it is well formed.
std::string check_payload(const uint8_t* p, size_t size, uint64_t expected, bool has_validity) {
  if (size < 4) return "block payload of " + std::to_string(size) + " bytes is too short";
  const uint64_t n = load_le32(p);
  if (n != expected)
    return "block holds " + std::to_string(n) + " entries, block table says " +
           std::to_string(expected);
  const uint64_t head = 4 + 8 * (n + 1);
  if (size < head) return "block payload truncated in its offsets";
  const char* names[2] = {"key", "value"};
  uint64_t lens[2];
  for (int w = 0; w < 2; ++w) {
    const uint8_t* off = p + 4 + w * 4 * (n + 1);
    // Without an early exit, so that the compiler compares many neighbours at once: every
    // block a lookup opens is checked, and a bad one is rare.
    uint32_t bad = load_le32(off) != 0;
    for (uint64_t i = 1; i <= n; ++i)
      bad |= static_cast<int32_t>(load_le32(off + 4 * i)) <
             static_cast<int32_t>(load_le32(off + 4 * (i - 1)));
    if (bad) return std::string(names[w]) + " offsets are not non-decreasing from 0";
    lens[w] = static_cast<uint64_t>(static_cast<int32_t>(load_le32(off + 4 * n)));
  }
  const uint64_t blen = has_validity ? (n + 7) / 8 : 0;
  if (size != head + lens[0] + lens[1] + blen)
    return "block payload is " + std::to_string(size) + " bytes, its offsets describe " +
           std::to_string(head + lens[0] + lens[1] + blen);
  if (has_validity) {
    const uint8_t* bits = p + head + lens[0] + lens[1];
    for (uint64_t bit = n; bit < blen * 8; ++bit)
      if ((bits[bit / 8] >> (bit % 8)) & 1) return "validity bitmap has bits set past the entries";
    const uint8_t* voff = p + 4 + 4 * (n + 1);
    uint32_t bad = 0;
    for (uint64_t i = 0; i < n; ++i)
      bad |= !((bits[i / 8] >> (i % 8)) & 1) &
             (load_le32(voff + 4 * (i + 1)) != load_le32(voff + 4 * i));
    if (bad) return "a tombstone carries value bytes";
  }
  return "";
}

// Verifies (XXH64) and decodes (LZ4, or a copy) one stored block into `out` (at least
// max(raw_length, 1) bytes); "" or what is wrong with it.
std::string inflate_into(const uint8_t* data, size_t size, const StoredBlockRef& blk,
                         uint8_t* out) {
  if (blk.offset > size || blk.stored_length > size - blk.offset)
    return "block lies outside the bytes of its key group";
  const uint8_t* stored = data + blk.offset;
  if (xxh64(stored, blk.stored_length, 0) != blk.xxh64) return "block checksum mismatch";
  if (blk.codec == kCodecNone) {
    if (blk.stored_length != blk.raw_length)
      return "uncompressed block of " + std::to_string(blk.stored_length) +
             " bytes, the block table says " + std::to_string(blk.raw_length);
    if (blk.raw_length) std::memcpy(out, stored, blk.raw_length);
    return "";
  }
  if (blk.codec != kCodecLz4) return "unknown block codec " + std::to_string(blk.codec);
  if (blk.stored_length > kInt32Max || blk.raw_length > kInt32Max)
    return "cannot decompress: block longer than LZ4 allows";
  const int got =
      LZ4_decompress_safe(reinterpret_cast<const char*>(stored), reinterpret_cast<char*>(out),
                          static_cast<int>(blk.stored_length), static_cast<int>(blk.raw_length));
  if (got < 0) return "cannot decompress: corrupt LZ4 block";
  if (static_cast<uint64_t>(got) != blk.raw_length)
    return "cannot decompress: LZ4 gave " + std::to_string(got) + " bytes, the block table says " +
           std::to_string(blk.raw_length);
  return "";
}

// Verifies (XXH64) and decompresses one stored block into `scratch` (at least
// max(max_raw, 1) bytes after the call); "" or what is wrong with it.
std::string inflate_block(const uint8_t* data, size_t size, const StoredBlockRef& blk,
                          uint64_t max_raw, std::vector<uint8_t>* scratch) {
  // At least one byte, so LZ4 never gets a null destination (a block table of empty blocks).
  if (scratch->size() < std::max<uint64_t>(max_raw, 1))
    scratch->resize(std::max<uint64_t>(max_raw, 1));
  return inflate_into(data, size, blk, scratch->data());
}

uint64_t max_raw_length(const StoredBlockRef* blocks, size_t count) {
  uint64_t max_raw = 0;
  for (size_t b = 0; b < count; ++b) max_raw = std::max(max_raw, blocks[b].raw_length);
  return max_raw;
}

}  // namespace

VerifyResult verify_blocks(const uint8_t* data, size_t size, const StoredBlockRef* blocks,
                           size_t count) {
  VerifyResult r;
  const uint64_t max_raw = max_raw_length(blocks, count);
  std::vector<uint8_t> scratch;
  for (size_t b = 0; b < count; ++b) {
    std::string why = inflate_block(data, size, blocks[b], max_raw, &scratch);
    if (!why.empty()) {
      r.failed_block = static_cast<int64_t>(b);
      r.error = std::move(why);
      return r;
    }
    r.raw_bytes += blocks[b].raw_length;
  }
  return r;
}

std::string open_block(const uint8_t* data, size_t size, const StoredBlockRef& block,
                       bool has_validity, std::vector<uint8_t>* scratch) {
  std::string why = inflate_block(data, size, block, block.raw_length, scratch);
  if (!why.empty()) return why;
  return check_payload(scratch->data(), block.raw_length, block.entries, has_validity);
}

std::string open_block_into(const uint8_t* data, size_t size, const StoredBlockRef& block,
                            bool has_validity, uint8_t* out) {
  std::string why = inflate_into(data, size, block, out);
  if (!why.empty()) return why;
  return check_payload(out, block.raw_length, block.entries, has_validity);
}

DecodeResult decode_blocks(const uint8_t* data, size_t size, const StoredBlockRef* blocks,
                           size_t count, bool has_validity, const DecodeBuffers& out) {
  DecodeResult r;
  const uint64_t max_raw = max_raw_length(blocks, count);
  std::vector<uint8_t> scratch;
  uint64_t row = 0;  // entries so far
  out.key_offsets[0] = 0;
  out.value_offsets[0] = 0;
  auto fail = [&](size_t b, std::string why) {
    r.failed_block = static_cast<int64_t>(b);
    r.error = std::move(why);
    return r;
  };
  for (size_t b = 0; b < count; ++b) {
    const StoredBlockRef& blk = blocks[b];
    std::string why = inflate_block(data, size, blk, max_raw, &scratch);
    if (!why.empty()) return fail(b, std::move(why));
    const uint8_t* p = scratch.data();
    std::string bad = check_payload(p, blk.raw_length, blk.entries, has_validity);
    if (!bad.empty()) return fail(b, std::move(bad));
    const uint64_t n = blk.entries;
    const uint8_t* ko = p + 4;
    const uint8_t* vo = ko + 4 * (n + 1);
    const uint64_t klen = load_le32(ko + 4 * n), vlen = load_le32(vo + 4 * n);
    const uint8_t* kd = vo + 4 * (n + 1);
    if (r.key_bytes + klen > kInt32Max || r.value_bytes + vlen > kInt32Max)
      return fail(b,
                  "more than 2 GiB of keys or values in one read (a key group or a range of them; "
                  "int32 offsets)");
    if (r.key_bytes + klen > out.data_capacity || r.value_bytes + vlen > out.data_capacity)
      throw std::invalid_argument("decode_blocks: output data capacity too small");
    std::memcpy(out.key_data + r.key_bytes, kd, klen);
    std::memcpy(out.value_data + r.value_bytes, kd + klen, vlen);
    for (uint64_t i = 1; i <= n; ++i) {
      out.key_offsets[row + i] = static_cast<int32_t>(r.key_bytes + load_le32(ko + 4 * i));
      out.value_offsets[row + i] = static_cast<int32_t>(r.value_bytes + load_le32(vo + 4 * i));
    }
    if (has_validity) {
      const uint8_t* bits = kd + klen + vlen;
      for (uint64_t i = 0; i < n; ++i) {
        const uint64_t at = row + i;
        const bool valid = (bits[i / 8] >> (i % 8)) & 1;
        if (at % 8 == 0) out.validity[at / 8] = 0;
        out.validity[at / 8] |= static_cast<uint8_t>(valid) << (at % 8);
        r.tombstones += !valid;
      }
    }
    r.key_bytes += klen;
    r.value_bytes += vlen;
    row += n;
  }
  return r;
}

}  // namespace statecore
