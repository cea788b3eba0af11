// Key-group assignment, key-group ranges and operator indexes.
//
// A key group is the unit of state partitioning and rescaling (Flink KeyGroupRangeAssignment):
// every key maps to one key group in [0, max_parallelism); operator i of p owns one contiguous
// key-group range. Two assigners: Spark (kg = pmod(xxhash64(key, seed 42), max_parallelism),
// each column hashed as Spark SQL's XxHash64Function hashes the column type Spark would give it,
// so Spark SQL computes the same key group as a column) and Flink
// (kg = MathUtils.murmurHash(key.hashCode()) % max_parallelism over the boxed Java key). The
// per-type hashing of both: docs/formats.md "Key groups".
// Vectors: tests/data/spark_hashes.json, tests/data/spark_key_types.json (a real Spark 4.3),
// tests/data/flink_keygroups.json, tests/data/java_hash_codes.json (a real JVM).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace statecore {

// Upper bound of max parallelism (Flink KeyGroupRangeAssignment.UPPER_BOUND_MAX_PARALLELISM);
// key-group prefixes are at most 2 bytes because of it.
constexpr int32_t kUpperBoundMaxParallelism = 32768;
// Lower bound of the default max parallelism (Flink DEFAULT_LOWER_BOUND_MAX_PARALLELISM).
constexpr int32_t kDefaultLowerBoundMaxParallelism = 128;
// Seed Spark SQL's xxhash64() uses.
constexpr uint64_t kSparkXxhashSeed = 42;

enum class Assigner : uint8_t { Spark, Flink };

// Logical type of a key column (the backend's key_type, or one field of a multi-column key):
// decides the key serializer (key_codec.h) and the column's hash under each assigner (above).
enum class KeyType : uint8_t {
  Int32,
  Int64,
  String,
  Binary,
  UInt64,
  Float64,
  Bool,
  Timestamp,
  FixedSizeBinary
};

// Unit of a Timestamp key column's int64 value (counted from 1970-01-01 UTC).
enum class TimeUnit : uint8_t { Second, Milli, Micro, Nano };

// One key column: its type and the parameters of the parametrized types.
struct KeyColumn {
  KeyType type = KeyType::Int64;
  int32_t width = 0;                // FixedSizeBinary: bytes per key, >= 1
  TimeUnit unit = TimeUnit::Micro;  // Timestamp only
  bool operator==(const KeyColumn& o) const {
    return type == o.type && width == o.width && unit == o.unit;
  }
  bool operator!=(const KeyColumn& o) const { return !(*this == o); }
};

// The statecore name of a column type ("int32", "timestamp[us]", "fixed_size_binary[16]", ...),
// as statecore.key_types spells it; for error messages.
std::string key_column_name(const KeyColumn& c);

// Java doubleToLongBits of the canonical float64 key of `v`: -0.0 is keyed as 0.0 and every NaN
// as 0x7ff8000000000000 (what Spark's hash and grouping treat as equal).
uint64_t canonical_double_bits(double v) noexcept;

// Throws std::invalid_argument unless 0 < max_parallelism <= 32768.
void check_max_parallelism(int32_t max_parallelism);

// Spark SQL xxhash64() of one column value, as Spark returns it (signed); `seed` is 42 for the
// first column and the previous column's hash for the next ones.
int64_t spark_xxhash64_int32(int32_t v, uint64_t seed = kSparkXxhashSeed) noexcept;
int64_t spark_xxhash64_int64(int64_t v, uint64_t seed = kSparkXxhashSeed) noexcept;
int64_t spark_xxhash64_float64(double v, uint64_t seed = kSparkXxhashSeed) noexcept;
int64_t spark_xxhash64_bool(bool v, uint64_t seed = kSparkXxhashSeed) noexcept;
// string (UTF-8) / binary / fixed_size_binary
int64_t spark_xxhash64_bytes(const void* data, size_t size,
                             uint64_t seed = kSparkXxhashSeed) noexcept;

// The hash of one key fed column by column (a scalar key is one column), under one assigner:
// Spark chains xxhash64 seeds, Flink folds Java hash codes as TupleN.hashCode() (see the top of
// this file). add_int64 serves int64 and timestamp columns, add_binary binary and
// fixed_size_binary ones. Cheap to construct; not thread-safe (one per thread).
class KeyHasher {
 public:
  explicit KeyHasher(Assigner a) : assigner_(a) {}
  void add_int32(int32_t v) noexcept;
  void add_int64(int64_t v) noexcept;
  void add_uint64(uint64_t v) noexcept;
  void add_float64(double v) noexcept;  // canonicalized first (canonical_double_bits)
  void add_bool(bool v) noexcept;
  // UTF-8 bytes of a string. Flink hashes UTF-16 units, so malformed UTF-8 throws
  // std::invalid_argument there; Spark hashes the bytes as they are.
  void add_string(const char* utf8, size_t size);
  void add_binary(const void* data, size_t size) noexcept;
  // Key group of the columns added so far. Throws std::invalid_argument unless
  // 0 < max_parallelism <= 32768.
  int32_t key_group(int32_t max_parallelism) const;

 private:
  void add_java(int32_t h) noexcept { java_ = 31u * java_ + static_cast<uint32_t>(h); }
  Assigner assigner_;
  uint64_t spark_ = kSparkXxhashSeed;
  uint32_t java_ = 0;
};

// Key group of one key. `max_parallelism` in (0, 32768], else std::invalid_argument.
// Results are in [0, max_parallelism).
int32_t key_group_for_int32(Assigner a, int32_t key, int32_t max_parallelism);
int32_t key_group_for_int64(Assigner a, int64_t key, int32_t max_parallelism);
// `utf8` are the UTF-8 bytes of a string key. Flink hashes the UTF-16 String.hashCode() and so
// throws std::invalid_argument on malformed UTF-8; Spark hashes the bytes as they are.
int32_t key_group_for_string(Assigner a, const char* utf8, size_t size, int32_t max_parallelism);
// Raw binary key (also fixed_size_binary). Spark: xxhash64 of the bytes. Flink:
// java.util.Arrays.hashCode(byte[]) (see java_hash_bytes; the same choice as the Python reference
// statecore.key_groups).
int32_t key_group_for_binary(Assigner a, const void* data, size_t size, int32_t max_parallelism);
// uint64, float64 and bool keys as the top of this file says (a timestamp key is
// key_group_for_int64 of its value).
int32_t key_group_for_uint64(Assigner a, uint64_t key, int32_t max_parallelism);
int32_t key_group_for_float64(Assigner a, double key, int32_t max_parallelism);
int32_t key_group_for_bool(Assigner a, bool key, int32_t max_parallelism);

// Flink KeyGroupRangeAssignment.computeDefaultMaxParallelism:
// min(max(roundUpToPowerOfTwo(p + p/2), 128), 32768). Throws std::invalid_argument unless
// 0 < parallelism <= 32768.
int32_t default_max_parallelism(int32_t parallelism);

// Inclusive key-group range [start, end]; the empty range is (0, -1) as in Flink's
// KeyGroupRange.EMPTY_KEY_GROUP_RANGE.
struct KeyGroupRange {
  int32_t start = 0;
  int32_t end = -1;
  bool empty() const { return end < start; }
  int32_t size() const { return empty() ? 0 : end - start + 1; }
  bool contains(int32_t kg) const { return kg >= start && kg <= end; }
};

// Flink computeKeyGroupRangeForOperatorIndex: operator `operator_index` of `parallelism` owns
// [(i*maxP + p - 1) / p, ((i+1)*maxP - 1) / p]. Throws std::invalid_argument unless
// 0 < parallelism <= max_parallelism <= 32768 and 0 <= operator_index < parallelism.
KeyGroupRange key_group_range_for_operator(int32_t max_parallelism, int32_t parallelism,
                                           int32_t operator_index);

// Flink computeOperatorIndexForKeyGroup: kg * parallelism / max_parallelism. Throws
// std::invalid_argument unless 0 < parallelism <= max_parallelism <= 32768 and
// 0 <= key_group < max_parallelism.
int32_t operator_index_for_key_group(int32_t max_parallelism, int32_t parallelism,
                                     int32_t key_group);

}  // namespace statecore
