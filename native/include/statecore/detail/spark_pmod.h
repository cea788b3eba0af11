// Spark's pmod of a 64-bit hash by a max parallelism fixed for a whole batch, without a division
// per row (engine internal; used by the key-group passes of key_columns.cpp).
#pragma once
#include <cstdint>

namespace statecore {
namespace detail {

// pmod(h, m) = ((h % m) + m) % m with Java's truncating % (Spark's Pmod expression): the
// mathematical h mod m in [0, m), for 1 <= m <= 2^31 - 1 and any int64 h.
//
// Lemire, Kaser and Kurz, "Faster Remainder by Direct Computation" (2019), fastmod_u64: with
// M = ceil(2^128 / m), u mod m = ((M * u mod 2^128) * m) >> 128, exact for every 64-bit u
// (their Theorem 1 with F = 128 >= 64 + log2(m)). A negative h is u = h + 2^64 as unsigned,
// so h mod m = (u mod m - 2^64 mod m) mod m. A 64-bit division a row would dominate an int64
// row's key-group step at a max parallelism that is not a power of two (where pmod is a mask).
class SparkPmod {
 public:
  explicit SparkPmod(uint32_t m)
      : m_(m),
        // ~0 / m + 1 = ceil(2^128 / m) for every m > 1; for m == 1 it wraps to 0, which makes
        // every remainder 0, as it should be.
        M_(~static_cast<unsigned __int128>(0) / m + 1),
        wrap_(static_cast<uint32_t>((~uint64_t{0} % m + 1) % m)) {}

  uint32_t operator()(uint64_t h) const {
    using u128 = unsigned __int128;
    const u128 low = M_ * h;  // the fraction h / m, scaled by 2^128
    const u128 bottom = (static_cast<u128>(static_cast<uint64_t>(low)) * m_) >> 64;
    const u128 top = static_cast<u128>(static_cast<uint64_t>(low >> 64)) * m_;
    const uint32_t r = static_cast<uint32_t>((bottom + top) >> 64);  // (low * m) >> 128
    if (static_cast<int64_t>(h) >= 0) return r;
    return r >= wrap_ ? r - wrap_ : r + m_ - wrap_;
  }

 private:
  uint64_t m_;
  unsigned __int128 M_;
  uint32_t wrap_;  // 2^64 mod m
};

}  // namespace detail
}  // namespace statecore
