// Key types end to end in the native core: the hash of every key column type against vectors of a
// real Spark 4.3 (tests/data/spark_key_types.json) and a real JVM
// (tests/data/java_hash_codes.json), the key serializer per type, KeyArrays over hand-built
// Arrow arrays (bit-packed bools, timestamp units, fixed_size_binary widths, struct arrays with
// offsets at both levels, nulls), the batch kernels with those keys, and distinct keys staying
// distinct in a map whose hash collides.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "check.h"
#include "statecore/arrow_abi.h"
#include "statecore/batch.h"
#include "statecore/cpu_dispatch.h"
#include "statecore/detail/spark_pmod.h"
#include "statecore/hash.h"
#include "statecore/key_codec.h"
#include "statecore/key_columns.h"
#include "statecore/key_groups.h"
#include "statecore/state_map.h"
#include "statecore/state_table.h"

using namespace statecore;

namespace {

void release_schema(ArrowSchema* s) { s->release = nullptr; }
void release_array(ArrowArray* a) { a->release = nullptr; }

// One owned Arrow array (flat or struct). `pad` leading junk elements sit before the logical
// start (array.offset = pad), so every reader sees a sliced array.
struct Arr {
  std::string format;
  std::vector<uint8_t> validity, data, values;
  const void* buffers[3] = {nullptr, nullptr, nullptr};
  std::vector<Arr*> kids;
  std::vector<ArrowSchema*> kid_schemas;
  std::vector<ArrowArray*> kid_arrays;
  ArrowSchema schema{};
  ArrowArray array{};

  ArrowInput in() const { return ArrowInput{&schema, &array}; }
  void set_valid(int64_t j, bool v) {
    if (validity.size() <= static_cast<size_t>(j / 8)) validity.resize(j / 8 + 1, 0);
    if (v) validity[j / 8] |= static_cast<uint8_t>(1u << (j % 8));
    else validity[j / 8] &= static_cast<uint8_t>(~(1u << (j % 8)));
  }
  void finish(int64_t length, int64_t offset, int64_t n_buffers, bool any_null) {
    buffers[0] = any_null ? validity.data() : nullptr;
    buffers[1] = data.data();
    buffers[2] = values.data();
    schema.format = format.c_str();
    schema.name = "";
    schema.release = &release_schema;
    array.length = length;
    array.offset = offset;
    array.null_count = any_null ? -1 : 0;
    array.n_buffers = n_buffers;
    array.buffers = buffers;
    array.release = &release_array;
    for (Arr* k : kids) {
      kid_schemas.push_back(&k->schema);
      kid_arrays.push_back(&k->array);
    }
    schema.n_children = array.n_children = static_cast<int64_t>(kids.size());
    schema.children = kid_schemas.empty() ? nullptr : kid_schemas.data();
    array.children = kid_arrays.empty() ? nullptr : kid_arrays.data();
  }
};

template <class T>
Arr fixed(const char* format, const std::vector<std::optional<T>>& xs, int64_t pad = 0) {
  Arr a;
  a.format = format;
  bool any_null = pad > 0;
  const int64_t total = pad + static_cast<int64_t>(xs.size());
  a.data.resize(static_cast<size_t>(total) * sizeof(T) + 1);
  for (int64_t j = 0; j < total; ++j) {
    const bool valid = j >= pad && xs[j - pad].has_value();
    T v = valid ? *xs[j - pad] : T{};
    std::memcpy(a.data.data() + j * sizeof(T), &v, sizeof(T));
    a.set_valid(j, valid);
    any_null = any_null || !valid;
  }
  a.finish(static_cast<int64_t>(xs.size()), pad, 2, any_null);
  return a;
}

Arr bools(const std::vector<std::optional<bool>>& xs, int64_t pad = 0) {
  Arr a;
  a.format = "b";
  const int64_t total = pad + static_cast<int64_t>(xs.size());
  a.data.assign(static_cast<size_t>(total / 8 + 1), 0xA5);  // junk bits around the values
  bool any_null = pad > 0;
  for (int64_t j = 0; j < total; ++j) {
    const bool valid = j >= pad && xs[j - pad].has_value();
    a.set_valid(j, valid);
    any_null = any_null || !valid;
    if (!valid) continue;
    if (*xs[j - pad]) a.data[j / 8] |= static_cast<uint8_t>(1u << (j % 8));
    else a.data[j / 8] &= static_cast<uint8_t>(~(1u << (j % 8)));
  }
  a.finish(static_cast<int64_t>(xs.size()), pad, 2, any_null);
  return a;
}

Arr fsb(int width, const std::vector<std::optional<std::string>>& xs, int64_t pad = 0) {
  Arr a;
  a.format = "w:" + std::to_string(width);
  const int64_t total = pad + static_cast<int64_t>(xs.size());
  a.data.assign(static_cast<size_t>(total * width + 1), 0x5A);
  bool any_null = pad > 0;
  for (int64_t j = 0; j < total; ++j) {
    const bool valid = j >= pad && xs[j - pad].has_value();
    a.set_valid(j, valid);
    any_null = any_null || !valid;
    if (valid) std::memcpy(a.data.data() + j * width, xs[j - pad]->data(), width);
  }
  a.finish(static_cast<int64_t>(xs.size()), pad, 2, any_null);
  return a;
}

Arr utf8(const std::vector<std::optional<std::string>>& xs, int64_t pad = 0) {
  Arr a;
  a.format = "u";
  const int64_t total = pad + static_cast<int64_t>(xs.size());
  std::vector<int32_t> offs(static_cast<size_t>(total) + 1, 0);
  bool any_null = pad > 0;
  for (int64_t j = 0; j < total; ++j) {
    const bool valid = j >= pad && xs[j - pad].has_value();
    const std::string s = valid ? *xs[j - pad] : std::string("junk");
    a.values.insert(a.values.end(), s.begin(), s.end());
    offs[j + 1] = static_cast<int32_t>(a.values.size());
    a.set_valid(j, valid);
    any_null = any_null || !valid;
  }
  a.values.push_back(0);
  a.data.resize(offs.size() * 4);
  std::memcpy(a.data.data(), offs.data(), a.data.size());
  a.finish(static_cast<int64_t>(xs.size()), pad, 3, any_null);
  return a;
}

// A struct array over `kids` (each holding at least offset + length elements) with its own
// offset and optional null rows (indexes relative to the logical start).
Arr strukt(std::vector<Arr*> kids, int64_t length, int64_t offset,
           const std::vector<int64_t>& null_rows = {}) {
  Arr a;
  a.format = "+s";
  a.kids = std::move(kids);
  for (int64_t j = 0; j < offset + length; ++j) a.set_valid(j, true);
  for (int64_t r : null_rows) a.set_valid(offset + r, false);
  a.data.push_back(0);
  a.finish(length, offset, 1, !null_rows.empty());
  return a;
}

KeySchema struct_of(std::vector<KeyColumn> cols) {
  KeySchema s;
  s.columns = std::move(cols);
  s.is_struct = true;
  return s;
}

KeyColumn col(KeyType t, int32_t width = 0, TimeUnit u = TimeUnit::Micro) {
  return KeyColumn{t, width, u};
}

std::string hex(const uint8_t* p, size_t n) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    s += d[p[i] >> 4];
    s += d[p[i] & 15];
  }
  return s;
}

std::string ser_hex(const KeyArrays& k, int64_t row) {
  std::vector<uint8_t> out;
  k.append_ser(out, row);
  return hex(out.data(), out.size());
}

std::string invalid_arg(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(no exception)";
}

bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

double bits_to_double(uint64_t u) {
  double d;
  std::memcpy(&d, &u, 8);
  return d;
}

int64_t spark(double v) { return spark_xxhash64_float64(v); }

const uint8_t* dead_beef() {
  static const uint8_t d[4] = {0xde, 0xad, 0xbe, 0xef};
  return d;
}

}  // namespace

// ------------------------------------------------------------------ hashes vs real Spark / JVM

TEST(spark_hashes_of_new_scalar_types) {
  // tests/data/spark_key_types.json (Spark 4.3, xxhash64 of the column type Spark would have).
  CHECK_EQ(spark_xxhash64_int64(static_cast<int64_t>(18446744073709551615ull)),
           3858142552250413010LL);
  CHECK_EQ(key_group_for_uint64(Assigner::Spark, 12345678901234567890ull, 128), 0);
  CHECK_EQ(key_group_for_uint64(Assigner::Spark, 9223372036854775808ull, 128), 116);
  CHECK_EQ(spark(0.0), -5252525462095825812LL);
  CHECK_EQ(spark(-0.0), -5252525462095825812LL);
  CHECK_EQ(spark(std::numeric_limits<double>::quiet_NaN()), -3127944061524951246LL);
  CHECK_EQ(spark(bits_to_double(0x7ff0000000000001ull)), -3127944061524951246LL);  // payload NaN
  CHECK_EQ(spark(bits_to_double(0xfff8000000000000ull)), -3127944061524951246LL);  // negative NaN
  CHECK_EQ(spark(std::numeric_limits<double>::infinity()), 5810986238603807492LL);
  CHECK_EQ(spark(-std::numeric_limits<double>::infinity()), 5326262080505358431LL);
  CHECK_EQ(spark(1.5), 7738255526519901366LL);
  CHECK_EQ(spark(5e-324), -7001672635703045582LL);
  CHECK_EQ(key_group_for_float64(Assigner::Spark, -2.25, 128), 39);
  CHECK_EQ(key_group_for_float64(Assigner::Spark, 1.7976931348623157e308, 128), 113);
  CHECK_EQ(spark_xxhash64_bool(true), -6698625589789238999LL);
  CHECK_EQ(spark_xxhash64_bool(false), 3614696996920510707LL);
  CHECK_EQ(key_group_for_bool(Assigner::Spark, true, 128), 41);
  CHECK_EQ(key_group_for_int64(Assigner::Spark, -62135596800000000LL, 128), 74);  // timestamp
  CHECK_EQ(key_group_for_int64(Assigner::Spark, 253402300799999999LL, 128), 90);
  const uint8_t dead[4] = {0xde, 0xad, 0xbe, 0xef};
  CHECK_EQ(spark_xxhash64_bytes(dead, 4), -8662771787172471895LL);
}

TEST(spark_multi_column_keys_chain_seeds) {
  KeyHasher h(Assigner::Spark);
  h.add_int32(7);
  h.add_string("a", 1);
  CHECK_EQ(h.key_group(128), 54);  // xxhash64(7, 'a') = -6969754268886164170
  KeyHasher z(Assigner::Spark), nz(Assigner::Spark);
  z.add_float64(0.0);
  z.add_bool(true);
  nz.add_float64(-0.0);
  nz.add_bool(true);
  CHECK_EQ(z.key_group(128), 102);
  CHECK_EQ(nz.key_group(128), 102);
  KeyHasher u(Assigner::Spark);
  u.add_uint64(18446744073709551615ull);
  u.add_binary(dead_beef(), 4);
  CHECK_EQ(u.key_group(128), 35);
  KeyHasher s1(Assigner::Spark), s2(Assigner::Spark);
  s1.add_string("ab", 2);
  s1.add_string("c", 1);
  s2.add_string("a", 1);
  s2.add_string("bc", 2);
  CHECK_EQ(s1.key_group(128), 29);
  CHECK_EQ(s2.key_group(128), 69);
}

TEST(java_hash_codes_of_new_scalar_types) {
  // tests/data/java_hash_codes.json (JDK 17).
  CHECK_EQ(java_hash_float64(0.0), 0);
  CHECK_EQ(java_hash_float64(-0.0), -2147483647 - 1);  // Java keeps -0.0 apart ...
  CHECK_EQ(java_hash_float64(std::numeric_limits<double>::quiet_NaN()), 2146959360);
  CHECK_EQ(java_hash_float64(bits_to_double(0x7ff0000000000001ull)), 2146959360);
  CHECK_EQ(java_hash_float64(1.5), 1073217536);
  CHECK_EQ(java_hash_float64(0.1), -1507852285);
  CHECK_EQ(java_hash_bool(true), 1231);
  CHECK_EQ(java_hash_bool(false), 1237);
  CHECK_EQ(java_hash_int64(static_cast<int64_t>(12345678901234567890ull)), 1078698846);
  CHECK_EQ(java_hash_bytes(dead_beef(), 4), -171199);
  // ... statecore keys -0.0 as 0.0, so both zeros land in Double.hashCode(0.0)'s key group.
  CHECK_EQ(key_group_for_float64(Assigner::Flink, -0.0, 128), flink_murmur_hash(0) % 128);
  CHECK_EQ(key_group_for_bool(Assigner::Flink, true, 4096), flink_murmur_hash(1231) % 4096);
  // Flink TupleN.hashCode(): (7, "a") -> 31 * 7 + 97 = 314; ("ab", "c") -> 96354.
  KeyHasher t(Assigner::Flink);
  t.add_int32(7);
  t.add_string("a", 1);
  CHECK_EQ(t.key_group(128), flink_murmur_hash(314) % 128);
  KeyHasher t2(Assigner::Flink);
  t2.add_string("ab", 2);
  t2.add_string("c", 1);
  CHECK_EQ(t2.key_group(4096), flink_murmur_hash(96354) % 4096);
  KeyHasher bad(Assigner::Flink);
  CHECK_THROWS(bad.add_string("\xff", 1), std::invalid_argument);
}

// ------------------------------------------------------------------ key serializer

TEST(key_encoder_serializes_every_scalar_type) {
  KeyEncoder u(KeyType::UInt64, NamespaceType::Void, 128);
  u.key_uint64(3, 18446744073709551615ull);
  u.namespace_void();
  CHECK_EQ(hex(u.data(), u.size()), std::string("03ffffffffffffffff00"));
  KeyEncoder f(KeyType::Float64, NamespaceType::String, 128);
  f.key_float64(1, -0.0);
  f.namespace_string("n", 1);
  CHECK_EQ(hex(f.data(), f.size()), std::string("01000000000000000002"
                                                "6e"));
  f.key_float64(1, bits_to_double(0xfff0000000000001ull));  // a NaN: one canonical key
  f.namespace_string("n", 1);
  CHECK_EQ(hex(f.data(), f.size()), std::string("017ff800000000000002"
                                                "6e"));
  KeyEncoder b(KeyType::Bool, NamespaceType::Int64, 200);  // 2-byte prefix
  b.key_bool(129, true);
  b.namespace_int64(-1);
  CHECK_EQ(hex(b.data(), b.size()), std::string("0081"
                                                "01"
                                                "ffffffffffffffff"));
  KeyEncoder t(KeySchema::scalar(KeyType::Timestamp, 0, TimeUnit::Nano), NamespaceType::Void, 128);
  t.key_timestamp(0, -1);
  t.namespace_void();
  CHECK_EQ(hex(t.data(), t.size()), std::string("00ffffffffffffffff00"));
  KeyEncoder w(KeySchema::scalar(KeyType::FixedSizeBinary, 3), NamespaceType::String, 128);
  w.key_fixed(2, "abc", 3);
  w.namespace_string("", 0);
  // Fixed-width key: no lenbytes even with a string namespace.
  CHECK_EQ(hex(w.data(), w.size()), std::string("02616263"
                                                "01"));
  CHECK_THROWS(w.key_fixed(2, "ab", 2), std::invalid_argument);
  CHECK_THROWS(w.key_bytes(2, "abc", 3), std::invalid_argument);
  CHECK_THROWS(w.key_int64(2, 1), std::invalid_argument);
  CHECK_THROWS(KeyEncoder(KeyType::FixedSizeBinary, NamespaceType::Void, 128),
               std::invalid_argument);
  CHECK_THROWS(KeyEncoder(KeySchema{{}, true}, NamespaceType::Void, 128), std::invalid_argument);
}

// ------------------------------------------------------------------ KeyArrays

TEST(key_arrays_read_bools_timestamps_and_fixed_binary_at_offsets) {
  Arr bs = bools({true, false, true, true, false, false, true, false, true}, 5);
  KeyArrays kb(KeySchema::scalar(KeyType::Bool), &bs.schema, &bs.array);
  CHECK_EQ(kb.length(), 9);
  CHECK_EQ(kb.first_null(nullptr), -1);
  std::string got;
  for (int64_t i = 0; i < 9; ++i) got += ser_hex(kb, i);
  CHECK_EQ(got, std::string("010001010000010001"));
  std::vector<int32_t> kgs(9);
  kb.key_groups(Assigner::Spark, 128, kgs.data());
  CHECK_EQ(kgs[0], 41);
  CHECK_EQ(kgs[1], key_group_for_bool(Assigner::Spark, false, 128));

  Arr ts = fixed<int64_t>("tsm:Europe/Paris", {0, -1, 1600000000123LL}, 2);
  KeyArrays kt(KeySchema::scalar(KeyType::Timestamp, 0, TimeUnit::Milli), &ts.schema, &ts.array);
  CHECK_EQ(ser_hex(kt, 1), std::string("ffffffffffffffff"));
  kt.key_groups(Assigner::Flink, 128, kgs.data());
  CHECK_EQ(kgs[2], key_group_for_int64(Assigner::Flink, 1600000000123LL, 128));
  const std::string wrong_unit =
      invalid_arg([&] { KeyArrays(KeySchema::scalar(KeyType::Timestamp), &ts.schema, &ts.array); });
  CHECK(contains(wrong_unit, "key type timestamp[us], got timestamp[ms]"));

  Arr w = fsb(4, {std::string("\xde\xad\xbe\xef", 4), std::string(4, '\0')}, 3);
  KeyArrays kw(KeySchema::scalar(KeyType::FixedSizeBinary, 4), &w.schema, &w.array);
  CHECK_EQ(ser_hex(kw, 0), std::string("deadbeef"));
  kw.key_groups(Assigner::Spark, 128, kgs.data());
  CHECK_EQ(kgs[0], 41);
  CHECK_EQ(kgs[1], 115);
  CHECK(contains(invalid_arg([&] {
                   KeyArrays(KeySchema::scalar(KeyType::FixedSizeBinary, 3), &w.schema, &w.array);
                 }),
                 "fixed_size_binary[3], got fixed_size_binary[4]"));
  CHECK(contains(
      invalid_arg([&] { KeyArrays(KeySchema::scalar(KeyType::Binary), &w.schema, &w.array); }),
      "key type binary, got fixed_size_binary[4]"));

  Arr u = fixed<uint64_t>("L", {18446744073709551615ull, std::nullopt});
  KeyArrays ku(KeySchema::scalar(KeyType::UInt64), &u.schema, &u.array);
  CHECK_EQ(ku.first_null(nullptr), 1);
  Arr d = fixed<double>("g", {-0.0, std::nan("")});
  KeyArrays kd(KeySchema::scalar(KeyType::Float64), &d.schema, &d.array);
  CHECK_EQ(ser_hex(kd, 0), std::string("0000000000000000"));
  CHECK_EQ(ser_hex(kd, 1), std::string("7ff8000000000000"));
}

// The Spark int64 pass has its own loop (built for AVX-512 and AVX2 too, multiversion.h): it must
// give the scalar key_group_for_int64 for every key, maximum parallelism and array offset, at
// every level (ctest runs this suite again with STATECORE_CPU=baseline and =x86-64-v3).
TEST(spark_int64_key_groups_match_the_scalar_assignment) {
  std::vector<std::optional<int64_t>> xs = {0, -1, 1, std::numeric_limits<int64_t>::min(),
                                            std::numeric_limits<int64_t>::max()};
  uint64_t x = 0x9E3779B97F4A7C15ULL;
  while (xs.size() < 1003) {  // not a multiple of a vector's 8 lanes
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    xs.push_back(static_cast<int64_t>(x));
  }
  for (int64_t pad : {0, 3}) {
    Arr a = fixed<int64_t>("l", xs, pad);
    KeyArrays k(KeySchema::scalar(KeyType::Int64), &a.schema, &a.array);
    std::vector<int32_t> kgs(xs.size());
    for (int32_t maxp : {1, 2, 128, 4096, 32768, 3, 7, 100, 200, 12345, 32767}) {
      k.key_groups(Assigner::Spark, maxp, kgs.data());
      for (size_t i = 0; i < xs.size(); ++i)
        CHECK_EQ(kgs[i], key_group_for_int64(Assigner::Spark, *xs[i], maxp));
    }
  }
}

// STATECORE_CPU lowers the level that the multiversioned loops run, never raises it.
TEST(cpu_dispatch_follows_statecore_cpu) {
  const cpu::Dispatch& d = cpu::dispatch();
  const char* env = std::getenv("STATECORE_CPU");
  CHECK(static_cast<int>(d.level) <= static_cast<int>(d.detected));
  CHECK(d.request_valid);
  if (env == nullptr) {
    CHECK(d.level == d.detected);
  } else if (std::strcmp(env, "baseline") == 0) {
    CHECK(d.level == cpu::Level::kBaseline);
  } else if (std::strcmp(env, "x86-64-v3") == 0) {
    CHECK(static_cast<int>(d.level) <= static_cast<int>(cpu::Level::kV3));
  }
  CHECK(std::strcmp(cpu::level_name(cpu::Level::kV4), "x86-64-v4") == 0);
}

// SparkPmod replaces a division a row: it must equal Spark's ((h % m) + m) % m for every hash,
// the extremes and the hashes next to a multiple of m included, at every max parallelism.
TEST(spark_pmod_equals_the_division_for_every_hash_and_max_parallelism) {
  std::vector<int64_t> hs = {0,
                             1,
                             -1,
                             2,
                             -2,
                             std::numeric_limits<int64_t>::min(),
                             std::numeric_limits<int64_t>::min() + 1,
                             std::numeric_limits<int64_t>::max(),
                             std::numeric_limits<int64_t>::max() - 1};
  uint64_t x = 0x2545F4914F6CDD1DULL;
  while (hs.size() < 4000) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    hs.push_back(static_cast<int64_t>(x));
  }
  for (int32_t m :
       {1, 2, 3, 5, 7, 100, 128, 200, 255, 1000, 4096, 12345, 32767, 32768, 65537, 2147483647}) {
    const detail::SparkPmod pmod(static_cast<uint32_t>(m));
    std::vector<int64_t> near = hs;
    for (int64_t k : {int64_t{1}, int64_t{1000}, (std::numeric_limits<int64_t>::max() - 1) / m})
      for (int64_t d : {-1, 0, 1}) near.push_back(k * m + d), near.push_back(-k * m + d);
    for (int64_t h : near) {
      const int64_t want = ((h % m) + m) % m;
      CHECK_EQ(static_cast<int64_t>(pmod(static_cast<uint64_t>(h))), want);
    }
  }
}

// Spark int32 keys take the batch loop too (key_groups.cpp's per-row call divided by the max
// parallelism): the same key groups as the scalar assignment.
TEST(spark_int32_key_groups_match_the_scalar_assignment) {
  std::vector<std::optional<int32_t>> xs = {0, -1, 1, std::numeric_limits<int32_t>::min(),
                                            std::numeric_limits<int32_t>::max()};
  uint32_t x = 0x9E3779B9u;
  while (xs.size() < 501) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    xs.push_back(static_cast<int32_t>(x));
  }
  Arr a = fixed<int32_t>("i", xs, 2);
  KeyArrays k(KeySchema::scalar(KeyType::Int32), &a.schema, &a.array);
  std::vector<int32_t> kgs(xs.size());
  for (int32_t maxp : {1, 128, 200, 4096, 32767, 32768}) {
    k.key_groups(Assigner::Spark, maxp, kgs.data());
    for (size_t i = 0; i < xs.size(); ++i)
      CHECK_EQ(kgs[i], key_group_for_int32(Assigner::Spark, *xs[i], maxp));
  }
}

TEST(key_arrays_read_struct_keys_with_offsets_at_both_levels) {
  // Children padded by 2 (their own offset), the struct sliced by 1 more on top.
  Arr a = fixed<int32_t>("i", {99, 7, 1, 2}, 2);
  Arr s = utf8({std::string("zz"), std::string("a"), std::string("ab"), std::string("")}, 2);
  Arr st = strukt({&a, &s}, 3, 1);
  const KeySchema schema = struct_of({col(KeyType::Int32), col(KeyType::String)});
  KeyArrays k(schema, &st.schema, &st.array);
  CHECK_EQ(k.length(), 3);
  CHECK_EQ(k.first_null(nullptr), -1);
  CHECK_EQ(ser_hex(k, 0), std::string("00000007"
                                      "0261"));  // row 0 = child element 1
  CHECK_EQ(ser_hex(k, 1), std::string("00000001"
                                      "036162"));
  CHECK_EQ(ser_hex(k, 2), std::string("00000002"
                                      "01"));
  std::vector<int32_t> kgs(3);
  k.key_groups(Assigner::Spark, 128, kgs.data());
  CHECK_EQ(kgs[0], 54);  // Spark xxhash64(7, 'a')
  k.key_groups(Assigner::Flink, 128, kgs.data());
  CHECK_EQ(kgs[0], flink_murmur_hash(314) % 128);
  // The encoder takes rows of a matching schema only.
  KeyEncoder enc(schema, NamespaceType::String, 128);
  CHECK_THROWS(enc.key_row(5, 0), std::invalid_argument);  // nothing bound yet
  enc.bind(k);
  enc.key_row(5, 0);
  enc.namespace_string("n", 1);
  // Variable-length key and namespace: Flink's lenbytes after each part.
  CHECK_EQ(hex(enc.data(), enc.size()), std::string("05"
                                                    "00000007"
                                                    "0261"
                                                    "06"
                                                    "026e"
                                                    "02"));
  KeyEncoder other(struct_of({col(KeyType::Int32), col(KeyType::Binary)}), NamespaceType::Void,
                   128);
  CHECK_THROWS(other.bind(k), std::invalid_argument);

  // Nulls: a null struct row, then a null field.
  Arr st2 = strukt({&a, &s}, 3, 1, {2});
  int column = 7;
  CHECK_EQ(KeyArrays(schema, &st2.schema, &st2.array).first_null(&column), 2);
  CHECK_EQ(column, -1);
  Arr an = fixed<int32_t>("i", {99, 7, std::nullopt, 2}, 2);
  Arr st3 = strukt({&an, &s}, 3, 1);
  CHECK_EQ(KeyArrays(schema, &st3.schema, &st3.array).first_null(&column), 1);
  CHECK_EQ(column, 0);
  // A null beyond the struct's window is not the key's business.
  Arr st4 = strukt({&an, &s}, 1, 0);
  CHECK_EQ(KeyArrays(schema, &st4.schema, &st4.array).first_null(&column), -1);

  // Shape errors.
  CHECK(contains(invalid_arg([&] { KeyArrays(schema, &a.schema, &a.array); }),
                 "expected a struct array"));
  CHECK(contains(
      invalid_arg([&] { KeyArrays(struct_of({col(KeyType::Int32)}), &st.schema, &st.array); }),
      "got 2 fields"));
  CHECK(contains(invalid_arg([&] {
                   KeyArrays(struct_of({col(KeyType::Int64), col(KeyType::String)}), &st.schema,
                             &st.array);
                 }),
                 "field 0: expected an Arrow array of key type int64, got int32"));
  Arr shortkid = fixed<int32_t>("i", {1});
  Arr st5 = strukt({&shortkid, &s}, 3, 1);
  CHECK(contains(invalid_arg([&] { KeyArrays(schema, &st5.schema, &st5.array); }), "shorter"));
}

// ------------------------------------------------------------------ batch kernels

TEST(batch_kernels_with_struct_and_new_scalar_keys) {
  StateTable t(0, 127);
  BatchKeySpec sp;
  sp.key = struct_of({col(KeyType::Float64), col(KeyType::Bool), col(KeyType::FixedSizeBinary, 2)});
  Arr d = fixed<double>("g", {-0.0, 0.0, std::nan(""), 1.5}, 1);
  Arr b = bools({true, true, false, false}, 1);
  Arr w = fsb(2, {std::string("ab"), std::string("ab"), std::string("xy"), std::string("xy")}, 1);
  Arr keys = strukt({&d, &b, &w}, 4, 0);
  Arr vals = fixed<int64_t>("l", {1, 2, 3, 4});
  put_batch(t, sp, keys.in(), ValueType::Int64, vals.in());
  CHECK_EQ(t.size(), 3u);  // (-0.0, true, "ab") and (0.0, true, "ab") are one key
  int64_t out[4];
  uint8_t valid[4];
  get_batch_fixed(t, sp, keys.in(), ValueType::Int64, out, valid);
  CHECK_EQ(out[0], 2);
  CHECK_EQ(out[1], 2);
  CHECK_EQ(out[2], 3);
  CHECK_EQ(out[3], 4);
  // The same entries as the per-record encoder addresses.
  KeyEncoder enc(sp.key, NamespaceType::Void, 128);
  KeyArrays ka(sp.key, &keys.schema, &keys.array);
  std::vector<int32_t> kgs(4);
  ka.key_groups(Assigner::Spark, 128, kgs.data());
  enc.bind(ka);
  enc.key_row(kgs[2], 2);
  enc.namespace_void();
  ByteView v;
  CHECK(t.map(kgs[2]).get(enc.data(), enc.size(), &v));

  // Rejected batches change nothing: a null field, a wrong child type, a scalar array.
  const size_t before = t.size();
  Arr bn = bools({true, std::nullopt, false, false}, 1);
  Arr nullfield = strukt({&d, &bn, &w}, 4, 0);
  bool threw = false;
  try {
    put_batch(t, sp, nullfield.in(), ValueType::Int64, vals.in());
  } catch (const BatchError& e) {
    threw = contains(e.what(), "null in field 1 of the key at row 1");
  }
  CHECK(threw);
  Arr wide =
      fsb(3, {std::string("abc"), std::string("abc"), std::string("abc"), std::string("abc")});
  Arr wrong = strukt({&d, &b, &wide}, 4, 0);
  CHECK_THROWS(put_batch(t, sp, wrong.in(), ValueType::Int64, vals.in()), BatchError);
  CHECK_THROWS(put_batch(t, sp, d.in(), ValueType::Int64, vals.in()), BatchError);
  CHECK_EQ(t.size(), before);
  CHECK_EQ(out[0], 2);

  // A uint64 key and a timestamp key: kernel keys == per-record keys.
  StateTable t2(0, 127);
  BatchKeySpec su;
  su.key = KeySchema::scalar(KeyType::UInt64);
  su.assigner = Assigner::Flink;
  Arr uk = fixed<uint64_t>("L", {0, 18446744073709551615ull}, 3);
  Arr uv = fixed<int64_t>("l", {10, 20});
  put_batch(t2, su, uk.in(), ValueType::Int64, uv.in());
  KeyEncoder ue(KeyType::UInt64, NamespaceType::Void, 128);
  ue.key_uint64(key_group_for_uint64(Assigner::Flink, 18446744073709551615ull, 128),
                18446744073709551615ull);
  ue.namespace_void();
  CHECK(t2.map(key_group_for_uint64(Assigner::Flink, 18446744073709551615ull, 128))
            .get(ue.data(), ue.size(), &v));
  CHECK_EQ(v.size, 8u);
}

// ------------------------------------------------------------------ colliding hash

uint32_t colliding_hash(const uint8_t*, size_t size) { return static_cast<uint32_t>(size % 3); }

// Puts `keys` (encoded keys of ONE key type: distinct types may share bytes, as uint64 0 and
// float64 0.0 do, but never meet in one backend) into a map whose hash collides, then reads
// every one back.
void check_distinct(const std::vector<std::vector<uint8_t>>& keys) {
  StateMap m(&colliding_hash);
  for (size_t i = 0; i < keys.size(); ++i) {
    uint8_t* p = m.put(keys[i].data(), keys[i].size(), 8);
    const uint64_t v = i;
    std::memcpy(p, &v, 8);
  }
  CHECK_EQ(m.size(), keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    ByteView v;
    CHECK(m.get(keys[i].data(), keys[i].size(), &v));
    uint64_t got = 0;
    std::memcpy(&got, v.data, 8);
    CHECK_EQ(got, static_cast<uint64_t>(i));
  }
}

TEST(distinct_keys_stay_distinct_under_a_colliding_map_hash) {
  // Keys of each type in a map whose hash puts nearly everything in one chain: the map must tell
  // them apart by their bytes alone (e.g. ("ab","c") vs ("a","bc"), 0.0 vs NaN vs -1.5).
  std::vector<std::vector<uint8_t>> keys;
  auto add = [&](KeyEncoder& e) {
    e.namespace_void();
    keys.emplace_back(e.data(), e.data() + e.size());
  };
  KeyEncoder f(KeyType::Float64, NamespaceType::Void, 128);
  for (double x : {0.0, 1.5, -1.5, std::nan(""), std::numeric_limits<double>::infinity()}) {
    f.key_float64(0, x);
    add(f);
  }
  check_distinct(keys);
  keys.clear();
  KeyEncoder bo(KeyType::Bool, NamespaceType::Void, 128);
  for (bool x : {true, false}) {
    bo.key_bool(0, x);
    add(bo);
  }
  check_distinct(keys);
  keys.clear();
  KeyEncoder u(KeyType::UInt64, NamespaceType::Void, 128);
  for (uint64_t x : {0ull, 1ull, 18446744073709551615ull, 256ull}) {
    u.key_uint64(0, x);
    add(u);
  }
  check_distinct(keys);
  keys.clear();
  Arr s1 = utf8({std::string("ab"), std::string("a"), std::string(""), std::string("abc")});
  Arr s2 = utf8({std::string("c"), std::string("bc"), std::string("abc"), std::string("")});
  Arr st = strukt({&s1, &s2}, 4, 0);
  const KeySchema ss = struct_of({col(KeyType::String), col(KeyType::String)});
  KeyArrays ka(ss, &st.schema, &st.array);
  KeyEncoder se(ss, NamespaceType::Void, 128);
  se.bind(ka);
  for (int64_t i = 0; i < 4; ++i) {
    se.key_row(0, i);
    add(se);
  }
  check_distinct(keys);
}

TEST_MAIN()
