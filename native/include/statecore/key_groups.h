// Key-group assignment, key-group ranges and operator indexes.
//
// A key group is the unit of state partitioning and rescaling (Flink KeyGroupRangeAssignment):
// every key maps to one key group in [0, max_parallelism); operator i of p owns one contiguous
// key-group range. Two assigners are supported:
//  - Spark:  kg = pmod(xxhash64(key bytes, seed 42) as int64, max_parallelism), with Spark SQL's
//            byte encodings (int -> 4 bytes LE, bigint -> 8 bytes LE, string -> UTF-8, binary ->
//            raw), so Spark SQL can compute the same key group as a column (see spark.md).
//  - Flink:  kg = MathUtils.murmurHash(key.hashCode()) % max_parallelism (Integer, Long, String;
//            binary keys use java.util.Arrays.hashCode(byte[])).
// Vectors: tests/data/spark_hashes.json, tests/data/flink_keygroups.json.
#pragma once
#include <cstddef>
#include <cstdint>

namespace statecore {

// Upper bound of max parallelism (Flink KeyGroupRangeAssignment.UPPER_BOUND_MAX_PARALLELISM);
// key-group prefixes are at most 2 bytes because of it.
constexpr int32_t kUpperBoundMaxParallelism = 32768;
// Lower bound of the default max parallelism (Flink DEFAULT_LOWER_BOUND_MAX_PARALLELISM).
constexpr int32_t kDefaultLowerBoundMaxParallelism = 128;
// Seed Spark SQL's xxhash64() uses.
constexpr uint64_t kSparkXxhashSeed = 42;

enum class Assigner : uint8_t { Spark, Flink };

// Logical key type of a keyed backend (the backend's key_type): decides the key serializer
// (key_codec.h) and the key's hash under each assigner.
enum class KeyType : uint8_t { Int32, Int64, String, Binary };

// Throws std::invalid_argument unless 0 < max_parallelism <= 32768.
void check_max_parallelism(int32_t max_parallelism);

// Spark SQL xxhash64() of one column value (seed 42), as Spark returns it (signed).
int64_t spark_xxhash64_int32(int32_t v) noexcept;
int64_t spark_xxhash64_int64(int64_t v) noexcept;
int64_t spark_xxhash64_bytes(const void* data, size_t size) noexcept;  // string (UTF-8) / binary

// Key group of one key. `max_parallelism` in (0, 32768], else std::invalid_argument.
// Results are in [0, max_parallelism).
int32_t key_group_for_int32(Assigner a, int32_t key, int32_t max_parallelism);
int32_t key_group_for_int64(Assigner a, int64_t key, int32_t max_parallelism);
// `utf8` are the UTF-8 bytes of a string key. Flink hashes the UTF-16 String.hashCode() and so
// throws std::invalid_argument on malformed UTF-8; Spark hashes the bytes as they are.
int32_t key_group_for_string(Assigner a, const char* utf8, size_t size, int32_t max_parallelism);
// Raw binary key. Spark: xxhash64 of the bytes. Flink: java.util.Arrays.hashCode(byte[]) (see
// java_hash_bytes; the same choice as the Python reference statecore.key_groups).
int32_t key_group_for_binary(Assigner a, const void* data, size_t size, int32_t max_parallelism);

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
