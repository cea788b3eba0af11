// Key-group assignment after Flink KeyGroupRangeAssignment and Spark SQL xxhash64 (see
// key_groups.h for the formulas and the vectors they are tested against).
#include "statecore/key_groups.h"

#include <cstring>
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

std::string key_column_name(const KeyColumn& c) {
  switch (c.type) {
    case KeyType::Int32: return "int32";
    case KeyType::Int64: return "int64";
    case KeyType::String: return "string";
    case KeyType::Binary: return "binary";
    case KeyType::UInt64: return "uint64";
    case KeyType::Float64: return "float64";
    case KeyType::Bool: return "bool";
    case KeyType::Timestamp: {
      static const char* units[] = {"s", "ms", "us", "ns"};
      return std::string("timestamp[") + units[static_cast<int>(c.unit) & 3] + "]";
    }
    case KeyType::FixedSizeBinary: return "fixed_size_binary[" + std::to_string(c.width) + "]";
  }
  return "?";
}

uint64_t canonical_double_bits(double v) noexcept {
  if (v != v) return 0x7FF8000000000000ull;  // Java doubleToLongBits: one NaN
  if (v == 0.0) return 0;                    // -0.0 is the key 0.0
  uint64_t u;
  std::memcpy(&u, &v, 8);
  return u;
}

int64_t spark_xxhash64_int32(int32_t v, uint64_t seed) noexcept {
  return static_cast<int64_t>(xxh64_u32(static_cast<uint32_t>(v), seed));  // Spark hashInt
}

int64_t spark_xxhash64_int64(int64_t v, uint64_t seed) noexcept {
  return static_cast<int64_t>(xxh64_u64(static_cast<uint64_t>(v), seed));  // Spark hashLong
}

int64_t spark_xxhash64_float64(double v, uint64_t seed) noexcept {
  // Spark: d == -0.0d (true for both zeros) -> hashLong(0L), else doubleToLongBits(d).
  return spark_xxhash64_int64(static_cast<int64_t>(canonical_double_bits(v)), seed);
}

int64_t spark_xxhash64_bool(bool v, uint64_t seed) noexcept {
  return spark_xxhash64_int32(v ? 1 : 0, seed);
}

int64_t spark_xxhash64_bytes(const void* data, size_t size, uint64_t seed) noexcept {
  return static_cast<int64_t>(xxh64(data, size, seed));
}

void KeyHasher::add_int32(int32_t v) noexcept {
  if (assigner_ == Assigner::Spark) spark_ = static_cast<uint64_t>(spark_xxhash64_int32(v, spark_));
  else add_java(java_hash_int32(v));
}

void KeyHasher::add_int64(int64_t v) noexcept {
  if (assigner_ == Assigner::Spark) spark_ = static_cast<uint64_t>(spark_xxhash64_int64(v, spark_));
  else add_java(java_hash_int64(v));
}

void KeyHasher::add_uint64(uint64_t v) noexcept { add_int64(static_cast<int64_t>(v)); }

void KeyHasher::add_float64(double v) noexcept {
  add_int64(static_cast<int64_t>(canonical_double_bits(v)));  // Spark hashLong, Java Double
}

void KeyHasher::add_bool(bool v) noexcept {
  if (assigner_ == Assigner::Spark) spark_ = static_cast<uint64_t>(spark_xxhash64_bool(v, spark_));
  else add_java(java_hash_bool(v));
}

void KeyHasher::add_string(const char* utf8, size_t size) {
  if (assigner_ == Assigner::Spark)
    spark_ = static_cast<uint64_t>(spark_xxhash64_bytes(utf8, size, spark_));
  else add_java(java_hash_string_utf8(utf8, size));
}

void KeyHasher::add_binary(const void* data, size_t size) noexcept {
  if (assigner_ == Assigner::Spark)
    spark_ = static_cast<uint64_t>(spark_xxhash64_bytes(data, size, spark_));
  else add_java(java_hash_bytes(data, size));
}

int32_t KeyHasher::key_group(int32_t max_parallelism) const {
  check_max_parallelism(max_parallelism);
  if (assigner_ == Assigner::Spark)
    return spark_pmod(static_cast<int64_t>(spark_), max_parallelism);
  return flink_kg(static_cast<int32_t>(java_), max_parallelism);
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

int32_t key_group_for_uint64(Assigner a, uint64_t key, int32_t max_parallelism) {
  return key_group_for_int64(a, static_cast<int64_t>(key), max_parallelism);
}

int32_t key_group_for_float64(Assigner a, double key, int32_t max_parallelism) {
  return key_group_for_int64(a, static_cast<int64_t>(canonical_double_bits(key)), max_parallelism);
}

int32_t key_group_for_bool(Assigner a, bool key, int32_t max_parallelism) {
  KeyHasher h(a);
  h.add_bool(key);
  return h.key_group(max_parallelism);
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
