// Bit-exactness of the hash functions (hash.h) and key-group assignment (key_groups.h).
// Vectors come from tests/data/spark_hashes.json (real Spark 4.3.0) and
// tests/data/flink_keygroups.json (real Flink), copied here verbatim; the random cross-checks were
// generated in Python (xxhash 3.x `xxh64_intdigest`, mmh3 5.x `hash(...,
// signed=False)`) over the splitmix64 input stream defined below, so they are reproducible.
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "check.h"
#include "statecore/hash.h"
#include "statecore/key_groups.h"

using namespace statecore;

namespace {

std::vector<uint8_t> unhex(const char* hex) {
  std::vector<uint8_t> out;
  for (size_t i = 0; hex[i] && hex[i + 1]; i += 2) {
    char b[3] = {hex[i], hex[i + 1], 0};
    out.push_back(static_cast<uint8_t>(std::strtoul(b, nullptr, 16)));
  }
  return out;
}

uint64_t le_value(const std::vector<uint8_t>& b) {
  uint64_t v = 0;
  for (size_t i = b.size(); i-- > 0;) v = (v << 8) | b[i];
  return v;
}

// tests/data/spark_hashes.json: section, bytes_hex, xxhash64 (Spark, seed 42),
// pmod_xxhash64_128, python_mmh3_hash_seed42 (standard Murmur3_x86_32, seed 42).
struct SparkVec {
  const char* section;
  const char* hex;
  int64_t xxhash64;
  int32_t pmod128;
  int32_t mmh3_42;
};
const SparkVec kSpark[] = {
    {"int", "00000000", 3614696996920510707LL, 115, 933211791},
    {"int", "01000000", -6698625589789238999LL, 41, -559580957},
    {"int", "ffffffff", 2017008487422258757LL, 69, -1604776387},
    {"int", "2a000000", -387659249110444264LL, 24, 29417773},
    {"int", "ffffff7f", 1508894993788531228LL, 28, 133916647},
    {"int", "00000080", 2073849959933241805LL, 77, 723455942},
    {"bigint", "0000000000000000", -5252525462095825812LL, 108, -1670924195},
    {"bigint", "0100000000000000", -7001672635703045582LL, 50, -1712319331},
    {"bigint", "ffffffffffffffff", 3858142552250413010LL, 82, -939490007},
    {"bigint", "0000000000010000", 1821704621099523357LL, 29, -1596767687},
    {"bigint", "ffffffffffffff7f", -3246596055638297850LL, 6, -1604625029},
    {"bigint", "0000000000000080", -8619748838626508300LL, 116, -853646085},
    {"string", "", -7444071767201028348LL, 4, 142593372},
    {"string", "61", -8582455328737087284LL, 76, -1293573533},
    {"string", "68656c6c6f", -4367754540140381902LL, 50, -488910111},
    {"string", "737061726b", -1960931134668248110LL, 82, -226056714},
    {"string", "6b65792d313233", -3420642646009697992LL, 56, -1494441064},
    {"string", "e697a5e69cace8aa9e", -619341062884681239LL, 105, -976822600},
    {"string", "f09f9880656d6f6a69", -2438606788636037276LL, 100, 176237116},
    {"binary", "", -7444071767201028348LL, 4, 142593372},
    {"binary", "61", -8582455328737087284LL, 76, -1293573533},
    {"binary", "68656c6c6f", -4367754540140381902LL, 50, -488910111},
    {"binary", "737061726b", -1960931134668248110LL, 82, -226056714},
    {"binary", "6b65792d313233", -3420642646009697992LL, 56, -1494441064},
    {"binary", "e697a5e69cace8aa9e", -619341062884681239LL, 105, -976822600},
    {"binary", "f09f9880656d6f6a69", -2438606788636037276LL, 100, 176237116},
    {"extra", "61626364", -6810745876291105281LL, 127, -396302900},
    {"extra", "6b65792d31323334", 244349232302564392LL, 40, 629718507},
    {"extra", "e697a5e69cac7878", -6683662414146641069LL, 83, -1168790594},
};

// tests/data/flink_keygroups.json "keys": type, key (decimal, or UTF-8 hex for String),
// hashCode, murmurRaw, murmurHash, keyGroup at maxP 128 / 4096 / 32768.
struct FlinkVec {
  const char* type;
  const char* key;
  int32_t hash_code;
  int32_t murmur_raw;
  int32_t murmur;
  int32_t kg128, kg4096, kg32768;
};
const FlinkVec kFlink[] = {
    {"Integer", "0", 0, 593689054, 593689054, 94, 2526, 31198},
    {"Integer", "1", 1, -68075478, 68075478, 86, 4054, 16342},
    {"Integer", "-1", -1, 1982413648, 1982413648, 80, 2896, 15184},
    {"Integer", "42", 42, -1134849565, 1134849565, 29, 3613, 28189},
    {"Integer", "2147483647", 2147483647, -1653689534, 1653689534, 62, 3262, 19646},
    {"Integer", "-2147483648", INT32_MIN, -1718298732, 1718298732, 108, 2156, 10348},
    {"Integer", "123456789", 123456789, -1088346449, 1088346449, 81, 2385, 22865},
    {"Long", "0", 0, 593689054, 593689054, 94, 2526, 31198},
    {"Long", "1", 1, -68075478, 68075478, 86, 4054, 16342},
    {"Long", "-1", 0, 593689054, 593689054, 94, 2526, 31198},
    {"Long", "1099511627776", 256, 1409940790, 1409940790, 54, 3382, 32054},
    {"Long", "9223372036854775807", INT32_MIN, -1718298732, 1718298732, 108, 2156, 10348},
    {"Long", "-9223372036854775808", INT32_MIN, -1718298732, 1718298732, 108, 2156, 10348},
    {"String", "", 0, 593689054, 593689054, 94, 2526, 31198},
    {"String", "61", 97, 1455541201, 1455541201, 81, 3025, 19409},
    {"String", "68656c6c6f", 99162322, 1715862179, 1715862179, 35, 2723, 31395},
    {"String", "666c696e6b", 97520992, -1330823394, 1330823394, 98, 226, 16610},
    {"String", "6b65792d313233", -816674364, 803508316, 803508316, 92, 92, 4188},
    {"String", "e697a5e69cace8aa9e", 25921943, 1333041691, 1333041691, 27, 2587, 6683},
    {"String", "f09f9880656d6f6a69", -1233692477, 1953262777, 1953262777, 57, 3257, 27833},
};

// splitmix64 (Steele et al.), the input generator shared with the Python script that produced
// the expected values: len = next() % (maxlen+1); len bytes = next() & 0xff each; seed = next().
struct SplitMix {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
};
constexpr uint64_t kFold = 0x100000001B3ULL;

}  // namespace

TEST(xxh64_spark_vectors) {
  for (const SparkVec& v : kSpark) {
    const std::vector<uint8_t> b = unhex(v.hex);
    CHECK_EQ(static_cast<int64_t>(xxh64(b.data(), b.size(), 42)), v.xxhash64);
    CHECK_EQ(spark_xxhash64_bytes(b.data(), b.size()), v.xxhash64);
  }
  // spark_hashes.json multi_column: xxhash64(7, 'a') chains the first column's hash as the seed.
  const uint8_t seven[4] = {7, 0, 0, 0};
  const uint64_t h1 = xxh64(seven, 4, 42);
  CHECK_EQ(static_cast<int64_t>(xxh64("a", 1, h1)), -6969754268886164170LL);
}

TEST(xxh64_known_answers) {
  // Reference values of the xxHash project (XXH64 of the empty input, seed 0 and 1).
  CHECK_EQ(xxh64(nullptr, 0, 0), 0xEF46DB3751D8E999ULL);
  CHECK_EQ(xxh64("", 0, 1), 0xD5AFBA1336A3BE4BULL);
}

TEST(xxh64_random_vs_python_xxhash) {
  static const uint64_t first[24] = {
      0x4a4e208377c63724ULL, 0xec4623fafb09ae5fULL, 0xd8a0692c15a20bafULL, 0x2700bd4f9695f5baULL,
      0x6f6cf8a0142e6604ULL, 0xd0f9cb42f7090479ULL, 0xc2f11e467c38122fULL, 0xff44ede71e8594c4ULL,
      0xeffa7132f8a1a263ULL, 0xb88b1d734e96de54ULL, 0x7cfc61a4ee268312ULL, 0x7c720384768edc71ULL,
      0xfa870b947c953cb3ULL, 0x2818b24247abfa58ULL, 0xa32db672967c9568ULL, 0x10a423d791021cb5ULL,
      0xf4e9674a352c49a7ULL, 0xab3509e9e9b44d96ULL, 0x088296195748e296ULL, 0x883d4914b64ca4d7ULL,
      0xfd1ff14641e72676ULL, 0x9c06f48d83c18b1fULL, 0x65142f42c2fe3e88ULL, 0xc8a4f97601e04319ULL};
  SplitMix r{20261120};
  uint64_t acc = 0;
  std::vector<uint8_t> buf;
  for (int i = 0; i < 3000; ++i) {
    const size_t n = r.next() % 301;
    buf.resize(n);
    for (size_t j = 0; j < n; ++j) buf[j] = static_cast<uint8_t>(r.next() & 0xFF);
    const uint64_t seed = r.next();
    const uint64_t h = xxh64(buf.data(), n, seed);
    if (i < 24) CHECK_EQ(h, first[i]);
    acc = (acc * kFold) ^ h;
  }
  CHECK_EQ(acc, 0x7b30ae2d15fd7014ULL);  // fold of all 3000 digests computed by python xxhash
}

TEST(murmur3_spark_vectors_standard_mmh3) {
  for (const SparkVec& v : kSpark) {
    const std::vector<uint8_t> b = unhex(v.hex);
    CHECK_EQ(static_cast<int32_t>(murmur3_32(b.data(), b.size(), 42)), v.mmh3_42);
  }
}

TEST(murmur3_random_vs_python_mmh3) {
  static const uint32_t first[24] = {
      0x5392dc8bU, 0x2ff28f39U, 0xcaa8d4c7U, 0x6734a2efU, 0xea9a4903U, 0x72989ff8U,
      0x6b1d885fU, 0x03fe4929U, 0x64fb46b5U, 0x576e8422U, 0xae47f056U, 0xb7660553U,
      0x96d7526dU, 0xca8e9c77U, 0xa7542822U, 0x5ab5b8faU, 0xc62d39cfU, 0x6525e44aU,
      0xf13d0b70U, 0xb41b500eU, 0x9c552d5bU, 0xedd66d1dU, 0xeb64a75eU, 0x18957531U};
  SplitMix r{777};
  uint64_t acc = 0;
  std::vector<uint8_t> buf;
  for (int i = 0; i < 3000; ++i) {
    const size_t n = r.next() % 65;
    buf.resize(n);
    for (size_t j = 0; j < n; ++j) buf[j] = static_cast<uint8_t>(r.next() & 0xFF);
    const uint32_t seed = static_cast<uint32_t>(r.next());
    const uint32_t h = murmur3_32(buf.data(), n, seed);
    if (i < 24) CHECK_EQ(h, first[i]);
    acc = (acc * kFold) ^ h;
  }
  CHECK_EQ(acc, 0x71e7ee63dbf44f98ULL);  // fold of all 3000 hashes computed by python mmh3
}

TEST(flink_murmur_hash_vectors) {
  // flink_keygroups.json murmurRaw_extra_for_mmh3_check: hashCode -> murmurRaw.
  static const int32_t extra[][2] = {{0, 593689054},
                                     {1, -68075478},
                                     {-1, 1982413648},
                                     {42, -1134849565},
                                     {2147483647, -1653689534},
                                     {INT32_MIN, -1718298732},
                                     {123456789, -1088346449},
                                     {97, 1455541201},
                                     {99162322, 1715862179},
                                     {97532676, -1410685909},
                                     {-1106180304, 219673002},
                                     {1072693248, -1409882055}};
  for (const auto& e : extra) {
    CHECK_EQ(flink_murmur_hash_raw(e[0]), e[1]);
    // The spec's identity: one Murmur3 block over the 4 LE bytes, seed 0.
    const uint32_t u = static_cast<uint32_t>(e[0]);
    const uint8_t b[4] = {static_cast<uint8_t>(u), static_cast<uint8_t>(u >> 8),
                          static_cast<uint8_t>(u >> 16), static_cast<uint8_t>(u >> 24)};
    CHECK_EQ(static_cast<int32_t>(murmur3_32(b, 4, 0)), e[1]);
    CHECK(flink_murmur_hash(e[0]) >= 0);
  }
}

TEST(flink_key_vectors) {
  for (const FlinkVec& v : kFlink) {
    int32_t hc;
    int32_t kg128, kg4096, kg32768;
    const std::string type = v.type;
    if (type == "Integer") {
      const int32_t k = static_cast<int32_t>(std::strtoll(v.key, nullptr, 10));
      hc = java_hash_int32(k);
      kg128 = key_group_for_int32(Assigner::Flink, k, 128);
      kg4096 = key_group_for_int32(Assigner::Flink, k, 4096);
      kg32768 = key_group_for_int32(Assigner::Flink, k, 32768);
    } else if (type == "Long") {
      const int64_t k = std::strtoll(v.key, nullptr, 10);
      hc = java_hash_int64(k);
      kg128 = key_group_for_int64(Assigner::Flink, k, 128);
      kg4096 = key_group_for_int64(Assigner::Flink, k, 4096);
      kg32768 = key_group_for_int64(Assigner::Flink, k, 32768);
    } else {
      const std::vector<uint8_t> b = unhex(v.key);
      const char* s = reinterpret_cast<const char*>(b.data());
      hc = java_hash_string_utf8(s, b.size());
      kg128 = key_group_for_string(Assigner::Flink, s, b.size(), 128);
      kg4096 = key_group_for_string(Assigner::Flink, s, b.size(), 4096);
      kg32768 = key_group_for_string(Assigner::Flink, s, b.size(), 32768);
    }
    CHECK_EQ(hc, v.hash_code);
    CHECK_EQ(flink_murmur_hash_raw(hc), v.murmur_raw);
    CHECK_EQ(flink_murmur_hash(hc), v.murmur);
    CHECK_EQ(kg128, v.kg128);
    CHECK_EQ(kg4096, v.kg4096);
    CHECK_EQ(kg32768, v.kg32768);
  }
}

TEST(flink_murmur_min_value_maps_to_zero) {
  // Flink's abs step: INT_MIN has no positive counterpart, so Flink returns 0 for it; any other
  // negative raw value is negated.
  for (int32_t c = -2000; c <= 2000; ++c) {
    const int32_t raw = flink_murmur_hash_raw(c);
    const int32_t h = flink_murmur_hash(c);
    if (raw == INT32_MIN) CHECK_EQ(h, 0);
    else CHECK_EQ(h, raw < 0 ? -raw : raw);
  }
}

TEST(java_hash_int64_rule) {
  CHECK_EQ(java_hash_int64(-1), 0);
  CHECK_EQ(java_hash_int64(INT64_MIN), INT32_MIN);
  CHECK_EQ(java_hash_int64(1LL << 40), 256);
  CHECK_EQ(java_hash_int64(0x123456789ABCDEF0LL), static_cast<int32_t>(0x12345678U ^ 0x9ABCDEF0U));
}

TEST(java_hash_string_utf8_random_vs_python) {
  // UTF-8 hex -> String.hashCode() over UTF-16 code units, from python (surrogatepass encoding);
  // covers 2-, 3- and 4-byte sequences (U+10000, U+1F600, U+10FFFF -> surrogate pairs), U+FFFD.
  static const struct {
    const char* hex;
    int32_t h;
  } cases[] = {
      {"407e4df09f9880787e7363235befbfbd3f7326342e4f5c3f", 808177667},
      {"652d693f217d3b544337e69cac51", -2043970100},
      {"e697a5f48fbfbf29316f", 1647612322},
      {"58303020203aefbfbd3b35354548396576703a3778", 1463458610},
      {"5146224e5535", -1910269055},
      {"41284a46", 1977219},
      {"6b206c767a4b28474de0a080475d7948375d5c7a36", 1570643755},
      {"40", 64},
      {"", 0},
      {"532266f0908080554e506a215925", -191388349},
      {"6f392fceb13f", 104283443},
      {"4c614d6340efbfbd5b2d6bc3a9efbfbdf48fbfbf4f45", -434812261},
      {"57", 87},
      {"3a4b", 1873},
      {"6e4e324b4379652b4777484736f48fbfbf2a70", 518561432},
      {"7c78475d", 3811698},
      {"7c262a6c64", 115692472},
      {"243e7e6c4cefbfbf405a73553227", 1022827468},
      {"24f48fbfbf5f4a3a307d683070f0908080542d35574f33275545", -41480472},
      {"5a6f3562", 2789602},
      {"5e787d485d43455c53322e50efbfbf64", 2122877928},
      {"705f4b372b", 106338320},
      {"4261f090808066604e28f0908080f09f9880efbfbd4d786b7424", -259165015},
      {"4e677a75435e41e69cac78", -105221602},
  };
  for (const auto& c : cases) {
    const std::vector<uint8_t> b = unhex(c.hex);
    CHECK_EQ(java_hash_string_utf8(reinterpret_cast<const char*>(b.data()), b.size()), c.h);
  }
}

TEST(java_hash_string_rejects_malformed_utf8) {
  const char* bad[] = {
      "\x80",              // lone continuation byte
      "\xC3",              // truncated 2-byte sequence
      "\xE6\x97",          // truncated 3-byte sequence
      "\xC0\xAF",          // overlong '/'
      "\xED\xA0\x80",      // encoded surrogate U+D800
      "\xF4\x90\x80\x80",  // U+110000
      "\xFF",              // invalid lead byte
      "a\xC3(",            // bad continuation byte
  };
  for (const char* s : bad)
    CHECK_THROWS(java_hash_string_utf8(s, std::strlen(s)), std::invalid_argument);
}

TEST(java_hash_bytes_arrays_hashcode) {
  // java.util.Arrays.hashCode(byte[]) (signed bytes, start 1), values from python.
  static const struct {
    const char* hex;
    int32_t h;
  } cases[] = {
      {"", 1},        {"00", 31}, {"ff", 30}, {"616263", 126145}, {"00254a6f94b9de", -1421337042},
      {"807f", -2880}};
  for (const auto& c : cases) {
    const std::vector<uint8_t> b = unhex(c.hex);
    CHECK_EQ(java_hash_bytes(b.data(), b.size()), c.h);
  }
}

TEST(spark_key_groups) {
  for (const SparkVec& v : kSpark) {
    const std::vector<uint8_t> b = unhex(v.hex);
    const std::string sec = v.section;
    int32_t kg;
    if (sec == "int") {
      kg = key_group_for_int32(Assigner::Spark, static_cast<int32_t>(le_value(b)), 128);
      CHECK_EQ(spark_xxhash64_int32(static_cast<int32_t>(le_value(b))), v.xxhash64);
    } else if (sec == "bigint") {
      kg = key_group_for_int64(Assigner::Spark, static_cast<int64_t>(le_value(b)), 128);
      CHECK_EQ(spark_xxhash64_int64(static_cast<int64_t>(le_value(b))), v.xxhash64);
    } else if (sec == "binary") {
      kg = key_group_for_binary(Assigner::Spark, b.data(), b.size(), 128);
    } else {
      kg = key_group_for_string(Assigner::Spark, reinterpret_cast<const char*>(b.data()), b.size(),
                                128);
    }
    CHECK_EQ(kg, v.pmod128);
  }
  // pmod with a non-power-of-two max parallelism stays non-negative.
  for (int32_t k = -500; k < 500; ++k) {
    const int32_t kg = key_group_for_int32(Assigner::Spark, k, 1000);
    CHECK(kg >= 0 && kg < 1000);
    int64_t h = spark_xxhash64_int32(k);
    CHECK_EQ(kg, static_cast<int32_t>(((h % 1000) + 1000) % 1000));
  }
}

TEST(key_group_argument_validation) {
  CHECK_THROWS(key_group_for_int32(Assigner::Spark, 1, 0), std::invalid_argument);
  CHECK_THROWS(key_group_for_int64(Assigner::Flink, 1, 32769), std::invalid_argument);
  CHECK_THROWS(key_group_for_string(Assigner::Flink, "\xFF", 1, 128), std::invalid_argument);
  CHECK_EQ(key_group_for_int32(Assigner::Flink, 7, 1), 0);
  CHECK_EQ(key_group_for_binary(Assigner::Flink, "abc", 3, 128), flink_murmur_hash(126145) % 128);
}

TEST(default_max_parallelism_vectors) {
  // flink_keygroups.json computeDefaultMaxParallelism.
  CHECK_EQ(default_max_parallelism(1), 128);
  CHECK_EQ(default_max_parallelism(2), 128);
  CHECK_EQ(default_max_parallelism(10), 128);
  CHECK_EQ(default_max_parallelism(100), 256);
  CHECK_EQ(default_max_parallelism(1000), 2048);
  CHECK_EQ(default_max_parallelism(30000), 32768);
  CHECK_EQ(default_max_parallelism(86), 256);  // 86 + 43 = 129 -> 256
  CHECK_EQ(default_max_parallelism(85), 128);  // 85 + 42 = 127 -> 128
  CHECK_EQ(default_max_parallelism(32768), 32768);
  CHECK_THROWS(default_max_parallelism(0), std::invalid_argument);
  CHECK_THROWS(default_max_parallelism(-3), std::invalid_argument);
  CHECK_THROWS(default_max_parallelism(32769), std::invalid_argument);
}

TEST(key_group_ranges_and_operator_index) {
  // flink_keygroups.json computeKeyGroupRangeForOperatorIndex_128_3 / ...OperatorIndexForKeyGroup.
  const int32_t want[3][2] = {{0, 42}, {43, 85}, {86, 127}};
  for (int i = 0; i < 3; ++i) {
    const KeyGroupRange r = key_group_range_for_operator(128, 3, i);
    CHECK_EQ(r.start, want[i][0]);
    CHECK_EQ(r.end, want[i][1]);
  }
  const int32_t ops[][2] = {{0, 0}, {42, 0}, {43, 1}, {85, 1}, {86, 2}, {127, 2}};
  for (const auto& o : ops) CHECK_EQ(operator_index_for_key_group(128, 3, o[0]), o[1]);
  // Partition property for many (maxP, p): ranges tile [0, maxP) and agree with operator index.
  const int32_t maxps[] = {1, 7, 128, 1000, 4096, 32768};
  for (int32_t maxp : maxps) {
    for (int32_t p : {1, 2, 3, 15, 77, 128, 1000, 32768}) {
      if (p > maxp) continue;
      int32_t next = 0;
      bool ok = true;
      for (int32_t i = 0; i < p; i += (p > 200 ? 97 : 1)) {
        const KeyGroupRange r = key_group_range_for_operator(maxp, p, i);
        if (p <= 200) ok = ok && r.start == next;
        next = r.end + 1;
        if (!r.empty()) {
          ok = ok && operator_index_for_key_group(maxp, p, r.start) == i;
          ok = ok && operator_index_for_key_group(maxp, p, r.end) == i;
        }
      }
      if (p <= 200) ok = ok && next == maxp;
      CHECK(ok);
    }
  }
  CHECK(KeyGroupRange{}.empty());
  CHECK_EQ(KeyGroupRange{}.size(), 0);
  CHECK_THROWS(key_group_range_for_operator(128, 0, 0), std::invalid_argument);
  CHECK_THROWS(key_group_range_for_operator(128, 129, 0), std::invalid_argument);
  CHECK_THROWS(key_group_range_for_operator(32769, 2, 0), std::invalid_argument);
  CHECK_THROWS(key_group_range_for_operator(128, 3, 3), std::invalid_argument);
  CHECK_THROWS(key_group_range_for_operator(128, 3, -1), std::invalid_argument);
  CHECK_THROWS(operator_index_for_key_group(128, 3, 128), std::invalid_argument);
  CHECK_THROWS(operator_index_for_key_group(128, 3, -1), std::invalid_argument);
  CHECK_THROWS(operator_index_for_key_group(2, 3, 0), std::invalid_argument);
}

TEST(xxh64_u64_equals_xxh64_of_the_8_little_endian_bytes) {
  uint64_t x = 0x0123456789abcdefULL;
  bool all = true;
  for (int i = 0; i < 10000; ++i) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    uint8_t b[8];
    for (int k = 0; k < 8; ++k) b[k] = static_cast<uint8_t>(x >> (8 * k));
    for (uint64_t seed : {uint64_t{0}, uint64_t{42}, x ^ 0x5555})
      all = all && statecore::xxh64_u64(x, seed) == statecore::xxh64(b, 8, seed);
  }
  CHECK(all);
}

TEST(xxh64_u32_equals_xxh64_of_the_4_little_endian_bytes) {
  uint64_t x = 0xfedcba9876543210ULL;
  bool all = true;
  for (uint32_t edge : {0u, 1u, 0x7fffffffu, 0x80000000u, 0xffffffffu}) {
    const uint8_t b[4] = {static_cast<uint8_t>(edge), static_cast<uint8_t>(edge >> 8),
                          static_cast<uint8_t>(edge >> 16), static_cast<uint8_t>(edge >> 24)};
    all = all && statecore::xxh64_u32(edge, 42) == statecore::xxh64(b, 4, 42);
  }
  for (int i = 0; i < 10000; ++i) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    const uint32_t v = static_cast<uint32_t>(x >> 17);
    uint8_t b[4];
    for (int k = 0; k < 4; ++k) b[k] = static_cast<uint8_t>(v >> (8 * k));
    for (uint64_t seed : {uint64_t{0}, uint64_t{42}, x ^ 0x5555})
      all = all && statecore::xxh64_u32(v, seed) == statecore::xxh64(b, 4, seed);
  }
  CHECK(all);
}

TEST_MAIN()
