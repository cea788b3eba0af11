// Hash functions of the native core, all implemented from their public specifications and
// verified bit-exact in native/tests/test_hash.cpp against the Spark 4.3 / Flink vectors in
// tests/data/ and against the Python `xxhash` / `mmh3` packages.
//
// These are the primitives of key-group assignment (key_groups.h): Spark-compatible routing uses
// XXH64 with seed 42, Flink-compatible routing uses Java hashCode() followed by Flink's
// MathUtils.murmurHash.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace statecore {

// XXH64 (spec: github.com/Cyan4973/xxHash doc/xxhash_spec.md, "XXH64 algorithm") of `size` bytes
// at `data` with a 64-bit seed. Returns the canonical unsigned digest; Spark's `xxhash64(col)`
// equals `static_cast<int64_t>(xxh64(bytes, n, 42))`. `data` may be null when `size` is 0.
// Never throws.
uint64_t xxh64(const void* data, size_t size, uint64_t seed) noexcept;
// XXH64's final avalanche (spec step 6) of an accumulator.
inline uint64_t xxh64_avalanche(uint64_t acc) noexcept {
  acc ^= acc >> 33;
  acc *= 0xC2B2AE3D27D4EB4FULL;
  acc ^= acc >> 29;
  acc *= 0x165667B19E3779F9ULL;
  return acc ^ (acc >> 32);
}

// XXH64 of the 8 little-endian bytes of `lane` (= xxh64(&lane, 8, seed) on little-endian): the
// same steps without the length dispatch, for the per-row int64 key-group hash. Inline because
// batch kernels call it once per row (a call and the spec's constants reloaded were ~half of it).
inline uint64_t xxh64_u64(uint64_t lane, uint64_t seed) noexcept {
  constexpr uint64_t p1 = 0x9E3779B185EBCA87ULL, p2 = 0xC2B2AE3D27D4EB4FULL,
                     p4 = 0x85EBCA77C2B2AE63ULL, p5 = 0x27D4EB2F165667C5ULL;
  uint64_t r = lane * p2;
  r = ((r << 31) | (r >> 33)) * p1;  // round(0, lane)
  uint64_t acc = (seed + p5 + 8) ^ r;
  acc = ((acc << 27) | (acc >> 37)) * p1 + p4;
  return xxh64_avalanche(acc);
}

// XXH64 of the 4 little-endian bytes of `v` (= xxh64(&v, 4, seed) on little-endian; the spec's
// 4-byte tail step, then the avalanche): Spark's hashInt, once per row for int32 keys.
inline uint64_t xxh64_u32(uint32_t v, uint64_t seed) noexcept {
  constexpr uint64_t p1 = 0x9E3779B185EBCA87ULL, p2 = 0xC2B2AE3D27D4EB4FULL,
                     p3 = 0x165667B19E3779F9ULL, p5 = 0x27D4EB2F165667C5ULL;
  uint64_t acc = seed + p5 + 4;
  acc ^= static_cast<uint64_t>(v) * p1;
  acc = ((acc << 23) | (acc >> 41)) * p2 + p3;
  return xxh64_avalanche(acc);
}

// MurmurHash3_x86_32 (Austin Appleby's reference MurmurHash3.cpp) of `size` bytes with a 32-bit
// seed; the result as unsigned. `mmh3.hash(b, seed)` in Python is the same value as int32.
// Note: Spark's SQL `hash()` uses a non-standard tail for lengths not divisible by 4 and is NOT
// this function (Spark's Murmur3_x86_32.hashUnsafeBytes). `data` may be null when `size` is 0.
uint32_t murmur3_32(const void* data, size_t size, uint32_t seed) noexcept;

// Flink's MathUtils.murmurHash(int): one Murmur3 block over the 4 bytes of `code` (seed 0, length
// 4, fmix32), made non-negative: a negative result is negated, Integer.MIN_VALUE maps to 0.
// Result in [0, 2^31 - 1]. Equals abs(mmh3.hash(code as 4 LE bytes, 0)) with MIN -> 0.
int32_t flink_murmur_hash(int32_t code) noexcept;

// The raw (signed, before the abs step) value of flink_murmur_hash; exposed for the vectors in
// tests/data/flink_keygroups.json ("murmurRaw").
int32_t flink_murmur_hash_raw(int32_t code) noexcept;

// java.lang.Integer.hashCode(): the value itself.
inline int32_t java_hash_int32(int32_t v) noexcept { return v; }

// java.lang.Long.hashCode(): (int)(v ^ (v >>> 32)), so -1 -> 0 and
// Long.MIN_VALUE -> Integer.MIN_VALUE.
inline int32_t java_hash_int64(int64_t v) noexcept {
  const uint64_t u = static_cast<uint64_t>(v);
  return static_cast<int32_t>(static_cast<uint32_t>(u ^ (u >> 32)));
}

// java.lang.Double.hashCode(): (int)(bits ^ (bits >>> 32)) of doubleToLongBits(v), which maps
// every NaN to 0x7ff8000000000000 (so all NaNs hash alike; -0.0 and 0.0 differ, as in Java).
inline int32_t java_hash_float64(double v) noexcept {
  uint64_t u;
  if (v != v) {
    u = 0x7FF8000000000000ull;
  } else {
    static_assert(sizeof(double) == 8, "IEEE 754 binary64 expected");
    std::memcpy(&u, &v, 8);
  }
  return static_cast<int32_t>(static_cast<uint32_t>(u ^ (u >> 32)));
}

// java.lang.Boolean.hashCode(): 1231 for true, 1237 for false.
inline int32_t java_hash_bool(bool v) noexcept { return v ? 1231 : 1237; }

// java.lang.String.hashCode() of the string whose UTF-8 encoding is `utf8[0..size)`:
// s[0]*31^(n-1) + ... + s[n-1] over the UTF-16 code units of the string (code points above
// U+FFFF count as their surrogate pair), with int32 overflow (two's complement wrap).
// Throws std::invalid_argument when the bytes are not well-formed UTF-8 (truncated or invalid
// sequences, overlong forms, encoded surrogates, code points above U+10FFFF): Java would have
// replaced such bytes with U+FFFD, which no Python str key can produce, so they indicate bad input.
int32_t java_hash_string_utf8(const char* utf8, size_t size);

// java.util.Arrays.hashCode(byte[]): h = 1, then h = 31*h + b for every byte as a SIGNED Java
// byte, int32 overflow. Used for binary keys under the Flink assigner (as the Python reference
// statecore.key_groups.java_hash_code does), since a plain Java byte[] key would have an identity
// hashCode() and no reproducible key group.
int32_t java_hash_bytes(const void* data, size_t size) noexcept;

}  // namespace statecore
