// XXH64, Murmur3_x86_32, Flink's murmurHash and Java hashCode() of UTF-8 strings.
// Specs: xxHash doc/xxhash_spec.md (XXH64), smhasher MurmurHash3.cpp (MurmurHash3_x86_32),
// Flink flink-core org.apache.flink.util.MathUtils#murmurHash, java.lang.String#hashCode.
#include "statecore/hash.h"

#include <cstring>
#include <stdexcept>
#include <string>

#include "statecore/detail/bytes.h"

namespace statecore {
namespace {

constexpr uint64_t kP64_1 = 0x9E3779B185EBCA87ULL;
constexpr uint64_t kP64_2 = 0xC2B2AE3D27D4EB4FULL;
constexpr uint64_t kP64_3 = 0x165667B19E3779F9ULL;
constexpr uint64_t kP64_4 = 0x85EBCA77C2B2AE63ULL;
constexpr uint64_t kP64_5 = 0x27D4EB2F165667C5ULL;

inline uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
inline uint32_t rotl32(uint32_t x, int r) { return (x << r) | (x >> (32 - r)); }

// Both specs read input words little-endian regardless of the host byte order or alignment.
using detail::load_le32;
using detail::load_le64;

inline uint64_t xxh64_round(uint64_t acc, uint64_t lane) {
  acc += lane * kP64_2;
  acc = rotl64(acc, 31);
  return acc * kP64_1;
}
inline uint64_t xxh64_merge(uint64_t acc, uint64_t val) {
  acc ^= xxh64_round(0, val);
  return acc * kP64_1 + kP64_4;
}

inline uint32_t fmix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85ebca6bU;
  h ^= h >> 13;
  h *= 0xc2b2ae35U;
  h ^= h >> 16;
  return h;
}

constexpr uint32_t kM3_C1 = 0xcc9e2d51U;
constexpr uint32_t kM3_C2 = 0x1b873593U;

inline uint32_t murmur3_mix_k(uint32_t k) {
  k *= kM3_C1;
  k = rotl32(k, 15);
  return k * kM3_C2;
}
inline uint32_t murmur3_mix_h(uint32_t h, uint32_t k) {
  h ^= murmur3_mix_k(k);
  h = rotl32(h, 13);
  return h * 5 + 0xe6546b64U;
}

[[noreturn]] void utf8_fail(size_t offset, const char* what) {
  throw std::invalid_argument(std::string("java_hash_string_utf8: invalid UTF-8 (") + what +
                              ") at byte offset " + std::to_string(offset));
}

}  // namespace

uint64_t xxh64(const void* data, size_t size, uint64_t seed) noexcept {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  const uint8_t* const end = p + size;
  uint64_t acc;
  if (size >= 32) {
    uint64_t v1 = seed + kP64_1 + kP64_2;
    uint64_t v2 = seed + kP64_2;
    uint64_t v3 = seed;
    uint64_t v4 = seed - kP64_1;
    const uint8_t* const limit = end - 32;
    do {
      v1 = xxh64_round(v1, load_le64(p));
      v2 = xxh64_round(v2, load_le64(p + 8));
      v3 = xxh64_round(v3, load_le64(p + 16));
      v4 = xxh64_round(v4, load_le64(p + 24));
      p += 32;
    } while (p <= limit);
    acc = rotl64(v1, 1) + rotl64(v2, 7) + rotl64(v3, 12) + rotl64(v4, 18);
    acc = xxh64_merge(acc, v1);
    acc = xxh64_merge(acc, v2);
    acc = xxh64_merge(acc, v3);
    acc = xxh64_merge(acc, v4);
  } else {
    acc = seed + kP64_5;
  }
  acc += static_cast<uint64_t>(size);
  while (end - p >= 8) {
    acc ^= xxh64_round(0, load_le64(p));
    acc = rotl64(acc, 27) * kP64_1 + kP64_4;
    p += 8;
  }
  if (end - p >= 4) {
    acc ^= static_cast<uint64_t>(load_le32(p)) * kP64_1;
    acc = rotl64(acc, 23) * kP64_2 + kP64_3;
    p += 4;
  }
  while (p < end) {
    acc ^= static_cast<uint64_t>(*p) * kP64_5;
    acc = rotl64(acc, 11) * kP64_1;
    ++p;
  }
  return xxh64_avalanche(acc);
}

uint32_t murmur3_32(const void* data, size_t size, uint32_t seed) noexcept {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  const size_t nblocks = size / 4;
  uint32_t h = seed;
  for (size_t i = 0; i < nblocks; ++i) h = murmur3_mix_h(h, load_le32(p + 4 * i));
  const uint8_t* tail = p + nblocks * 4;
  uint32_t k = 0;
  switch (size & 3) {
    case 3: k ^= static_cast<uint32_t>(tail[2]) << 16; [[fallthrough]];
    case 2: k ^= static_cast<uint32_t>(tail[1]) << 8; [[fallthrough]];
    case 1: k ^= tail[0]; h ^= murmur3_mix_k(k);
  }
  // The reference mixes the length in as a 32-bit int.
  h ^= static_cast<uint32_t>(size);
  return fmix32(h);
}

int32_t flink_murmur_hash_raw(int32_t code) noexcept {
  uint32_t h = murmur3_mix_h(0, static_cast<uint32_t>(code));
  h ^= 4;
  return static_cast<int32_t>(fmix32(h));
}

int32_t flink_murmur_hash(int32_t code) noexcept {
  const int32_t raw = flink_murmur_hash_raw(code);
  if (raw >= 0) return raw;
  if (raw != INT32_MIN) return -raw;
  return 0;
}

int32_t java_hash_bytes(const void* data, size_t size) noexcept {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  uint32_t h = 1;
  for (size_t i = 0; i < size; ++i)
    h = h * 31 + static_cast<uint32_t>(static_cast<int32_t>(static_cast<int8_t>(p[i])));
  return static_cast<int32_t>(h);
}

int32_t java_hash_string_utf8(const char* utf8, size_t size) {
  const uint8_t* p = reinterpret_cast<const uint8_t*>(utf8);
  uint32_t h = 0;  // unsigned so the int32 wrap-around of Java is defined behaviour here
  size_t i = 0;
  while (i < size) {
    const uint8_t b0 = p[i];
    uint32_t cp;
    size_t len;
    if (b0 < 0x80) {
      h = h * 31 + b0;
      ++i;
      continue;
    } else if ((b0 & 0xE0) == 0xC0) {
      cp = b0 & 0x1F;
      len = 2;
    } else if ((b0 & 0xF0) == 0xE0) {
      cp = b0 & 0x0F;
      len = 3;
    } else if ((b0 & 0xF8) == 0xF0) {
      cp = b0 & 0x07;
      len = 4;
    } else {
      utf8_fail(i, "unexpected lead byte");
    }
    if (size - i < len) utf8_fail(i, "truncated sequence");
    for (size_t j = 1; j < len; ++j) {
      const uint8_t b = p[i + j];
      if ((b & 0xC0) != 0x80) utf8_fail(i, "bad continuation byte");
      cp = (cp << 6) | (b & 0x3F);
    }
    static constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len]) utf8_fail(i, "overlong form");
    if (cp >= 0xD800 && cp <= 0xDFFF) utf8_fail(i, "encoded surrogate");
    if (cp > 0x10FFFF) utf8_fail(i, "code point above U+10FFFF");
    if (cp <= 0xFFFF) {
      h = h * 31 + cp;
    } else {
      const uint32_t v = cp - 0x10000;
      h = h * 31 + (0xD800 + (v >> 10));
      h = h * 31 + (0xDC00 + (v & 0x3FF));
    }
    i += len;
  }
  return static_cast<int32_t>(h);
}

}  // namespace statecore
