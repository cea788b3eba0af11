// libFuzzer target: decode_blocks (block_codec.h), the reader of a data file's stored blocks
// (docs/formats.md "Data file": XXH64 over the stored bytes, an LZ4 block or the payload stored
// uncompressed, then the payload of entry count, key offsets, value offsets, key bytes, value
// bytes, validity bitmap).
//
// Input: flags (1 byte), then
//   flags & 2 == 0 ("payload"): the uncompressed payload; the harness encodes it and computes
//     its checksum, so that mutations reach the payload checks instead of stopping at the XXH64;
//   flags & 2 != 0 ("stored"): raw_length (LE32), entries (LE32), the stored bytes; the
//     harness computes the checksum, so mutations reach the LZ4 decoder.
// flags & 1: incremental file (validity bitmap); & 4: the block twice (two table rows over
// consecutive copies); & 8: a block-table entry count taken from the input instead of the
// payload's; & 16: a wrong checksum (must fail); & 32: codec "none" instead of LZ4 (stored
// bytes are the payload; in "stored" mode a raw_length other than their length must fail).
// The block table's claims are bounded as DataFileReader bounds them before it calls the native
// decoder (raw_length <= 255 * stored_length + 64, 4 + 8 * entries <= raw_length).
//
// Contract: verify_blocks fails exactly on a bad checksum or LZ4 stream, where decode_blocks
// fails with the same words. decode_blocks accepts exactly the well-formed payloads (checked against a reference
// written here from docs/formats.md), names the first bad block otherwise, never touches memory
// outside its buffers (ASan: every buffer has its exact size), and what it decodes re-encodes to
// the very payload bytes.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "fuzz_input.h"
#include "lz4.h"
#include "statecore/block_codec.h"
#include "statecore/hash.h"

namespace {

using statecore_fuzz::Input;

uint32_t le32_at(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}

void put_le32(std::vector<uint8_t>& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

// The payload rules of docs/formats.md "Data file", written apart from block_codec.cpp.
bool well_formed(const std::vector<uint8_t>& p, uint64_t entries, bool has_validity) {
  if (p.size() < 4) return false;
  const uint64_t n = le32_at(p.data());
  if (n != entries) return false;
  if (p.size() < 4 + 8 * (n + 1)) return false;
  int64_t ends[2];
  for (int w = 0; w < 2; ++w) {
    int64_t prev = 0;
    for (uint64_t i = 0; i <= n; ++i) {
      const int64_t cur = static_cast<int32_t>(le32_at(p.data() + 4 + w * 4 * (n + 1) + 4 * i));
      if ((i == 0 && cur != 0) || cur < prev) return false;
      prev = cur;
    }
    ends[w] = prev;
  }
  const uint64_t bitmap = has_validity ? (n + 7) / 8 : 0;
  if (p.size() != 4 + 8 * (n + 1) + static_cast<uint64_t>(ends[0] + ends[1]) + bitmap) return false;
  if (!has_validity) return true;
  const uint8_t* bits = p.data() + p.size() - bitmap;
  for (uint64_t i = 0; i < bitmap * 8; ++i) {
    const bool set = (bits[i / 8] >> (i % 8)) & 1;
    if (i >= n && set) return false;
    const uint8_t* vo = p.data() + 4 + 4 * (n + 1) + 4 * i;
    if (i < n && !set && le32_at(vo + 4) != le32_at(vo)) return false;
  }
  return true;
}

// The payload of rows [r0, r1) of the decoded buffers (blocks.encode_block's layout).
std::vector<uint8_t> reencode(const std::vector<int32_t>& ko, const std::vector<uint8_t>& kd,
                              const std::vector<int32_t>& vo, const std::vector<uint8_t>& vd,
                              const std::vector<uint8_t>& validity, bool has_validity, size_t r0,
                              size_t r1) {
  std::vector<uint8_t> out;
  put_le32(out, static_cast<uint32_t>(r1 - r0));
  for (size_t i = r0; i <= r1; ++i) put_le32(out, static_cast<uint32_t>(ko[i] - ko[r0]));
  for (size_t i = r0; i <= r1; ++i) put_le32(out, static_cast<uint32_t>(vo[i] - vo[r0]));
  out.insert(out.end(), kd.begin() + ko[r0], kd.begin() + ko[r1]);
  out.insert(out.end(), vd.begin() + vo[r0], vd.begin() + vo[r1]);
  if (has_validity) {
    std::vector<uint8_t> bits((r1 - r0 + 7) / 8, 0);
    for (size_t i = r0; i < r1; ++i)
      if ((validity[i / 8] >> (i % 8)) & 1) bits[(i - r0) / 8] |= uint8_t(1) << ((i - r0) % 8);
    out.insert(out.end(), bits.begin(), bits.end());
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in(data, size);
  const uint8_t flags = in.u8();
  const bool has_validity = flags & 1, stored_mode = flags & 2, twice = flags & 4;
  const bool table_entries = flags & 8, bad_checksum = flags & 16;
  const uint32_t codec = (flags & 32) ? statecore::kCodecNone : statecore::kCodecLz4;

  std::vector<uint8_t> stored;
  std::vector<uint8_t> payload;  // what decoding gives back (meaningless when it fails)
  bool decodes = true;
  uint64_t raw_length = 0, entries = 0;
  if (!stored_mode) {
    size_t n = 0;
    const uint8_t* p = in.rest(&n);
    payload.assign(p, p + n);
    if (payload.size() < 4) return 0;  // DataFileReader refuses the file first (below)
    statecore::block_encode(codec, payload.data(), payload.size(), &stored);
    raw_length = payload.size();
    entries = le32_at(payload.data());
    if (table_entries) entries ^= 1;
  } else {
    raw_length = in.le32();
    entries = in.le32();
    size_t n = 0;
    const uint8_t* p = in.rest(&n);
    stored.assign(p, p + n);
    stored.reserve(1);  // a reader's buffer is never null, even for a zero-length block
    raw_length %= 255 * stored.size() + 65;
    payload.reserve(1);
    payload.resize(raw_length);
    if (codec == statecore::kCodecNone) {
      decodes = raw_length == stored.size();
      if (decodes) payload = stored;
    } else {
      const int got = LZ4_decompress_safe(
          reinterpret_cast<const char*>(stored.data()), reinterpret_cast<char*>(payload.data()),
          static_cast<int>(stored.size()), static_cast<int>(raw_length));
      decodes = got >= 0 && static_cast<uint64_t>(got) == raw_length;
    }
    if (!table_entries && raw_length >= 4) entries = le32_at(payload.data());
  }
  if (4 + 8 * entries > raw_length) return 0;  // DataFileReader refuses the file first

  const uint64_t checksum = statecore::xxh64(stored.data(), stored.size(), 0) ^ bad_checksum;
  const size_t count = twice ? 2 : 1;
  std::vector<uint8_t> file;
  file.reserve(1);
  std::vector<statecore::StoredBlockRef> refs;
  for (size_t b = 0; b < count; ++b) {
    refs.push_back({file.size(), stored.size(), raw_length, entries, checksum, codec});
    file.insert(file.end(), stored.begin(), stored.end());
  }
  const size_t rows = count * entries, capacity = count * raw_length;
  std::vector<int32_t> ko(rows + 1), vo(rows + 1);
  std::vector<uint8_t> kd(capacity), vd(capacity), validity((rows + 7) / 8);
  statecore::DecodeBuffers out{ko.data(), vo.data(), kd.data(),
                               vd.data(), capacity,  has_validity ? validity.data() : nullptr};
  const statecore::DecodeResult r =
      statecore::decode_blocks(file.data(), file.size(), refs.data(), count, has_validity, out);

  // verify_blocks (the restore's floor) fails exactly where the stored bytes are bad -- checksum,
  // LZ4, an uncompressed block's length -- and accepts a block whose payload is malformed: it
  // parses nothing.
  const statecore::VerifyResult v =
      statecore::verify_blocks(file.data(), file.size(), refs.data(), count);
  if (bad_checksum || !decodes) {
    FUZZ_CHECK(v.failed_block == 0 && !v.error.empty(), "verify_blocks names a bad stored block");
    FUZZ_CHECK(r.failed_block == 0 && r.error == v.error,
               "decode_blocks fails on a bad stored block in verify_blocks' words");
  } else {
    FUZZ_CHECK(v.failed_block == -1 && v.raw_bytes == capacity,
               "verify_blocks accepts sound stored bytes and counts their raw bytes");
  }

  const bool expect_ok = !bad_checksum && decodes && well_formed(payload, entries, has_validity);
  if (!expect_ok) {
    FUZZ_CHECK(r.failed_block == 0, "a bad block is reported as the first block");
    FUZZ_CHECK(!r.error.empty(), "a failure says what is wrong");
    return 0;
  }
  FUZZ_CHECK(r.failed_block == -1 && r.error.empty(), "a well-formed block decodes");
  FUZZ_CHECK(r.key_bytes == static_cast<size_t>(ko[rows]), "key bytes match the offsets");
  FUZZ_CHECK(r.value_bytes == static_cast<size_t>(vo[rows]), "value bytes match the offsets");
  uint64_t tombstones = 0;
  for (size_t b = 0; b < count; ++b) {
    const std::vector<uint8_t> again =
        reencode(ko, kd, vo, vd, validity, has_validity, b * entries, (b + 1) * entries);
    FUZZ_CHECK(again == payload, "decoded entries re-encode to the payload");
  }
  if (has_validity)
    for (size_t i = 0; i < rows; ++i) tombstones += !((validity[i / 8] >> (i % 8)) & 1);
  FUZZ_CHECK(r.tombstones == tombstones, "tombstones counted as the bitmap says");
  return 0;
}
