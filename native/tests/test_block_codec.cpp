// block_codec.h: verify_blocks, the check-and-decode step decode_blocks runs on every stored
// block, on its own (the floor a restore is measured against). Good blocks give their raw
// bytes; a bad checksum, truncated bytes, a block outside the bytes, an LZ4 stream that does
// not give raw_length bytes, an uncompressed block of another length or an unknown codec name
// the first bad block in decode_blocks' words; a malformed payload behind sound stored bytes
// passes (nothing is parsed).
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "check.h"
#include "statecore/block_codec.h"
#include "statecore/hash.h"

using statecore::StoredBlockRef;
using statecore::verify_blocks;

namespace {

struct Stored {
  std::vector<uint8_t> bytes;
  std::vector<StoredBlockRef> refs;
};

// Blocks of the given raw payloads (arbitrary bytes: verify_blocks does not parse them),
// encoded with `codec` and stored back to back.
Stored store(const std::vector<std::vector<uint8_t>>& payloads,
             uint32_t codec = statecore::kCodecLz4) {
  Stored s;
  for (const auto& p : payloads) {
    const size_t at = s.bytes.size();
    const size_t n = statecore::block_encode(codec, p.data(), p.size(), &s.bytes);
    s.refs.push_back({at, n, p.size(), 0, statecore::xxh64(s.bytes.data() + at, n, 0), codec});
  }
  return s;
}

std::vector<std::vector<uint8_t>> payloads() {
  std::vector<std::vector<uint8_t>> out;
  for (int b = 0; b < 4; ++b) {
    std::vector<uint8_t> p(1000 + 300 * b);
    for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<uint8_t>((i * (b + 3)) % 7);
    out.push_back(p);
  }
  return out;
}

}  // namespace

TEST(good_blocks_give_their_raw_bytes) {
  const Stored s = store(payloads());
  const auto r = verify_blocks(s.bytes.data(), s.bytes.size(), s.refs.data(), s.refs.size());
  CHECK_EQ(r.failed_block, int64_t{-1});
  CHECK(r.error.empty());
  CHECK_EQ(r.raw_bytes, uint64_t{1000 + 1300 + 1600 + 1900});
  const auto none = verify_blocks(nullptr, 0, nullptr, 0);
  CHECK_EQ(none.failed_block, int64_t{-1});
  CHECK_EQ(none.raw_bytes, uint64_t{0});
}

TEST(a_flipped_byte_is_a_checksum_mismatch_of_its_block) {
  Stored s = store(payloads());
  s.bytes[s.refs[2].offset + 3] ^= 0x20;
  const auto r = verify_blocks(s.bytes.data(), s.bytes.size(), s.refs.data(), s.refs.size());
  CHECK_EQ(r.failed_block, int64_t{2});
  CHECK_EQ(r.error, std::string("block checksum mismatch"));
  CHECK_EQ(r.raw_bytes, uint64_t{1000 + 1300});
}

TEST(truncated_bytes_or_a_block_outside_them_fail) {
  const Stored s = store(payloads());
  const auto r = verify_blocks(s.bytes.data(), s.bytes.size() - 1, s.refs.data(), s.refs.size());
  CHECK_EQ(r.failed_block, int64_t{3});
  CHECK(r.error.find("outside") != std::string::npos);
  std::vector<StoredBlockRef> refs = s.refs;
  refs[0].offset = ~uint64_t{0} - 2;  // an offset before the bytes, wrapped
  const auto w = verify_blocks(s.bytes.data(), s.bytes.size(), refs.data(), refs.size());
  CHECK_EQ(w.failed_block, int64_t{0});
}

TEST(a_raw_length_lz4_does_not_give_fails_to_decompress) {
  const Stored s = store(payloads());
  std::vector<StoredBlockRef> refs = s.refs;
  refs[1].raw_length += 1;
  const auto r = verify_blocks(s.bytes.data(), s.bytes.size(), refs.data(), refs.size());
  CHECK_EQ(r.failed_block, int64_t{1});
  CHECK(r.error.rfind("cannot decompress", 0) == 0);
}

TEST(corrupt_lz4_with_a_matching_checksum_fails_to_decompress) {
  Stored s = store({std::vector<uint8_t>(5000, 7)});
  s.bytes[0] = 0xff;  // a literal length the stream cannot hold
  s.refs[0].xxh64 = statecore::xxh64(s.bytes.data(), s.bytes.size(), 0);
  const auto r = verify_blocks(s.bytes.data(), s.bytes.size(), s.refs.data(), s.refs.size());
  CHECK_EQ(r.failed_block, int64_t{0});
  CHECK(r.error.rfind("cannot decompress", 0) == 0);
}

TEST(a_payload_that_does_not_parse_passes) {
  // decode_blocks would refuse this payload (its entry count says 0x01010101 entries); the
  // stored bytes are sound, which is all verify_blocks checks.
  const Stored s = store({std::vector<uint8_t>(64, 1)});
  const auto r = verify_blocks(s.bytes.data(), s.bytes.size(), s.refs.data(), s.refs.size());
  CHECK_EQ(r.failed_block, int64_t{-1});
  CHECK_EQ(r.raw_bytes, uint64_t{64});
}

// A payload (entries | key offsets | value offsets | keys | values [| validity]) of int32
// offsets as given, whatever they say.
std::vector<uint8_t> payload_of(const std::vector<int32_t>& koff, const std::vector<int32_t>& voff,
                                size_t data_bytes, const std::vector<uint8_t>& validity) {
  std::vector<uint8_t> p;
  const auto put32 = [&](uint32_t v) {
    for (int i = 0; i < 4; ++i) p.push_back(static_cast<uint8_t>(v >> (8 * i)));
  };
  put32(static_cast<uint32_t>(koff.size() - 1));
  for (int32_t o : koff) put32(static_cast<uint32_t>(o));
  for (int32_t o : voff) put32(static_cast<uint32_t>(o));
  p.resize(p.size() + data_bytes, 'x');
  p.insert(p.end(), validity.begin(), validity.end());
  return p;
}

// The payload checks (check_payload) of open_block, each over a block whose stored bytes are
// sound: offsets that start past 0 or decrease anywhere, in either array (among many entries,
// where the check compares many neighbours at once), or a tombstone with value bytes.
TEST(open_block_names_what_is_wrong_with_a_payload) {
  const auto open = [](const std::vector<uint8_t>& p, size_t entries, bool validity) {
    Stored s = store({p});
    s.refs[0].entries = entries;
    std::vector<uint8_t> scratch;
    return statecore::open_block(s.bytes.data(), s.bytes.size(), s.refs[0], validity, &scratch);
  };
  const size_t n = 100;
  std::vector<int32_t> koff(n + 1), voff(n + 1);
  for (size_t i = 0; i <= n; ++i) {
    koff[i] = static_cast<int32_t>(10 * i);
    voff[i] = static_cast<int32_t>(8 * i);
  }
  CHECK_EQ(open(payload_of(koff, voff, 1800, {}), n, false), std::string(""));
  for (size_t at : {size_t(1), size_t(37), n}) {
    std::vector<int32_t> k = koff;
    k[at] = k[at - 1] - 1;
    CHECK_EQ(open(payload_of(k, voff, 1800, {}), n, false),
             std::string("key offsets are not non-decreasing from 0"));
    std::vector<int32_t> v = voff;
    v[at] = -5;  // negative: below its neighbour as a signed offset
    CHECK_EQ(open(payload_of(koff, v, 1800, {}), n, false),
             std::string("value offsets are not non-decreasing from 0"));
  }
  std::vector<int32_t> k = koff;
  k[0] = 1;
  CHECK_EQ(open(payload_of(k, voff, 1800, {}), n, false),
           std::string("key offsets are not non-decreasing from 0"));
  std::vector<uint8_t> all(13, 0xFF);
  all.back() = 0x0F;  // bits 96..99 of 100 entries
  CHECK_EQ(open(payload_of(koff, voff, 1800, all), n, true), std::string(""));
  std::vector<uint8_t> one = all;
  one[5] &= static_cast<uint8_t>(~(1u << 3));  // entry 43: a tombstone, with 8 value bytes
  CHECK_EQ(open(payload_of(koff, voff, 1800, one), n, true),
           std::string("a tombstone carries value bytes"));
}

// Bloom filters (format 6): sizes in whole 64-bit words, round(bits * ln 2) probes, no false
// negatives, a false-positive rate near the theory, and the bit layout format.py's bloom_filter
// writes (the Python tests compare whole files of both writers).
TEST(uncompressed_blocks_are_their_payloads_of_exactly_raw_length) {
  const auto ps = payloads();
  const Stored s = store(ps, statecore::kCodecNone);
  size_t total = 0;
  for (size_t b = 0; b < ps.size(); ++b) {
    CHECK_EQ(s.refs[b].stored_length, s.refs[b].raw_length);
    CHECK(std::equal(ps[b].begin(), ps[b].end(), s.bytes.begin() + s.refs[b].offset));
    total += ps[b].size();
  }
  CHECK_EQ(s.bytes.size(), total);
  const auto r = verify_blocks(s.bytes.data(), s.bytes.size(), s.refs.data(), s.refs.size());
  CHECK_EQ(r.failed_block, int64_t{-1});
  CHECK_EQ(r.raw_bytes, uint64_t{total});
  for (int delta : {-1, 1}) {
    Stored bad = s;
    bad.refs[2].raw_length += delta;
    const auto v = verify_blocks(bad.bytes.data(), bad.bytes.size(), bad.refs.data(), 4);
    CHECK_EQ(v.failed_block, int64_t{2});
    CHECK_EQ(v.error, "uncompressed block of 1600 bytes, the block table says " +
                          std::to_string(1600 + delta));
  }
  Stored odd = s;
  odd.refs[1].codec = 9;
  const auto v = verify_blocks(odd.bytes.data(), odd.bytes.size(), odd.refs.data(), 4);
  CHECK_EQ(v.failed_block, int64_t{1});
  CHECK_EQ(v.error, std::string("unknown block codec 9"));
  std::vector<uint8_t> out;
  bool threw = false;
  try {
    statecore::block_encode(9, ps[0].data(), ps[0].size(), &out);
  } catch (const std::invalid_argument&) {
    threw = true;
  }
  CHECK(threw && out.empty());
  CHECK_EQ(statecore::block_encode_bound(statecore::kCodecNone, 4096), size_t{4096});
}

TEST(bloom_filters_size_probe_and_lay_out_bits) {
  CHECK_EQ(statecore::bloom_hashes(10), 7u);
  CHECK_EQ(statecore::bloom_hashes(1), 1u);
  CHECK_EQ(statecore::bloom_hashes(64), 30u);
  CHECK_EQ(statecore::bloom_filter_bytes(0, 10), size_t{8});
  CHECK_EQ(statecore::bloom_filter_bytes(7, 10), size_t{16});
  CHECK_EQ(statecore::bloom_filter_bytes(1000, 10), size_t{1256});
  std::vector<uint8_t> one(8, 0);
  // h1 = 3, h2 = 1: probes at bits 3, 4, 5.
  statecore::bloom_add(one.data(), one.size(), 3, (uint64_t{1} << 32) | 3);
  CHECK_EQ(one[0], static_cast<uint8_t>(0x38));
  const size_t n = 5000;
  std::vector<uint8_t> f(statecore::bloom_filter_bytes(n, 10), 0);
  for (uint64_t i = 0; i < n; ++i)
    statecore::bloom_add(f.data(), f.size(), 7, statecore::xxh64(&i, 8, 0));
  for (uint64_t i = 0; i < n; ++i)
    CHECK(statecore::bloom_may_contain(f.data(), f.size(), 7, statecore::xxh64(&i, 8, 0)));
  size_t fp = 0;
  for (uint64_t i = n; i < n + 100000; ++i)
    fp += statecore::bloom_may_contain(f.data(), f.size(), 7, statecore::xxh64(&i, 8, 0));
  CHECK(fp > 400 && fp < 1300);  // 0.82% expected
}

// BloomShape reduces without a division per probe: the bits must be those of the definition,
// (h1 + i * h2) mod bits, for every filter size (odd word counts, sizes near 2^32 bits' reach)
// and probe count; bloom_filter_build sets the bits of its keys' XXH64s.
TEST(bloom_shape_sets_the_bits_of_the_definition) {
  uint64_t x = 0x9E3779B97F4A7C15ULL;
  auto next = [&x] {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
  };
  const size_t sizes[] = {8, 16, 24, 1256, 4096 + 8, 99992, size_t{1} << 20};
  for (size_t bytes : sizes) {
    for (uint32_t k : {1u, 2u, 7u, 30u}) {
      std::vector<uint8_t> want(bytes, 0), got(bytes, 0);
      const uint64_t bits = uint64_t{bytes} * 8;
      const statecore::BloomShape shape(bytes, k);
      for (int r = 0; r < 200; ++r) {
        uint64_t h = next();
        if (r == 0) h = ~uint64_t{0};
        if (r == 1) h = 0;
        const uint64_t h1 = h & 0xFFFFFFFFu, h2 = h >> 32;
        for (uint64_t i = 0; i < k; ++i) {
          const uint64_t p = (h1 + i * h2) % bits;
          want[p >> 3] |= static_cast<uint8_t>(1u << (p & 7));
        }
        shape.add(got.data(), h);
        CHECK(shape.may_contain(got.data(), h));
      }
      CHECK(want == got);
    }
  }
  const std::vector<int32_t> offsets = {0, 3, 3, 12, 20};
  const std::string data = "abcdefghijklmnopqrst";
  std::vector<uint8_t> built;
  statecore::bloom_filter_build(offsets.data(), reinterpret_cast<const uint8_t*>(data.data()), 4,
                                10, &built);
  std::vector<uint8_t> want(statecore::bloom_filter_bytes(4, 10), 0);
  for (size_t i = 0; i < 4; ++i)
    statecore::bloom_add(want.data(), want.size(), 7,
                         statecore::xxh64(data.data() + offsets[i],
                                          static_cast<size_t>(offsets[i + 1] - offsets[i]), 0));
  CHECK(built == want);
  std::vector<uint64_t> probes;
  for (size_t i = 0; i < 4; ++i)
    probes.push_back(statecore::xxh64(data.data() + offsets[i],
                                      static_cast<size_t>(offsets[i + 1] - offsets[i]), 0));
  for (int r = 0; r < 500; ++r) probes.push_back(next());
  std::vector<uint8_t> hit(probes.size(), 2);
  statecore::bloom_probe_many(built.data(), built.size(), 7, probes.data(), probes.size(),
                              hit.data());
  for (size_t i = 0; i < probes.size(); ++i)
    CHECK_EQ(hit[i], static_cast<uint8_t>(
                         statecore::bloom_may_contain(built.data(), built.size(), 7, probes[i])));
  for (size_t i = 0; i < 4; ++i) CHECK_EQ(hit[i], uint8_t{1});
  statecore::bloom_filter_build(nullptr, nullptr, 0, 10, &built);
  CHECK(built == std::vector<uint8_t>(8, 0));
}

TEST_MAIN()
