// Unaligned loads and stores of fixed-width integers, in one place for the whole engine.
//
// Two families, because two kinds of bytes exist:
//  * host order (load_u32, store_u32, load_u64, store_u64): the engine's own memory (flat map
//    slots), which never leaves the process;
//  * little-endian (load_le32, load_le64, store_le32, store_le64, le32/le64/be64): bytes
//    an external definition fixes whatever the host -- Arrow buffers, stored values, the
//    checkpoint format, the XXH64 and Murmur3 specs.
// All go through memcpy, which GCC turns into one unaligned load or store (GCC does not merge a
// byte-by-byte loop into one); on the
// little-endian hosts the build targets the le* conversions are no-ops.
#pragma once
#include <cstdint>
#include <cstring>

namespace statecore {
namespace detail {

inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline void store_u32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }
inline uint64_t load_u64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
inline void store_u64(uint8_t* p, uint64_t v) { std::memcpy(p, &v, 8); }

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
constexpr bool kBigEndianHost = true;
#else
constexpr bool kBigEndianHost = false;
#endif

inline uint64_t le64(uint64_t v) { return kBigEndianHost ? __builtin_bswap64(v) : v; }
inline uint32_t le32(uint32_t v) { return kBigEndianHost ? __builtin_bswap32(v) : v; }
// Big-endian is little-endian swapped, whatever the host.
inline uint64_t be64(uint64_t v) { return __builtin_bswap64(le64(v)); }

inline uint32_t load_le32(const uint8_t* p) { return le32(load_u32(p)); }
inline uint64_t load_le64(const uint8_t* p) { return le64(load_u64(p)); }
inline void store_le32(uint8_t* p, uint32_t v) { store_u32(p, le32(v)); }
inline void store_le64(uint8_t* p, uint64_t v) { store_u64(p, le64(v)); }

// memcpy of a short run of bytes without a call: keys and values are mostly 1-16 bytes, where
// a call to memcpy with a run-time size costs more than the copy (the sorted-run builder makes
// two such copies per entry listed). Two overlapping
// fixed-size moves cover 4-16 bytes.
inline void copy_small(uint8_t* dst, const uint8_t* src, size_t n) {
  if (n >= 8 && n <= 16) {
    store_u64(dst, load_u64(src));
    store_u64(dst + n - 8, load_u64(src + n - 8));
  } else if (n >= 4 && n < 8) {
    store_u32(dst, load_u32(src));
    store_u32(dst + n - 4, load_u32(src + n - 4));
  } else if (n > 16) {
    std::memcpy(dst, src, n);
  } else {
    for (size_t i = 0; i < n; ++i) dst[i] = src[i];
  }
}

}  // namespace detail
}  // namespace statecore
