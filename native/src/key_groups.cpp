// Key-group assignment after Flink KeyGroupRangeAssignment and Spark SQL xxhash64 (see
// key_groups.h for the formulas and the vectors they are tested against).
#include "statecore/key_groups.h"

#include <stdexcept>
#include <string>

#include "statecore/hash.h"

namespace statecore {
namespace {

inline int32_t spark_pmod(int64_t h, int32_t m) {
  // Spark's pmod: ((h % m) + m) % m, so the result is non-negative for negative hashes.
  const int64_t r = h % m;
  return static_cast<int32_t>(r < 0 ? r + m : r);
}

inline int32_t flink_kg(int32_t java_hash, int32_t m) { return flink_murmur_hash(java_hash) % m; }

[[noreturn]] void bad(const std::string& msg) { throw std::invalid_argument(msg); }

void check_parallelism_pair(int32_t max_parallelism, int32_t parallelism) {
  check_max_parallelism(max_parallelism);
  if (parallelism <= 0 || parallelism > max_parallelism)
    bad("parallelism must satisfy 0 < parallelism <= max_parallelism (" +
        std::to_string(max_parallelism) + "), got " + std::to_string(parallelism));
}

}  // namespace

void check_max_parallelism(int32_t max_parallelism) {
  if (max_parallelism <= 0 || max_parallelism > kUpperBoundMaxParallelism)
    bad("max_parallelism must satisfy 0 < max_parallelism <= 32768, got " +
        std::to_string(max_parallelism));
}

int64_t spark_xxhash64_int32(int32_t v) noexcept {
  const uint32_t u = static_cast<uint32_t>(v);
  const uint8_t b[4] = {static_cast<uint8_t>(u), static_cast<uint8_t>(u >> 8),
                        static_cast<uint8_t>(u >> 16), static_cast<uint8_t>(u >> 24)};
  return static_cast<int64_t>(xxh64(b, 4, kSparkXxhashSeed));
}

int64_t spark_xxhash64_int64(int64_t v) noexcept {
  const uint64_t u = static_cast<uint64_t>(v);
  uint8_t b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(u >> (8 * i));
  return static_cast<int64_t>(xxh64(b, 8, kSparkXxhashSeed));
}

int64_t spark_xxhash64_bytes(const void* data, size_t size) noexcept {
  return static_cast<int64_t>(xxh64(data, size, kSparkXxhashSeed));
}

int32_t key_group_for_int32(Assigner a, int32_t key, int32_t max_parallelism) {
  check_max_parallelism(max_parallelism);
  if (a == Assigner::Spark) return spark_pmod(spark_xxhash64_int32(key), max_parallelism);
  return flink_kg(java_hash_int32(key), max_parallelism);
}

int32_t key_group_for_int64(Assigner a, int64_t key, int32_t max_parallelism) {
  check_max_parallelism(max_parallelism);
  if (a == Assigner::Spark) return spark_pmod(spark_xxhash64_int64(key), max_parallelism);
  return flink_kg(java_hash_int64(key), max_parallelism);
}

int32_t key_group_for_string(Assigner a, const char* utf8, size_t size, int32_t max_parallelism) {
  check_max_parallelism(max_parallelism);
  if (a == Assigner::Spark) return spark_pmod(spark_xxhash64_bytes(utf8, size), max_parallelism);
  return flink_kg(java_hash_string_utf8(utf8, size), max_parallelism);
}

int32_t key_group_for_binary(Assigner a, const void* data, size_t size, int32_t max_parallelism) {
  check_max_parallelism(max_parallelism);
  if (a == Assigner::Spark) return spark_pmod(spark_xxhash64_bytes(data, size), max_parallelism);
  return flink_kg(java_hash_bytes(data, size), max_parallelism);
}

int32_t default_max_parallelism(int32_t parallelism) {
  if (parallelism <= 0 || parallelism > kUpperBoundMaxParallelism)
    bad("parallelism must satisfy 0 < parallelism <= 32768, got " + std::to_string(parallelism));
  // Flink MathUtils.roundUpToPowerOfTwo on p + p/2 (<= 49152, so no int32 overflow).
  uint32_t x = static_cast<uint32_t>(parallelism + parallelism / 2) - 1;
  x |= x >> 1;
  x |= x >> 2;
  x |= x >> 4;
  x |= x >> 8;
  x |= x >> 16;
  const int64_t pow2 = static_cast<int64_t>(x) + 1;
  int64_t r = pow2 < kDefaultLowerBoundMaxParallelism ? kDefaultLowerBoundMaxParallelism : pow2;
  if (r > kUpperBoundMaxParallelism) r = kUpperBoundMaxParallelism;
  return static_cast<int32_t>(r);
}

KeyGroupRange key_group_range_for_operator(int32_t max_parallelism, int32_t parallelism,
                                           int32_t operator_index) {
  check_parallelism_pair(max_parallelism, parallelism);
  if (operator_index < 0 || operator_index >= parallelism)
    bad("operator_index must satisfy 0 <= operator_index < parallelism (" +
        std::to_string(parallelism) + "), got " + std::to_string(operator_index));
  const int64_t maxp = max_parallelism, p = parallelism, i = operator_index;
  KeyGroupRange r;
  r.start = static_cast<int32_t>((i * maxp + p - 1) / p);
  r.end = static_cast<int32_t>(((i + 1) * maxp - 1) / p);
  return r;
}

int32_t operator_index_for_key_group(int32_t max_parallelism, int32_t parallelism,
                                     int32_t key_group) {
  check_parallelism_pair(max_parallelism, parallelism);
  if (key_group < 0 || key_group >= max_parallelism)
    bad("key_group must satisfy 0 <= key_group < max_parallelism (" +
        std::to_string(max_parallelism) + "), got " + std::to_string(key_group));
  return static_cast<int32_t>(static_cast<int64_t>(key_group) * parallelism / max_parallelism);
}

}  // namespace statecore
