// Default key hash of the state map (engine internal).
//
// Why not XXH64 from hash.h: key-group assignment is `pmod(xxhash64(key, 42), maxParallelism)`,
// so inside one key group's map the low bits of that hash are constant for all keys. The map
// hashes the whole encoded key (prefix, key, namespace) with an unrelated function instead, so
// its bucket index never correlates with the key group. Quality target: good avalanche for
// short keys (8-40 bytes); not a cryptographic or a persisted hash (never written to disk, so it
// may change between versions).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace statecore {
namespace detail {

// MurmurHash3 fmix64 finalizer (Austin Appleby, public domain): full avalanche of 64 bits.
inline uint64_t fmix64(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdULL;
  k ^= k >> 33;
  k *= 0xc4ceb9fe1a85ec53ULL;
  k ^= k >> 33;
  return k;
}

// MurmurHash3 fmix32 finalizer: applied to injected hashes so weak ones (e.g. identity on an
// integer) still spread over the low bits that select the bucket (as Flink's MathUtils.bitMix).
inline uint32_t fmix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85ebca6bU;
  h ^= h >> 13;
  h *= 0xc2b2ae35U;
  h ^= h >> 16;
  return h;
}

inline uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

inline bool little_endian() {
  const uint16_t one = 1;
  uint8_t b;
  std::memcpy(&b, &one, 1);
  return b == 1;
}
inline uint64_t tail_word(const uint8_t* p, size_t n) {
  uint64_t w = 0;
  std::memcpy(&w, p, n);
  return w;
}

// 64x64 -> 128-bit multiply folded by xor of the halves (wyhash's "mum"): one multiply mixes
// every input bit into the middle bits of both halves.
// On x86-64 one `mul` in inline assembly: from the __int128 product GCC 12 stores the low half
// to the stack and loads it back before the xor (two extra memory operations a multiply in the
// batch kernels' key hasher).
[[gnu::always_inline]] inline uint64_t mum_fold(uint64_t a, uint64_t b) {
#if defined(__x86_64__) && defined(__GNUC__)
  uint64_t lo, hi;
  __asm__("mulq %3" : "=a"(lo), "=d"(hi) : "%0"(a), "rm"(b) : "cc");
  return lo ^ hi;
#else
  const unsigned __int128 r = static_cast<unsigned __int128>(a) * b;
  return static_cast<uint64_t>(r) ^ static_cast<uint64_t>(r >> 64);
#endif
}

// Keys of 9-16 bytes (the common int64 key with its key-group prefix and void namespace): two
// overlapping 8-byte reads, each xored with its own constant, then two folded 128-bit
// multiplies, the length mixed into the second (the shape of wyhash's short-key path,
// github.com/wangyi-fudan/wyhash): far fewer instructions than the word loop below for these
// sizes, and it selects the slot of every batch row.
//
// short_key_hash of a key whose first 8 bytes, read as a host-order word, are `a` and whose last
// 8 are `b`: the batch kernels build both words of an int64 key in registers.
[[gnu::always_inline]] inline uint32_t short_key_hash_words(uint64_t a, uint64_t b, size_t size) {
  const uint64_t h = mum_fold(a ^ 0xa0761d6478bd642fULL, b ^ 0xe7037ed1a0b428dbULL);
  const uint64_t g =
      mum_fold(h ^ 0x8ebc6af09c88c6e3ULL, static_cast<uint64_t>(size) ^ 0x589965cc75374cc3ULL);
  return static_cast<uint32_t>(g ^ (g >> 32));
}
[[gnu::always_inline]] inline uint32_t short_key_hash(const uint8_t* data, size_t size) {
  uint64_t a, b;
  std::memcpy(&a, data, 8);
  std::memcpy(&b, data + size - 8, 8);
  return short_key_hash_words(a, b, size);
}

// Keys of 4-8 bytes (an int32 key with its prefix and the VoidNamespace: 6 or 7): the first and
// last 4 bytes (overlapping below 8) as short_key_hash's two words, instead of the word loop's
// byte-by-byte tail.
[[gnu::always_inline]] inline uint32_t tiny_key_hash(const uint8_t* data, size_t size) {
  uint32_t a, b;
  std::memcpy(&a, data, 4);
  std::memcpy(&b, data + size - 4, 4);
  return short_key_hash_words(a, b, size);
}

// Keys of 17-24 bytes (an int64 key with an int64 namespace, e.g. a window start: 17 bytes with
// the prefix; short string keys): three 8-byte reads (the last overlapping the middle one), two
// folded multiplies as short_key_hash, the length in the second (wyhash's 17-48 byte shape,
// one round), cheaper than the word loop for these sizes.
inline uint32_t medium_key_hash(const uint8_t* data, size_t size) {
  uint64_t a, b, c;
  std::memcpy(&a, data, 8);
  std::memcpy(&b, data + 8, 8);
  std::memcpy(&c, data + size - 8, 8);
  const uint64_t h = mum_fold(a ^ 0xa0761d6478bd642fULL, b ^ 0xe7037ed1a0b428dbULL);
  const uint64_t g =
      mum_fold(c ^ 0x8ebc6af09c88c6e3ULL, h ^ static_cast<uint64_t>(size) ^ 0x589965cc75374cc3ULL);
  return static_cast<uint32_t>(g ^ (g >> 32));
}

// 8-byte-word multiply/rotate accumulation (the XXH64 round shape) over the bytes, the tail
// packed into one last word, then fmix64; folded to 32 bits by xor of the halves. Keys of 4-8
// bytes take tiny_key_hash, of 9-16 short_key_hash, of 17-24 medium_key_hash.
inline uint32_t default_key_hash(const uint8_t* data, size_t size) {
  if (size >= 4 && size <= 8) return tiny_key_hash(data, size);
  if (size > 8 && size <= 16) return short_key_hash(data, size);
  if (size > 16 && size <= 24) return medium_key_hash(data, size);
  const uint64_t p1 = 0x9E3779B185EBCA87ULL;
  const uint64_t p2 = 0xC2B2AE3D27D4EB4FULL;
  uint64_t h = 0x27D4EB2F165667C5ULL ^ (static_cast<uint64_t>(size) * p1);
  size_t n = size;
  const uint8_t* p = data;
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h ^= rotl64(w * p2, 31) * p1;
    h = rotl64(h, 27) * p1 + 0x85EBCA77C2B2AE63ULL;
    p += 8;
    n -= 8;
  }
  if (n > 0) {
    uint64_t w = 0;
    if (size >= 8) {
      // The tail as the last 8 bytes shifted down: on little-endian the same word as copying the
      // n tail bytes (memcpy with a variable size is a library call per key).
      std::memcpy(&w, data + size - 8, 8);
      w = little_endian() ? w >> (8 * (8 - n)) : tail_word(p, n);
    } else {
      std::memcpy(&w, p, n);
    }
    h ^= rotl64((w ^ (static_cast<uint64_t>(n) << 56)) * p2, 31) * p1;
    h = rotl64(h, 27) * p1 + 0x85EBCA77C2B2AE63ULL;
  }
  h = fmix64(h);
  return static_cast<uint32_t>(h ^ (h >> 32));
}

}  // namespace detail
}  // namespace statecore
