// Batch kernels (batch.h) over hand-built Arrow C Data Interface arrays: round trips, running
// aggregates against a reference computed here, sliced arrays (offset != 0) with validity bitmaps,
// the same entries as the per-record key codec, errors that leave the table untouched, and the
// TTL kernels (expiry, renewal, visibility, a model of the Python TTL states, undo, snapshots).
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "batch_test_arrays.h"
#include "check.h"
#include "statecore/arrow_abi.h"
#include "statecore/batch.h"
#include "statecore/key_codec.h"
#include "statecore/key_groups.h"
#include "statecore/state_table.h"
#include "statecore/ttl.h"

using namespace statecore;
using namespace statecore_test;

namespace {

BatchKeySpec spec_for(KeyType kind, Assigner a = Assigner::Spark, int32_t maxp = 128, int32_t s = 0,
                      int32_t e = 127) {
  BatchKeySpec sp;
  sp.key = KeySchema::scalar(kind);
  sp.assigner = a;
  sp.max_parallelism = maxp;
  sp.kg_start = s;
  sp.kg_end = e;
  return sp;
}

int64_t le_i64(const std::string& v) {
  uint64_t u = 0;
  for (int i = 7; i >= 0; --i) u = (u << 8) | static_cast<uint8_t>(v[i]);
  return static_cast<int64_t>(u);
}

}  // namespace

TEST(put_get_int64_roundtrip_and_null_removes) {
  StateTable t(0, 127);
  const BatchKeySpec sp = spec_for(KeyType::Int64);
  TestArray keys = fixed<int64_t>("l", I64{1, 2, 3, -7, 1LL << 40});
  TestArray vals = fixed<int64_t>("l", I64{10, 20, 30, -70, INT64_MIN});
  put_batch(t, sp, keys.in(), ValueType::Int64, vals.in());
  CHECK_EQ(t.size(), size_t{5});

  TestArray q = fixed<int64_t>("l", I64{3, 4, 1LL << 40, 1, -7, 2});
  int64_t out[6];
  uint8_t valid[6];
  get_batch_fixed(t, sp, q.in(), ValueType::Int64, out, valid);
  const int64_t want[6] = {30, 0, INT64_MIN, 10, -70, 20};
  const uint8_t want_valid[6] = {1, 0, 1, 1, 1, 1};
  for (int i = 0; i < 6; ++i) {
    CHECK_EQ(int(valid[i]), int(want_valid[i]));
    CHECK_EQ(out[i], want[i]);
  }
  // A null value removes the key (update(null) == clear()); last row wins for repeated keys.
  TestArray k2 = fixed<int64_t>("l", I64{2, 3, 3});
  TestArray v2 = fixed<int64_t>("l", I64{std::nullopt, 5, 6});
  put_batch(t, sp, k2.in(), ValueType::Int64, v2.in());
  CHECK_EQ(t.size(), size_t{4});
  TestArray q2 = fixed<int64_t>("l", I64{2, 3});
  get_batch_fixed(t, sp, q2.in(), ValueType::Int64, out, valid);
  CHECK_EQ(int(valid[0]), 0);
  CHECK_EQ(int(valid[1]), 1);
  CHECK_EQ(out[1], int64_t{6});
}

TEST(batch_path_and_key_codec_address_the_same_entries) {
  // put through the kernel, read back through KeyEncoder + the key group of the per-record path.
  for (Assigner a : {Assigner::Spark, Assigner::Flink}) {
    for (int32_t maxp : {128, 4096}) {
      StateTable t(0, maxp - 1);
      const BatchKeySpec sp = spec_for(KeyType::String, a, maxp, 0, maxp - 1);
      TestArray keys =
          varwidth<int32_t>("u", Str{"hello", "", "\xe6\x97\xa5\xf0\x9f\x98\x80", "k"});
      TestArray vals = fixed<double>("g", F64{1.5, -2.0, 3.25, NAN});
      put_batch(t, sp, keys.in(), ValueType::Float64, vals.in());
      KeyEncoder enc(KeyType::String, NamespaceType::Void, maxp);
      const char* ks[] = {"hello", "", "\xe6\x97\xa5\xf0\x9f\x98\x80", "k"};
      const double vs[] = {1.5, -2.0, 3.25, NAN};
      for (int i = 0; i < 4; ++i) {
        const int32_t kg = key_group_for_string(a, ks[i], std::strlen(ks[i]), maxp);
        enc.key_bytes(kg, ks[i], std::strlen(ks[i]));
        enc.namespace_void();
        ByteView v;
        CHECK(t.map(kg).get(enc.data(), enc.size(), &v));
        CHECK_EQ(v.size, size_t{8});
        uint64_t u = 0;
        for (int b = 7; b >= 0; --b) u = (u << 8) | v.data[b];  // stored little-endian
        uint64_t w;
        std::memcpy(&w, &vs[i], 8);
        CHECK_EQ(u, w);
      }
    }
  }
  // Int32 keys under Flink with the documented Flink vector: key 42 -> kg 29 -> 1d0000002a00.
  StateTable t(0, 127);
  TestArray k = fixed<int32_t>("i", std::vector<std::optional<int32_t>>{42});
  TestArray v = fixed<int64_t>("l", I64{7});
  put_batch(t, spec_for(KeyType::Int32, Assigner::Flink), k.in(), ValueType::Int64, v.in());
  const auto d = dump(t);
  CHECK_EQ(d.size(), size_t{1});
  CHECK(d.count(std::string("\x1d\x00\x00\x00\x2a\x00", 6)) == 1);
  CHECK_EQ(le_i64(d.begin()->second), int64_t{7});
}

TEST(running_sum_matches_reference_with_repeats_and_nulls) {
  StateTable t(0, 127);
  const BatchKeySpec sp = spec_for(KeyType::Int64);
  std::map<int64_t, int64_t> ref;
  uint64_t rng = 12345;
  auto next = [&] {
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return rng >> 33;
  };
  for (int batch = 0; batch < 20; ++batch) {
    I64 ks, vs;
    for (int i = 0; i < 500; ++i) {
      ks.push_back(static_cast<int64_t>(next() % 50) - 25);
      if (next() % 7 == 0) vs.push_back(std::nullopt);
      else vs.push_back(static_cast<int64_t>(next() % 1000) - 300);
    }
    const int64_t pad = batch % 3;  // some batches sliced
    TestArray ka = fixed<int64_t>("l", ks, pad);
    TestArray va = fixed<int64_t>("l", vs, pad);
    std::vector<int64_t> out(ks.size());
    std::vector<uint8_t> valid(ks.size());
    add_batch(t, sp, ka.in(), ValueType::Int64, Reducer::Sum, va.in(), out.data(), valid.data());
    bool ok = true;
    for (size_t i = 0; i < ks.size(); ++i) {
      const int64_t k = *ks[i];
      if (vs[i]) ref[k] += *vs[i];
      const bool have = ref.count(k) > 0;
      ok = ok && (valid[i] == (have ? 1 : 0)) && (!have || out[i] == ref[k]);
    }
    CHECK(ok);
  }
  CHECK_EQ(t.size(), ref.size());
  // get_batch sees the final sums.
  I64 all;
  for (const auto& kv : ref) all.push_back(kv.first);
  TestArray q = fixed<int64_t>("l", all);
  check_reads_back(t, sp, q, ref);
}

TEST(min_max_count_float64) {
  StateTable t(0, 127);
  const BatchKeySpec sp = spec_for(KeyType::Int32);
  using I32 = std::vector<std::optional<int32_t>>;
  TestArray keys = fixed<int32_t>("i", I32{1, 2, 1, 1, 2, 3});
  TestArray vals = fixed<double>("g", F64{5.0, std::nullopt, 3.0, 9.0, -1.0, std::nullopt});
  double out[6];
  uint8_t valid[6];
  add_batch(t, sp, keys.in(), ValueType::Float64, Reducer::Min, vals.in(), out, valid);
  const double want_min[6] = {5.0, 0, 3.0, 3.0, -1.0, 0};
  const uint8_t want_valid[6] = {1, 0, 1, 1, 1, 0};
  for (int i = 0; i < 6; ++i) {
    CHECK_EQ(int(valid[i]), int(want_valid[i]));
    if (want_valid[i]) CHECK_EQ(out[i], want_min[i]);
  }
  StateTable tmax(0, 127);
  add_batch(tmax, sp, keys.in(), ValueType::Float64, Reducer::Max, vals.in(), out, valid);
  const double want_max[6] = {5.0, 0, 5.0, 9.0, -1.0, 0};
  for (int i = 0; i < 6; ++i)
    if (want_valid[i]) CHECK_EQ(out[i], want_max[i]);
  // First keeps the first non-null value, Last takes every non-null one; nulls show the state.
  StateTable tfirst(0, 127);
  add_batch(tfirst, sp, keys.in(), ValueType::Float64, Reducer::First, vals.in(), out, valid);
  const double want_first[6] = {5.0, 0, 5.0, 5.0, -1.0, 0};
  for (int i = 0; i < 6; ++i) {
    CHECK_EQ(int(valid[i]), int(want_valid[i]));
    if (want_valid[i]) CHECK_EQ(out[i], want_first[i]);
  }
  StateTable tlast(0, 127);
  add_batch(tlast, sp, keys.in(), ValueType::Float64, Reducer::Last, vals.in(), out, valid);
  const double want_last[6] = {5.0, 0, 3.0, 9.0, -1.0, 0};
  for (int i = 0; i < 6; ++i)
    if (want_valid[i]) CHECK_EQ(out[i], want_last[i]);

  // Count: +1 per non-null value, whatever the value type; int64 output.
  StateTable tc(0, 127);
  int64_t cnt[6];
  add_batch(tc, sp, keys.in(), ValueType::Int64, Reducer::Count, vals.in(), cnt, valid);
  const int64_t want_cnt[6] = {1, 0, 2, 3, 1, 0};
  for (int i = 0; i < 6; ++i) {
    CHECK_EQ(int(valid[i]), int(want_valid[i]));
    if (want_valid[i]) CHECK_EQ(cnt[i], want_cnt[i]);
  }
  TestArray svals = varwidth<int32_t>("u", Str{"a", "b", std::nullopt, "c", "d", "e"});
  add_batch(tc, sp, keys.in(), ValueType::Int64, Reducer::Count, svals.in(), cnt, valid);
  const int64_t want_cnt2[6] = {4, 2, 4, 5, 3, 1};
  for (int i = 0; i < 6; ++i) CHECK_EQ(cnt[i], want_cnt2[i]);

  // Python min(acc, v) semantics with NaN: a NaN value never replaces the accumulator.
  StateTable tn(0, 127);
  TestArray k1 = fixed<int32_t>("i", I32{7, 7, 7});
  TestArray v1 = fixed<double>("g", F64{2.0, NAN, 1.0});
  add_batch(tn, sp, k1.in(), ValueType::Float64, Reducer::Min, v1.in(), out, valid);
  CHECK_EQ(out[1], 2.0);
  CHECK_EQ(out[2], 1.0);
}

TEST(int64_sum_overflow_throws_and_rolls_the_batch_back) {
  StateTable t(0, 127);
  const BatchKeySpec sp = spec_for(KeyType::Int64);
  TestArray k0 = fixed<int64_t>("l", I64{1, 2});
  TestArray v0 = fixed<int64_t>("l", I64{10, 20});
  int64_t out[5];
  uint8_t valid[5];
  add_batch(t, sp, k0.in(), ValueType::Int64, Reducer::Sum, v0.in(), out, valid);
  const auto before = dump(t);
  // Rows touch existing keys (1, 2), a new key (3) and a repeated key before the overflow on row 4.
  TestArray k = fixed<int64_t>("l", I64{1, 3, 2, 1, 2});
  TestArray v = fixed<int64_t>("l", I64{5, 7, 1, 3, INT64_MAX});
  CHECK_THROWS(add_batch(t, sp, k.in(), ValueType::Int64, Reducer::Sum, v.in(), out, valid),
               BatchError);
  CHECK(dump(t) == before);
  CHECK_EQ(t.size(), size_t{2});
  // A batch that does not overflow still applies in row order.
  TestArray k2 = fixed<int64_t>("l", I64{1, 1});
  TestArray v2 = fixed<int64_t>("l", I64{INT64_MAX - 11, 1});
  add_batch(t, sp, k2.in(), ValueType::Int64, Reducer::Sum, v2.in(), out, valid);
  CHECK_EQ(out[1], INT64_MAX);
}

// The undo without TTL derives each row's old aggregate from its output (out - value) and keeps
// only "was the key new": over a state large enough for the prefetching row path, with keys
// repeated and new in the batch, null value rows and negative values, the overflow on a late row
// must leave every aggregate and the key count as they were, for each integer Sum type.
template <class T>
void check_large_sum_overflow_rollback(const char* format, ValueType vt) {
  StateTable t(0, 127);
  const BatchKeySpec sp = spec_for(KeyType::Int64);
  const int64_t n0 = 40000;
  I64 k0;
  std::vector<std::optional<T>> v0;
  for (int64_t i = 0; i < n0; ++i) {
    k0.push_back(i * 7919);
    v0.push_back(static_cast<T>(i % 13));
  }
  std::vector<T> out(n0 + 1000);
  std::vector<uint8_t> valid(n0 + 1000);
  TestArray ka = fixed<int64_t>("l", k0), va = fixed<T>(format, v0);
  add_batch(t, sp, ka.in(), vt, Reducer::Sum, va.in(), out.data(), valid.data());
  const auto before = dump(t);
  I64 k;
  std::vector<std::optional<T>> v;
  const int64_t n = 30000;
  for (int64_t i = 0; i < n; ++i) {
    // Existing keys, a third of them new ones, each key about three times.
    k.push_back((i % 10000) * 7919 + (i % 3 == 0 ? 1 : 0));
    if (i % 17 == 5) v.push_back(std::nullopt);
    else v.push_back(static_cast<T>(std::is_signed<T>::value && i % 2 ? -(i % 5) : i % 5));
  }
  for (int r = 0; r < 2; ++r) {  // an existing key: the second maximum overflows at the latest
    k.push_back(7919);
    v.push_back(std::numeric_limits<T>::max());
  }
  TestArray kb = fixed<int64_t>("l", k), vb = fixed<T>(format, v);
  CHECK(batch_error(
      [&] { add_batch(t, sp, kb.in(), vt, Reducer::Sum, vb.in(), out.data(), valid.data()); },
      "overflows"));
  CHECK(dump(t) == before);
  CHECK_EQ(t.size(), size_t(n0));
}

TEST(integer_sum_overflow_rolls_back_a_large_batch) {
  check_large_sum_overflow_rollback<int64_t>("l", ValueType::Int64);
  check_large_sum_overflow_rollback<uint64_t>("L", ValueType::UInt64);
  check_large_sum_overflow_rollback<int32_t>("i", ValueType::Int32);
}

TEST(string_and_binary_values_var_output_and_large_offsets) {
  StateTable t(0, 127);
  const BatchKeySpec sp = spec_for(KeyType::Binary);
  TestArray keys = varwidth<int64_t>("Z", Str{std::string("\x00\x01", 2), "k2", "k3"}, 2);
  TestArray vals = varwidth<int32_t>("z", Str{"value-one", std::string("\x00", 1), ""});
  put_batch(t, sp, keys.in(), ValueType::Binary, vals.in());
  CHECK_EQ(t.size(), size_t{3});
  TestArray q = varwidth<int32_t>("z", Str{"k3", "nope", std::string("\x00\x01", 2), "k2"});
  std::vector<int64_t> offs;
  std::vector<uint8_t> data(5, 0xEE);  // cleared by the kernel
  uint8_t valid[4];
  get_batch_var(t, sp, q.in(), ValueType::Binary, offs, data, valid);
  CHECK_EQ(offs.size(), size_t{5});
  const int64_t want_offs[5] = {0, 0, 0, 9, 10};
  for (int i = 0; i < 5; ++i) CHECK_EQ(offs[i], want_offs[i]);
  const uint8_t want_valid[4] = {1, 0, 1, 1};
  for (int i = 0; i < 4; ++i) CHECK_EQ(int(valid[i]), int(want_valid[i]));
  CHECK_EQ(std::string(data.begin(), data.end()), std::string("value-one\x00", 10));

  // large_utf8 keys + utf8 values under a string key type.
  StateTable ts(0, 127);
  const BatchKeySpec ss = spec_for(KeyType::String, Assigner::Flink);
  TestArray sk = varwidth<int64_t>("U", Str{"a", "\xe6\x97\xa5"});
  TestArray sv = varwidth<int64_t>("U", Str{"x", "yz"});
  put_batch(ts, ss, sk.in(), ValueType::String, sv.in());
  TestArray sq = varwidth<int32_t>("u", Str{"\xe6\x97\xa5", "a"});
  get_batch_var(ts, ss, sq.in(), ValueType::String, offs, data, valid);
  CHECK_EQ(std::string(data.begin(), data.end()), std::string("yzx"));
}

TEST(sliced_arrays_ignore_elements_before_the_offset) {
  // Padding elements before the offset are null and hold junk; nulls there must not count as
  // null keys, and a validity bit inside the slice must be read at (offset + i).
  StateTable t(0, 127);
  const BatchKeySpec sp = spec_for(KeyType::Int64);
  TestArray keys = fixed<int64_t>("l", I64{100, 200, 300}, 13);
  TestArray vals = fixed<int64_t>("l", I64{1, std::nullopt, 3}, 5);
  int64_t out[3];
  uint8_t valid[3];
  add_batch(t, sp, keys.in(), ValueType::Int64, Reducer::Sum, vals.in(), out, valid);
  CHECK_EQ(int(valid[0]), 1);
  CHECK_EQ(int(valid[1]), 0);
  CHECK_EQ(int(valid[2]), 1);
  CHECK_EQ(out[0], int64_t{1});
  CHECK_EQ(out[2], int64_t{3});
  CHECK_EQ(t.size(), size_t{2});
  // A null inside the slice of the key array is found at the right row.
  TestArray bad = fixed<int64_t>("l", I64{1, 2, std::nullopt, 4}, 9);
  CHECK(batch_error([&] { get_batch_fixed(t, sp, bad.in(), ValueType::Int64, out, valid); },
                    "null key at row 2"));
}

TEST(errors_leave_the_table_untouched) {
  StateTable t(0, 127);
  const BatchKeySpec sp = spec_for(KeyType::Int64);
  TestArray k0 = fixed<int64_t>("l", I64{1, 2, 3, 4});
  TestArray v0 = fixed<int64_t>("l", I64{10, 20, 30, 40});
  put_batch(t, sp, k0.in(), ValueType::Int64, v0.in());
  const auto before = dump(t);
  int64_t out[8];
  uint8_t valid[8];

  // Length mismatch.
  TestArray k1 = fixed<int64_t>("l", I64{1, 2, 3});
  TestArray v1 = fixed<int64_t>("l", I64{5, 5});
  CHECK(batch_error([&] { put_batch(t, sp, k1.in(), ValueType::Int64, v1.in()); }, "length"));
  CHECK(batch_error(
      [&] { add_batch(t, sp, k1.in(), ValueType::Int64, Reducer::Sum, v1.in(), out, valid); },
      "length"));
  // Null key in the last row: rows before it must not have been applied.
  TestArray k2 = fixed<int64_t>("l", I64{1, 2, std::nullopt});
  TestArray v2 = fixed<int64_t>("l", I64{5, 5, 5});
  CHECK(batch_error(
      [&] { add_batch(t, sp, k2.in(), ValueType::Int64, Reducer::Sum, v2.in(), out, valid); },
      "null key at row 2"));
  CHECK(batch_error([&] { put_batch(t, sp, k2.in(), ValueType::Int64, v2.in()); }, "row 2"));
  // Unsupported formats: float32 keys, timestamp values, wrong key type, wrong value type.
  TestArray f32 = fixed<float>("f", std::vector<std::optional<float>>{1.f, 2.f, 3.f});
  CHECK(batch_error([&] { put_batch(t, sp, f32.in(), ValueType::Int64, v2.in()); },
                    "unsupported Arrow format 'f'"));
  TestArray ts = fixed<int64_t>("tsu:", I64{1, 2, 3});
  CHECK(batch_error([&] { put_batch(t, sp, k1.in(), ValueType::Int64, ts.in()); },
                    "value type int64, got timestamp"));
  TestArray i32 = fixed<int32_t>("i", std::vector<std::optional<int32_t>>{1, 2, 3});
  CHECK(batch_error([&] { put_batch(t, sp, i32.in(), ValueType::Int64, v2.in()); },
                    "key type int64, got int32"));
  TestArray dv = fixed<double>("g", F64{1, 2, 3});
  CHECK(batch_error([&] { put_batch(t, sp, k1.in(), ValueType::Int64, dv.in()); },
                    "value type int64, got float64"));
  CHECK(batch_error(
      [&] { add_batch(t, sp, k1.in(), ValueType::String, Reducer::Sum, dv.in(), out, valid); },
      "int64, float64 or int32"));
  // Released array.
  TestArray rel = fixed<int64_t>("l", I64{1, 2, 3});
  rel.array.release = nullptr;
  CHECK(batch_error([&] { put_batch(t, sp, rel.in(), ValueType::Int64, v2.in()); }, "released"));
  // Corrupt (decreasing) offsets.
  TestArray so = varwidth<int32_t>("u", Str{"ab", "c"});
  int32_t* o = reinterpret_cast<int32_t*>(so.data.data());
  o[1] = 3;
  o[2] = 1;
  const BatchKeySpec ssp = spec_for(KeyType::String);
  CHECK(batch_error([&] { get_batch_fixed(t, ssp, so.in(), ValueType::Int64, out, valid); },
                    "invalid Arrow data: row 0: offset 3 past the array's last offset 1"));
  // Flink + malformed UTF-8 key at row 1.
  TestArray badutf = varwidth<int32_t>("u", Str{"ok", "\xff"});
  TestArray v3 = fixed<int64_t>("l", I64{1, 1});
  CHECK(batch_error(
      [&] {
        put_batch(t, spec_for(KeyType::String, Assigner::Flink), badutf.in(), ValueType::Int64,
                  v3.in());
      },
      "row 1"));
  CHECK(dump(t) == before);
}

TEST(key_group_outside_range_is_rejected_before_mutation) {
  // A table serving only key groups [0, 63] of 128 (operator 0 of 2).
  StateTable t(0, 63);
  const BatchKeySpec sp = spec_for(KeyType::Int64, Assigner::Spark, 128, 0, 63);
  // Find keys on both sides of the range.
  I64 inside, outside;
  for (int64_t k = 0; inside.size() < 5 || outside.empty(); ++k) {
    const int32_t kg = key_group_for_int64(Assigner::Spark, k, 128);
    if (kg <= 63 && inside.size() < 5) inside.push_back(k);
    else if (kg > 63 && outside.empty()) outside.push_back(k);
  }
  I64 ks = inside;
  ks.push_back(outside[0]);
  I64 vs(ks.size(), int64_t{1});
  TestArray ka = fixed<int64_t>("l", ks);
  TestArray va = fixed<int64_t>("l", vs);
  int64_t out[6];
  uint8_t valid[6];
  CHECK(batch_error(
      [&] { add_batch(t, sp, ka.in(), ValueType::Int64, Reducer::Sum, va.in(), out, valid); },
      "row 5 belongs to key group"));
  CHECK_EQ(t.size(), size_t{0});
  // The first five alone are fine.
  TestArray k5 = fixed<int64_t>("l", inside);
  TestArray v5 = fixed<int64_t>("l", I64(5, int64_t{1}));
  add_batch(t, sp, k5.in(), ValueType::Int64, Reducer::Sum, v5.in(), out, valid);
  CHECK_EQ(t.size(), size_t{5});
  // A spec range the table does not hold, or an invalid one.
  const BatchKeySpec wide = spec_for(KeyType::Int64, Assigner::Spark, 128, 0, 127);
  CHECK(batch_error([&] { get_batch_fixed(t, wide, k5.in(), ValueType::Int64, out, valid); },
                    "does not hold"));
  const BatchKeySpec inverted = spec_for(KeyType::Int64, Assigner::Spark, 128, 10, 5);
  CHECK(batch_error([&] { get_batch_fixed(t, inverted, k5.in(), ValueType::Int64, out, valid); },
                    "kg_start <= kg_end"));
  const BatchKeySpec badmaxp = spec_for(KeyType::Int64, Assigner::Spark, 0, 0, 0);
  CHECK(batch_error([&] { get_batch_fixed(t, badmaxp, k5.in(), ValueType::Int64, out, valid); },
                    "max_parallelism"));
}

TEST(output_and_type_checks_for_get) {
  StateTable t(0, 127);
  const BatchKeySpec sp = spec_for(KeyType::Int64);
  TestArray k = fixed<int64_t>("l", I64{1});
  std::vector<int64_t> offs;
  std::vector<uint8_t> data;
  uint8_t valid[1];
  int64_t out[1];
  CHECK(batch_error([&] { get_batch_fixed(t, sp, k.in(), ValueType::String, out, valid); },
                    "not fixed-width"));
  CHECK(batch_error([&] { get_batch_var(t, sp, k.in(), ValueType::Int64, offs, data, valid); },
                    "not variable-width"));
  CHECK(batch_error([&] { get_batch_fixed(t, sp, k.in(), ValueType::Int64, nullptr, valid); },
                    "null output"));
  // Empty batches are fine and need no buffers.
  TestArray e = fixed<int64_t>("l", I64{});
  get_batch_fixed(t, sp, e.in(), ValueType::Int64, nullptr, nullptr);
  get_batch_var(t, sp, e.in(), ValueType::String, offs, data, nullptr);
  CHECK_EQ(offs.size(), size_t{1});
  put_batch(t, sp, e.in(), ValueType::Int64, e.in());
  add_batch(t, sp, e.in(), ValueType::Int64, Reducer::Sum, e.in(), nullptr, nullptr);
  CHECK_EQ(t.size(), size_t{0});
}

TEST(stored_value_of_wrong_width_is_reported) {
  // The table was written as a string-valued state; reading it as int64 is a caller bug that the
  // kernels report (naming the row) instead of reading out of bounds.
  StateTable t(0, 127);
  const BatchKeySpec sp = spec_for(KeyType::Int64);
  TestArray k = fixed<int64_t>("l", I64{1});
  TestArray v = varwidth<int32_t>("u", Str{"abc"});
  put_batch(t, sp, k.in(), ValueType::String, v.in());
  int64_t out[1];
  uint8_t valid[1];
  CHECK(batch_error([&] { get_batch_fixed(t, sp, k.in(), ValueType::Int64, out, valid); },
                    "holds 3 bytes"));
  TestArray n = fixed<int64_t>("l", I64{5});
  CHECK(batch_error(
      [&] { add_batch(t, sp, k.in(), ValueType::Int64, Reducer::Sum, n.in(), out, valid); },
      "row 0"));
}

// ---------------------------------------------------------------------------------------- TTL
// The TTL kernels against statecore/backends/ttl_states.py (the specification): expiry exactly at
// ts + ttl, the overflow guard, renewal, ReturnExpiredIfNotCleanedUp, add_batch against a model
// of Python's staged `_TtlReducing.add_batch`, the overflow undo, copy-on-write isolation.
namespace {

TtlBatchSpec ttl_at(int64_t ttl_ms, int64_t now, bool update_on_read = false,
                    bool return_expired = false) {
  TtlBatchSpec t;
  t.enabled = true;
  t.ttl_ms = ttl_ms;
  t.now = now;
  t.update_on_read = update_on_read;
  t.return_expired = return_expired;
  return t;
}

std::string ekey(int64_t k) {
  KeyEncoder enc(KeyType::Int64, NamespaceType::Void, 128);
  enc.key_int64(key_group_for_int64(Assigner::Spark, k, 128), k);
  enc.namespace_void();
  return std::string(reinterpret_cast<const char*>(enc.data()), enc.size());
}

StateMap& map_of(StateTable& t, int64_t k) {
  return t.map(key_group_for_int64(Assigner::Spark, k, 128));
}

// (value, ts) of an int64 TTL entry, nullopt when absent.
std::optional<std::pair<int64_t, int64_t>> entry(StateTable& t, int64_t k) {
  const std::string e = ekey(k);
  ByteView v;
  if (!map_of(t, k).get(reinterpret_cast<const uint8_t*>(e.data()), e.size(), &v))
    return std::nullopt;
  if (v.size != 16) return std::make_pair(int64_t{-999}, int64_t{-999});
  const std::string b(reinterpret_cast<const char*>(v.data), 8);
  return std::make_pair(le_i64(b), ttl::load_timestamp(v.data + 8));
}

// A bool array (bit-packed values) with `pad` null junk elements before the logical start.
TestArray bools(const std::vector<std::optional<bool>>& xs, int64_t pad = 0) {
  TestArray a;
  a.format = "b";
  const int64_t total = pad + static_cast<int64_t>(xs.size());
  a.data.assign(static_cast<size_t>(total / 8 + 1), 0xFF);  // junk 1 bits under nulls / padding
  bool any_null = pad > 0;
  for (int64_t j = 0; j < total; ++j) {
    const bool valid = j >= pad && xs[j - pad].has_value();
    if (valid && !*xs[j - pad]) a.data[j / 8] &= static_cast<uint8_t>(~(1u << (j % 8)));
    a.set_valid(j, valid);
    any_null = any_null || !valid;
  }
  a.finish(static_cast<int64_t>(xs.size()), pad, 2, any_null);
  return a;
}

using I32 = std::vector<std::optional<int32_t>>;

TEST(int32_values_roundtrip_as_4_byte_little_endian) {
  StateTable t(0, 127);
  const BatchKeySpec sp = spec_for(KeyType::Int64);
  TestArray keys = fixed<int64_t>("l", I64{1, 2, 3}, 2);
  TestArray vals = fixed<int32_t>("i", I32{INT32_MIN, std::nullopt, 0x01020304}, 3);
  put_batch(t, sp, keys.in(), ValueType::Int32, vals.in());
  CHECK_EQ(t.size(), size_t{2});
  const auto d = dump(t);
  CHECK(d.at(ekey(3)) == std::string("\x04\x03\x02\x01", 4));  // serializers.py: struct "<i"
  CHECK(d.at(ekey(1)) == std::string("\x00\x00\x00\x80", 4));
  TestArray q = fixed<int64_t>("l", I64{3, 2, 1});
  int32_t out[3];
  uint8_t valid[3];
  get_batch_fixed(t, sp, q.in(), ValueType::Int32, out, valid);
  CHECK_EQ(out[0], 0x01020304);
  CHECK_EQ(int(valid[1]), 0);
  CHECK_EQ(out[2], INT32_MIN);
  // Running min/max/sum keep int32; a sum leaving int32 throws and rolls the batch back.
  TestArray k2 = fixed<int64_t>("l", I64{3, 3, 1});
  TestArray v2 = fixed<int32_t>("i", I32{-4, 100, 5});
  add_batch(t, sp, k2.in(), ValueType::Int32, Reducer::Min, v2.in(), out, valid);
  CHECK_EQ(out[0], -4);
  CHECK_EQ(out[1], -4);
  CHECK_EQ(out[2], INT32_MIN);
  const auto before = dump(t);
  TestArray k3 = fixed<int64_t>("l", I64{1, 3, 1});
  TestArray v3 = fixed<int32_t>("i", I32{1, 1, -2});
  CHECK(batch_error(
      [&] { add_batch(t, sp, k3.in(), ValueType::Int32, Reducer::Sum, v3.in(), out, valid); },
      "int32 sum overflows"));
  CHECK(dump(t) == before);
  // int64 values are not int32 values.
  TestArray v64 = fixed<int64_t>("l", I64{1, 2, 3});
  CHECK(batch_error([&] { put_batch(t, sp, q.in(), ValueType::Int32, v64.in()); },
                    "value type int32, got int64"));
}

TEST(bool_values_roundtrip_as_one_byte_and_only_first_last_reduce) {
  StateTable t(0, 127);
  const BatchKeySpec sp = spec_for(KeyType::Int64);
  TestArray keys = fixed<int64_t>("l", I64{1, 2, 3, 4}, 1);
  TestArray vals = bools({true, false, std::nullopt, true}, 5);
  put_batch(t, sp, keys.in(), ValueType::Bool, vals.in());
  CHECK_EQ(t.size(), size_t{3});
  const auto d = dump(t);
  CHECK(d.at(ekey(1)) == std::string("\x01", 1));
  CHECK(d.at(ekey(2)) == std::string("\x00", 1));
  uint8_t out[4], valid[4];
  TestArray q = fixed<int64_t>("l", I64{4, 3, 2, 1});
  get_batch_fixed(t, sp, q.in(), ValueType::Bool, out, valid);
  CHECK_EQ(int(out[0]), 1);
  CHECK_EQ(int(valid[1]), 0);
  CHECK_EQ(int(out[2]), 0);
  CHECK_EQ(int(valid[2]), 1);
  CHECK_EQ(int(out[3]), 1);
  // Last replaces, First keeps; Sum/Min/Max are rejected before anything changes.
  TestArray k2 = fixed<int64_t>("l", I64{2, 1});
  TestArray v2 = bools({true, false});
  add_batch(t, sp, k2.in(), ValueType::Bool, Reducer::Last, v2.in(), out, valid);
  CHECK_EQ(int(out[0]), 1);
  CHECK_EQ(int(out[1]), 0);
  add_batch(t, sp, k2.in(), ValueType::Bool, Reducer::First, v2.in(), out, valid);
  CHECK_EQ(int(out[0]), 1);
  const auto before = dump(t);
  for (Reducer r : {Reducer::Sum, Reducer::Min, Reducer::Max})
    CHECK(batch_error([&] { add_batch(t, sp, k2.in(), ValueType::Bool, r, v2.in(), out, valid); },
                      "not bool"));
  CHECK(dump(t) == before);
}

TEST(int32_and_bool_with_ttl_carry_the_timestamp_after_the_value) {
  StateTable t(0, 127);
  const BatchKeySpec sp = spec_for(KeyType::Int64);
  TtlBatchSpec ttl;
  ttl.enabled = true;
  ttl.ttl_ms = 10;
  ttl.now = 100;
  TestArray k = fixed<int64_t>("l", I64{1});
  TestArray v = fixed<int32_t>("i", I32{7});
  put_batch(t, sp, k.in(), ValueType::Int32, v.in(), ttl);
  CHECK_EQ(dump(t).at(ekey(1)).size(), size_t{12});
  int32_t out[1];
  uint8_t valid[1];
  int64_t expired = 0;
  ttl.now = 109;
  add_batch(t, sp, k.in(), ValueType::Int32, Reducer::Sum, v.in(), out, valid, ttl, &expired);
  CHECK_EQ(out[0], 14);
  ttl.now = 119;  // 109 + 10: expired
  get_batch_fixed(t, sp, k.in(), ValueType::Int32, out, valid, ttl, &expired);
  CHECK_EQ(int(valid[0]), 0);
  CHECK_EQ(expired, int64_t{1});
  CHECK_EQ(t.size(), size_t{0});
  TestArray b = bools({true});
  put_batch(t, sp, k.in(), ValueType::Bool, b.in(), ttl);
  CHECK_EQ(dump(t).at(ekey(1)).size(), size_t{9});
  uint8_t bout[1];
  get_batch_fixed(t, sp, k.in(), ValueType::Bool, bout, valid, ttl, &expired);
  CHECK_EQ(int(bout[0]), 1);
  // The same table read as int32: a width error names the row, no silent misread.
  CHECK(batch_error(
      [&] { get_batch_fixed(t, sp, k.in(), ValueType::Int32, out, valid, ttl, &expired); },
      "holds 9 bytes, expected 12"));
}

TEST(validate_batch_throws_what_the_kernel_would_and_changes_nothing) {
  StateTable t(0, 63);
  const BatchKeySpec sp = spec_for(KeyType::Int64, Assigner::Spark, 128, 0, 63);
  int64_t outside = 0;
  while (key_group_for_int64(Assigner::Spark, outside, 128) <= 63) ++outside;
  int64_t inside = 0;
  while (key_group_for_int64(Assigner::Spark, inside, 128) > 63) ++inside;
  TestArray good = fixed<int64_t>("l", I64{inside});
  TestArray bad = fixed<int64_t>("l", I64{inside, outside});
  TestArray nullkey = fixed<int64_t>("l", I64{inside, std::nullopt});
  TestArray v1 = fixed<int64_t>("l", I64{1});
  TestArray v2 = fixed<int64_t>("l", I64{1, 2});
  TestArray d2 = fixed<double>("g", F64{1, 2});
  ArrowInput none;
  validate_batch(t, sp, good.in(), ValueType::Int64, BatchOp::Put, Reducer::Sum, v1.in());
  validate_batch(t, sp, good.in(), ValueType::Int64, BatchOp::Get, Reducer::Sum, none);
  CHECK(batch_error(
      [&] { validate_batch(t, sp, bad.in(), ValueType::Int64, BatchOp::Get, Reducer::Sum, none); },
      "row 1 belongs to key group"));
  CHECK(batch_error(
      [&] {
        validate_batch(t, sp, nullkey.in(), ValueType::Int64, BatchOp::Put, Reducer::Sum, v2.in());
      },
      "null key at row 1"));
  CHECK(batch_error(
      [&] {
        validate_batch(t, sp, good.in(), ValueType::Int64, BatchOp::Put, Reducer::Sum, v2.in());
      },
      "differs from keys length"));
  CHECK(batch_error(
      [&] {
        validate_batch(t, sp, bad.in(), ValueType::Int64, BatchOp::Add, Reducer::Max, d2.in());
      },
      "value type int64, got float64"));
  CHECK(batch_error(
      [&] {
        validate_batch(t, sp, good.in(), ValueType::Bool, BatchOp::Add, Reducer::Min, v1.in());
      },
      "not bool"));
  CHECK_EQ(t.size(), size_t{0});
}

void put_entry(StateTable& t, int64_t k, int64_t value, int64_t ts) {
  const std::string e = ekey(k);
  uint8_t* p = map_of(t, k).put(reinterpret_cast<const uint8_t*>(e.data()), e.size(), 16);
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(static_cast<uint64_t>(value) >> (8 * i));
  ttl::store_timestamp(p + 8, ts);
}

struct GetResult {
  std::vector<std::optional<int64_t>> values;
  int64_t expired = 0;
};

GetResult ttl_get(StateTable& t, const I64& keys, const TtlBatchSpec& ttl) {
  TestArray k = fixed<int64_t>("l", keys, 1);
  std::vector<int64_t> out(keys.size() + 1);
  std::vector<uint8_t> valid(keys.size() + 1);
  GetResult r;
  get_batch_fixed(t, spec_for(KeyType::Int64), k.in(), ValueType::Int64, out.data(), valid.data(),
                  ttl, &r.expired);
  for (size_t i = 0; i < keys.size(); ++i)
    r.values.push_back(valid[i] ? std::optional<int64_t>(out[i]) : std::nullopt);
  return r;
}

GetResult ttl_add(StateTable& t, const I64& keys, const I64& vals, const TtlBatchSpec& ttl,
                  Reducer red = Reducer::Sum) {
  TestArray k = fixed<int64_t>("l", keys);
  TestArray v = fixed<int64_t>("l", vals, 2);
  std::vector<int64_t> out(keys.size() + 1);
  std::vector<uint8_t> valid(keys.size() + 1);
  GetResult r;
  add_batch(t, spec_for(KeyType::Int64), k.in(), ValueType::Int64, red, v.in(), out.data(),
            valid.data(), ttl, &r.expired);
  for (size_t i = 0; i < keys.size(); ++i)
    r.values.push_back(valid[i] ? std::optional<int64_t>(out[i]) : std::nullopt);
  return r;
}

// Python's TTL reducing/value state over {key: (value, ts)}, transcribed from ttl_states.py
// (`_fresh`, `_unexpired`, `_TtlReducing.add_batch` with its staged writes, `_Ttl.get_batch`).
struct TtlModel {
  std::map<int64_t, std::pair<int64_t, int64_t>> table;
  int64_t expired = 0;

  std::optional<int64_t> fresh(int64_t k, const TtlBatchSpec& c) {
    auto it = table.find(k);
    if (it == table.end()) return std::nullopt;
    const auto [s, ts] = it->second;
    if (ttl::expired(ts, c.ttl_ms, c.now)) {
      table.erase(it);
      ++expired;
      return c.return_expired ? std::optional<int64_t>(s) : std::nullopt;
    }
    if (c.update_on_read) it->second = {s, c.now};
    return s;
  }
  std::optional<int64_t> unexpired(int64_t k, const TtlBatchSpec& c) {
    auto it = table.find(k);
    if (it == table.end()) return std::nullopt;
    if (ttl::expired(it->second.second, c.ttl_ms, c.now)) {
      ++expired;
      return std::nullopt;
    }
    return it->second.first;
  }
  std::vector<std::optional<int64_t>> get(const I64& keys, const TtlBatchSpec& c) {
    std::vector<std::optional<int64_t>> out;
    for (const auto& k : keys) out.push_back(fresh(*k, c));
    return out;
  }
  std::vector<std::optional<int64_t>> add_sum(const I64& keys, const I64& vals,
                                              const TtlBatchSpec& c) {
    std::map<int64_t, int64_t> staged;
    std::vector<std::optional<int64_t>> out;
    for (size_t i = 0; i < keys.size(); ++i) {
      const int64_t k = *keys[i];
      auto st = staged.find(k);
      if (!vals[i]) {
        out.push_back(st != staged.end() ? std::optional<int64_t>(st->second) : fresh(k, c));
        continue;
      }
      const std::optional<int64_t> acc =
          st != staged.end() ? std::optional<int64_t>(st->second) : unexpired(k, c);
      staged[k] = acc ? *acc + *vals[i] : *vals[i];
      out.push_back(staged[k]);
    }
    for (const auto& [k, v] : staged) table[k] = {v, c.now};
    return out;
  }
};

std::map<int64_t, std::pair<int64_t, int64_t>> contents(StateTable& t) {
  std::map<int64_t, std::pair<int64_t, int64_t>> out;
  for (int64_t k = 0; k < 8; ++k)
    if (auto e = entry(t, k)) out[k] = *e;
  return out;
}

}  // namespace

TEST(ttl_get_expires_exactly_at_ts_plus_ttl) {
  StateTable t(0, 127);
  put_entry(t, 1, 10, 1000);
  put_entry(t, 2, 20, 1000);
  // now = ts + ttl - 1: fresh, left as is (OnCreateAndWrite).
  GetResult r = ttl_get(t, I64{1, 2, 3}, ttl_at(100, 1099));
  CHECK(r.values == (std::vector<std::optional<int64_t>>{10, 20, std::nullopt}));
  CHECK_EQ(r.expired, int64_t{0});
  CHECK(entry(t, 1) == std::make_pair(int64_t{10}, int64_t{1000}));
  // now = ts + ttl: expired, removed, counted once even when the key repeats.
  r = ttl_get(t, I64{1, 1, 2}, ttl_at(100, 1100));
  CHECK(r.values ==
        (std::vector<std::optional<int64_t>>{std::nullopt, std::nullopt, std::nullopt}));
  CHECK_EQ(r.expired, int64_t{2});
  CHECK_EQ(t.size(), size_t{0});
}

TEST(ttl_overflow_guard_never_expires) {
  StateTable t(0, 127);
  put_entry(t, 1, 7, INT64_MAX - 5);
  put_entry(t, 2, 8, INT64_MAX - 200);
  // ts + ttl overflows for key 1: never expired; key 2: INT64_MAX - 100 <= now -> expired.
  GetResult r = ttl_get(t, I64{1, 2}, ttl_at(100, INT64_MAX));
  CHECK(r.values == (std::vector<std::optional<int64_t>>{7, std::nullopt}));
  CHECK_EQ(r.expired, int64_t{1});
  // ttl = INT64_MAX: nothing with ts > 0 ever expires.
  put_entry(t, 3, 9, 1);
  r = ttl_get(t, I64{3}, ttl_at(INT64_MAX, INT64_MAX));
  CHECK(r.values == (std::vector<std::optional<int64_t>>{9}));
  TestArray k = fixed<int64_t>("l", I64{1});
  int64_t out[1];
  uint8_t valid[1];
  CHECK(batch_error(
      [&] {
        get_batch_fixed(t, spec_for(KeyType::Int64), k.in(), ValueType::Int64, out, valid,
                        ttl_at(-1, 0));
      },
      "ttl_ms must be > 0"));
  CHECK_EQ(t.size(), size_t{2});
}

TEST(ttl_renewal_on_read_and_return_expired_once) {
  StateTable t(0, 127);
  put_entry(t, 1, 10, 1000);
  put_entry(t, 2, 20, 1000);
  // OnReadAndWrite: a fresh read renews to now; an expired one is not renewed but removed.
  GetResult r = ttl_get(t, I64{1}, ttl_at(100, 1050, true));
  CHECK(r.values == (std::vector<std::optional<int64_t>>{10}));
  CHECK(entry(t, 1) == std::make_pair(int64_t{10}, int64_t{1050}));
  CHECK(entry(t, 2) == std::make_pair(int64_t{20}, int64_t{1000}));
  r = ttl_get(t, I64{1, 2}, ttl_at(100, 1120, true));  // 1 renewed at 1050 -> fresh until 1150
  CHECK(r.values == (std::vector<std::optional<int64_t>>{10, std::nullopt}));
  CHECK_EQ(r.expired, int64_t{1});
  CHECK(entry(t, 1) == std::make_pair(int64_t{10}, int64_t{1120}));
  CHECK(!entry(t, 2));
  // ReturnExpiredIfNotCleanedUp: the stale value once, then nothing.
  put_entry(t, 3, 30, 0);
  r = ttl_get(t, I64{3, 3}, ttl_at(100, 5000, false, true));
  CHECK(r.values == (std::vector<std::optional<int64_t>>{30, std::nullopt}));
  CHECK_EQ(r.expired, int64_t{1});
  // Variable-width values: the suffix is not output.
  TestArray keys = fixed<int64_t>("l", I64{5, 6});
  TestArray vals = varwidth<int32_t>("u", Str{"abc", ""});
  put_batch(t, spec_for(KeyType::Int64), keys.in(), ValueType::String, vals.in(),
            ttl_at(100, 7000));
  std::vector<int64_t> offs;
  std::vector<uint8_t> data;
  uint8_t valid[3];
  int64_t expired = -1;
  TestArray q = fixed<int64_t>("l", I64{5, 6, 5});
  get_batch_var(t, spec_for(KeyType::Int64), q.in(), ValueType::String, offs, data, valid,
                ttl_at(100, 7099, true), &expired);
  CHECK_EQ(std::string(data.begin(), data.end()), std::string("abcabc"));
  CHECK(offs == (std::vector<int64_t>{0, 3, 3, 6}));
  CHECK_EQ(int(valid[0]) + int(valid[1]) + int(valid[2]), 3);
  CHECK_EQ(expired, int64_t{0});
  get_batch_var(t, spec_for(KeyType::Int64), q.in(), ValueType::String, offs, data, valid,
                ttl_at(100, 7198, false, true), &expired);  // renewed at 7099: still fresh
  CHECK_EQ(std::string(data.begin(), data.end()), std::string("abcabc"));
  get_batch_var(t, spec_for(KeyType::Int64), q.in(), ValueType::String, offs, data, valid,
                ttl_at(100, 7300, false, true), &expired);
  CHECK_EQ(std::string(data.begin(), data.end()), std::string("abc"));
  CHECK(offs == (std::vector<int64_t>{0, 3, 3, 3}));
  CHECK_EQ(int(valid[0]) * 100 + int(valid[1]) * 10 + int(valid[2]), 110);
  CHECK_EQ(expired, int64_t{2});
}

TEST(ttl_put_batch_stamps_now_and_null_removes) {
  StateTable t(0, 127);
  TestArray keys = fixed<int64_t>("l", I64{1, 2, 1});
  TestArray vals = fixed<int64_t>("l", I64{5, 6, 7}, 3);
  put_batch(t, spec_for(KeyType::Int64), keys.in(), ValueType::Int64, vals.in(), ttl_at(10, 42));
  CHECK(entry(t, 1) == std::make_pair(int64_t{7}, int64_t{42}));
  CHECK(entry(t, 2) == std::make_pair(int64_t{6}, int64_t{42}));
  TestArray k2 = fixed<int64_t>("l", I64{2});
  TestArray v2 = fixed<int64_t>("l", I64{std::nullopt});
  put_batch(t, spec_for(KeyType::Int64), k2.in(), ValueType::Int64, v2.in(), ttl_at(10, 43));
  CHECK(!entry(t, 2));
  TtlBatchSpec bad = ttl_at(0, 1);
  CHECK(batch_error(
      [&] { put_batch(t, spec_for(KeyType::Int64), keys.in(), ValueType::Int64, vals.in(), bad); },
      "ttl_ms"));
  CHECK(entry(t, 1) == std::make_pair(int64_t{7}, int64_t{42}));
}

TEST(ttl_add_batch_matches_python_staged_model_with_repeats) {
  // Random batches over 5 keys with many repeats, null rows and clock moves, for every
  // combination of update type and visibility: outputs, counts and contents equal the model.
  uint64_t rng = 0x9E3779B97F4A7C15ULL;
  auto next = [&](uint64_t m) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng % m;
  };
  for (int combo = 0; combo < 4; ++combo) {
    const bool uor = combo & 1, ret = combo & 2;
    StateTable t(0, 127);
    TtlModel model;
    int64_t now = 0, kernel_expired = 0;
    for (int step = 0; step < 400; ++step) {
      now += static_cast<int64_t>(next(4)) * 20;  // ttl 50: expiries every few steps
      const TtlBatchSpec c = ttl_at(50, now, uor, ret);
      const size_t n = next(8);
      I64 keys, vals;
      for (size_t i = 0; i < n; ++i) {
        keys.push_back(static_cast<int64_t>(next(5)));
        vals.push_back(next(3) == 0 ? std::nullopt : std::optional<int64_t>(next(100)));
      }
      if (next(3) == 0) {
        const auto want = model.get(keys, c);
        GetResult r = ttl_get(t, keys, c);
        CHECK(r.values == want);
        kernel_expired += r.expired;
      } else {
        const auto want = model.add_sum(keys, vals, c);
        GetResult r = ttl_add(t, keys, vals, c);
        CHECK(r.values == want);
        kernel_expired += r.expired;
      }
      CHECK_EQ(kernel_expired, model.expired);
      CHECK(contents(t) == model.table);
    }
    CHECK(model.expired > 20);  // the sequence does exercise expiry
  }
}

TEST(ttl_add_batch_expired_aggregate_starts_over_whatever_the_visibility) {
  for (bool ret : {false, true}) {
    StateTable t(0, 127);
    put_entry(t, 1, 100, 0);
    for (Reducer red : {Reducer::Sum, Reducer::Min, Reducer::Max, Reducer::Count, Reducer::First,
                        Reducer::Last}) {
      put_entry(t, 1, 100, 0);
      GetResult r = ttl_add(t, I64{1, 1}, I64{5, 3}, ttl_at(10, 10, false, ret), red);
      std::vector<std::optional<int64_t>> want;
      switch (red) {
        case Reducer::Sum: want = {5, 8}; break;
        case Reducer::Min: want = {5, 3}; break;
        case Reducer::Max: want = {5, 5}; break;
        case Reducer::Count: want = {1, 2}; break;
        case Reducer::First: want = {5, 5}; break;
        case Reducer::Last: want = {5, 3}; break;
      }
      CHECK(r.values == want);
      CHECK_EQ(r.expired, int64_t{1});
      CHECK(entry(t, 1) == std::make_pair(*want[1], int64_t{10}));
    }
  }
}

TEST(ttl_int64_sum_overflow_undoes_aggregates_keeps_read_cleanup) {
  StateTable t(0, 127);
  put_entry(t, 1, 10, 500);  // fresh at 1000 (ttl 1000), overwritten then restored
  put_entry(t, 2, 20, 0);    // expired: replaced by the batch, restored with ts 0
  put_entry(t, 3, INT64_MAX - 1, 900);
  put_entry(t, 4, 40, 0);    // expired, read by a null row: removed and stays removed
  put_entry(t, 5, 50, 800);  // fresh, renewed by a null row: the renewal stays
  const auto before_1 = entry(t, 1);
  GetResult r;
  int64_t expired = -1;
  TestArray k = fixed<int64_t>("l", I64{1, 2, 6, 4, 5, 5, 1, 3});
  TestArray v = fixed<int64_t>("l", I64{1, 2, 3, std::nullopt, std::nullopt, 7, 4, 5});
  std::vector<int64_t> out(8);
  std::vector<uint8_t> valid(8);
  CHECK(batch_error(
      [&] {
        add_batch(t, spec_for(KeyType::Int64), k.in(), ValueType::Int64, Reducer::Sum, v.in(),
                  out.data(), valid.data(), ttl_at(1000, 1000, true), &expired);
      },
      "overflows"));
  CHECK(entry(t, 1) == before_1);
  CHECK(entry(t, 2) == std::make_pair(int64_t{20}, int64_t{0}));
  CHECK(entry(t, 3) == std::make_pair(INT64_MAX - 1, int64_t{900}));
  CHECK(!entry(t, 4));
  CHECK(entry(t, 5) == std::make_pair(int64_t{50}, int64_t{1000}));
  CHECK(!entry(t, 6));
  CHECK_EQ(expired, int64_t{2});  // key 2 (an add found it expired) and key 4 (removed on read)
  // The model agrees: Python raises before applying its staged writes.
  TtlModel model;
  model.table = {
      {1, {10, 500}}, {2, {20, 0}}, {3, {INT64_MAX - 1, 900}}, {4, {40, 0}}, {5, {50, 800}}};
  const TtlBatchSpec c = ttl_at(1000, 1000, true);
  model.unexpired(1, c);
  model.unexpired(2, c);
  model.unexpired(6, c);
  model.fresh(4, c);
  model.fresh(5, c);
  model.unexpired(3, c);
  CHECK_EQ(model.expired, expired);
  CHECK(contents(t) == model.table);
}

TEST(ttl_get_and_add_leave_a_prior_snapshot_unchanged) {
  StateTable t(0, 127);
  for (int64_t k = 0; k < 6; ++k) put_entry(t, k, k * 10, k < 3 ? 0 : 900);
  TableSnapshot snap = t.snapshot();
  auto snap_dump = [&] {
    std::map<std::string, std::string> out;
    for (int32_t kg = snap.kg_start(); kg <= snap.kg_end(); ++kg) {
      const SortedRun run = snap.map(kg)->sorted_entries();
      for (size_t i = 0; i < run.size(); ++i)
        out[std::string(reinterpret_cast<const char*>(run.key(i).data), run.key(i).size)] =
            std::string(reinterpret_cast<const char*>(run.value(i).data), run.value(i).size);
    }
    return out;
  };
  const auto before = snap_dump();
  CHECK_EQ(before, dump(t));
  // Removes 0..2 (expired), renews 3..5; then an add overwrites 3 and recreates 0.
  GetResult r = ttl_get(t, I64{0, 1, 2, 3, 4, 5}, ttl_at(100, 950, true));
  CHECK_EQ(r.expired, int64_t{3});
  ttl_add(t, I64{3, 0}, I64{1, 1}, ttl_at(100, 960));
  CHECK(entry(t, 4) == std::make_pair(int64_t{40}, int64_t{950}));
  CHECK(entry(t, 3) == std::make_pair(int64_t{31}, int64_t{960}));
  CHECK(snap_dump() == before);
  CHECK(before != dump(t));
  snap.release();
}

TEST(ttl_wrong_width_is_a_batch_error) {
  StateTable t(0, 127);
  TestArray keys = fixed<int64_t>("l", I64{1});
  TestArray vals = fixed<int64_t>("l", I64{5});
  put_batch(t, spec_for(KeyType::Int64), keys.in(), ValueType::Int64, vals.in());  // no TTL
  int64_t out[1];
  uint8_t valid[1];
  CHECK(batch_error(
      [&] {
        get_batch_fixed(t, spec_for(KeyType::Int64), keys.in(), ValueType::Int64, out, valid,
                        ttl_at(10, 0));
      },
      "expected 16"));
  CHECK(batch_error(
      [&] {
        add_batch(t, spec_for(KeyType::Int64), keys.in(), ValueType::Int64, Reducer::Sum, vals.in(),
                  out, valid, ttl_at(10, 0));
      },
      "expected 16"));
  TestArray k2 = fixed<int64_t>("l", I64{2});
  TestArray v2 = varwidth<int32_t>("z", Str{"abc"});
  put_batch(t, spec_for(KeyType::Int64), k2.in(), ValueType::Binary, v2.in());  // 3 bytes, no TTL
  std::vector<int64_t> offs;
  std::vector<uint8_t> data;
  CHECK(batch_error(
      [&] {
        get_batch_var(t, spec_for(KeyType::Int64), k2.in(), ValueType::Binary, offs, data, valid,
                      ttl_at(10, 0));
      },
      "8-byte TTL timestamp"));
  CHECK_EQ(t.size(), size_t{2});
}

// ------------------------------------------------------ uint64, timestamp, fixed_size_binary

using U64 = std::vector<std::optional<uint64_t>>;

// A fixed_size_binary(w) array ("w:<w>") of w-byte strings, `pad` null junk elements first.
TestArray fsb(int32_t w, const Str& xs, int64_t pad = 0) {
  TestArray a;
  a.format = "w:" + std::to_string(w);
  bool any_null = pad > 0;
  const int64_t total = pad + static_cast<int64_t>(xs.size());
  for (int64_t j = 0; j < total; ++j) {
    const bool valid = j >= pad && xs[j - pad].has_value();
    const std::string s = valid ? *xs[j - pad] : std::string(static_cast<size_t>(w), 'J');
    a.data.insert(a.data.end(), s.begin(), s.end());
    a.set_valid(j, valid);
    any_null = any_null || !valid;
  }
  a.data.push_back(0);  // never empty
  a.finish(static_cast<int64_t>(xs.size()), pad, 2, any_null);
  return a;
}

std::string le_bytes(uint64_t u) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(u >> (8 * i));
  return out;
}

TEST(uint64_values_are_unsigned_little_endian_and_sum_overflow_rolls_back) {
  StateTable t(0, 127);
  const BatchKeySpec sp = spec_for(KeyType::Int64);
  const uint64_t top = UINT64_MAX, half = uint64_t{1} << 63;
  TestArray keys = fixed<int64_t>("l", I64{1, 2, 3, 4}, 2);
  TestArray vals = fixed<uint64_t>("L", U64{top, half, std::nullopt, 1}, 3);
  put_batch(t, sp, keys.in(), ValueType::UInt64, vals.in());
  CHECK_EQ(t.size(), size_t{3});
  const auto d = dump(t);
  CHECK(d.at(ekey(1)) == le_bytes(top));
  CHECK(d.at(ekey(2)) == le_bytes(half));
  TestArray q = fixed<int64_t>("l", I64{2, 3, 1, 4});
  uint64_t out[4];
  uint8_t valid[4];
  get_batch_fixed(t, sp, q.in(), ValueType::UInt64, out, valid);
  CHECK_EQ(out[0], half);
  CHECK_EQ(int(valid[1]), 0);
  CHECK_EQ(out[1], uint64_t{0});
  CHECK_EQ(out[2], top);
  CHECK_EQ(out[3], uint64_t{1});
  // Min/Max compare unsigned: 2^63 is above 1 (as int64 it would be below).
  TestArray k2 = fixed<int64_t>("l", I64{4, 4, 2});
  TestArray v2 = fixed<uint64_t>("L", U64{half, 0, 1});
  add_batch(t, sp, k2.in(), ValueType::UInt64, Reducer::Max, v2.in(), out, valid);
  CHECK_EQ(out[0], half);
  CHECK_EQ(out[1], half);
  CHECK_EQ(out[2], half);
  add_batch(t, sp, k2.in(), ValueType::UInt64, Reducer::Min, v2.in(), out, valid);
  CHECK_EQ(out[1], uint64_t{0});
  CHECK_EQ(out[2], uint64_t{1});
  // Sum: up to 2^64 - 1 fits; one more overflows, and the whole batch is undone.
  TestArray k3 = fixed<int64_t>("l", I64{9, 9});
  TestArray v3 = fixed<uint64_t>("L", U64{half, half - 1});
  add_batch(t, sp, k3.in(), ValueType::UInt64, Reducer::Sum, v3.in(), out, valid);
  CHECK_EQ(out[1], top);
  const auto before = dump(t);
  TestArray k4 = fixed<int64_t>("l", I64{5, 2, 9});
  TestArray v4 = fixed<uint64_t>("L", U64{7, 1, 1});
  CHECK(batch_error(
      [&] { add_batch(t, sp, k4.in(), ValueType::UInt64, Reducer::Sum, v4.in(), out, valid); },
      "uint64 sum overflows"));
  CHECK(dump(t) == before);
  TestArray i64 = fixed<int64_t>("l", I64{1, 2, 3, 4});
  CHECK(batch_error([&] { put_batch(t, sp, q.in(), ValueType::UInt64, i64.in()); },
                    "value type uint64, got int64"));
  CHECK(batch_error([&] { put_batch(t, sp, q.in(), ValueType::Int64, vals.in()); },
                    "value type int64, got uint64"));
}

TEST(timestamp_values_check_the_unit_and_reduce_as_int64) {
  StateTable t(0, 127);
  const BatchKeySpec sp = spec_for(KeyType::Int64);
  const ValueSpec ms = ValueSpec::timestamp('m');
  TestArray keys = fixed<int64_t>("l", I64{1, 2, 3}, 1);
  TestArray vals = fixed<int64_t>("tsm:", I64{INT64_MIN, -1, INT64_MAX}, 2);
  put_batch(t, sp, keys.in(), ms, vals.in());
  CHECK(dump(t).at(ekey(2)) == le_bytes(UINT64_MAX));  // -1: the int64 bytes
  // Any time zone: the stored count is UTC-based either way.
  TestArray zoned = fixed<int64_t>("tsm:Asia/Tokyo", I64{5, std::nullopt, 6});
  put_batch(t, sp, keys.in(), ms, zoned.in());
  int64_t out[3];
  uint8_t valid[3];
  get_batch_fixed(t, sp, keys.in(), ms, out, valid);
  CHECK_EQ(out[0], int64_t{5});
  CHECK_EQ(int(valid[1]), 0);
  CHECK_EQ(out[2], int64_t{6});
  const auto before = dump(t);
  TestArray secs = fixed<int64_t>("tss:", I64{1, 2, 3});
  CHECK(batch_error([&] { put_batch(t, sp, keys.in(), ms, secs.in()); },
                    "value type timestamp[ms], got timestamp[s]"));
  CHECK(batch_error([&] { put_batch(t, sp, keys.in(), ValueType::Int64, vals.in()); },
                    "value type int64, got timestamp[ms]"));
  CHECK(batch_error([&] { add_batch(t, sp, keys.in(), ms, Reducer::Sum, vals.in(), out, valid); },
                    "Sum needs an int64, uint64, float64 or int32 state, not timestamp[ms]"));
  CHECK(batch_error([&] { put_batch(t, sp, keys.in(), ValueSpec::timestamp('x'), vals.in()); },
                    "unit 'x'"));
  CHECK(dump(t) == before);
  TestArray k2 = fixed<int64_t>("l", I64{1, 1, 3});
  TestArray v2 = fixed<int64_t>("tsm:", I64{INT64_MIN, 7, std::nullopt});
  add_batch(t, sp, k2.in(), ms, Reducer::Min, v2.in(), out, valid);
  CHECK_EQ(out[0], INT64_MIN);
  CHECK_EQ(out[1], INT64_MIN);
  CHECK_EQ(out[2], int64_t{6});
  add_batch(t, sp, k2.in(), ms, Reducer::Last, v2.in(), out, valid);
  CHECK_EQ(out[1], int64_t{7});
}

TEST(fixed_size_binary_values_are_their_bytes_and_compare_as_bytes) {
  for (int32_t w : {3, 300}) {  // 300: wider than the flat engine's inline values
    StateTable t(0, 127);
    const BatchKeySpec sp = spec_for(KeyType::Int64);
    const ValueSpec vt = ValueSpec::fixed_size_binary(w);
    auto val = [w](char c, char last = 0) {
      std::string s(static_cast<size_t>(w), c);
      if (last) s.back() = last;
      return s;
    };
    TestArray keys = fixed<int64_t>("l", I64{1, 2, 3}, 2);
    TestArray vals = fsb(w, Str{val('a'), std::nullopt, val('\x80', '\0')}, 3);
    put_batch(t, sp, keys.in(), vt, vals.in());
    CHECK_EQ(t.size(), size_t{2});
    CHECK(dump(t).at(ekey(3)) == val('\x80', '\0'));
    std::vector<uint8_t> out(4 * static_cast<size_t>(w), 0xEE);  // rows of the 4-row batches
    uint8_t valid[4];
    get_batch_fixed(t, sp, keys.in(), vt, out.data(), valid);
    CHECK(std::string(out.begin(), out.begin() + w) == val('a'));
    CHECK_EQ(int(valid[1]), 0);
    CHECK(std::string(out.begin() + w, out.begin() + 2 * w) == std::string(w, '\0'));
    CHECK(std::string(out.begin() + 2 * w, out.begin() + 3 * w) == val('\x80', '\0'));
    // memcmp order (unsigned bytes, Python's): 0x80 is above 'a' and 'b'.
    TestArray k2 = fixed<int64_t>("l", I64{1, 1, 3, 3});
    TestArray v2 = fsb(w, Str{val('b'), val('a', 'A'), val('b'), std::nullopt});
    add_batch(t, sp, k2.in(), vt, Reducer::Max, v2.in(), out.data(), valid);
    CHECK(std::string(out.begin(), out.begin() + w) == val('b'));
    CHECK(std::string(out.begin() + w, out.begin() + 2 * w) == val('b'));
    CHECK(std::string(out.begin() + 2 * w, out.begin() + 3 * w) == val('\x80', '\0'));
    add_batch(t, sp, k2.in(), vt, Reducer::Min, v2.in(), out.data(), valid);
    CHECK(std::string(out.begin() + w, out.begin() + 2 * w) == val('a', 'A'));
    CHECK(std::string(out.begin() + 2 * w, out.begin() + 3 * w) == val('b'));
    add_batch(t, sp, k2.in(), vt, Reducer::First, v2.in(), out.data(), valid);
    CHECK(std::string(out.begin(), out.begin() + w) == val('a', 'A'));
    add_batch(t, sp, k2.in(), vt, Reducer::Last, v2.in(), out.data(), valid);
    CHECK(std::string(out.begin() + w, out.begin() + 2 * w) == val('a', 'A'));
    CHECK_EQ(int(valid[3]), 1);  // a null row shows the current aggregate
    const auto before = dump(t);
    TestArray narrow = fsb(w - 1, Str{val('a').substr(1), std::nullopt, std::nullopt});
    CHECK(batch_error([&] { put_batch(t, sp, keys.in(), vt, narrow.in()); },
                      "value type fixed_size_binary[" + std::to_string(w) +
                          "], got fixed_size_binary[" + std::to_string(w - 1) + "]"));
    CHECK(batch_error(
        [&] { add_batch(t, sp, k2.in(), vt, Reducer::Sum, v2.in(), out.data(), valid); },
        "Sum needs"));
    CHECK(batch_error(
        [&] { put_batch(t, sp, keys.in(), ValueSpec::fixed_size_binary(0), vals.in()); },
        "width 0 must be >= 1"));
    CHECK(batch_error(
        [&] { validate_batch(t, sp, keys.in(), vt, BatchOp::Put, Reducer::Sum, narrow.in()); },
        "got fixed_size_binary"));
    CHECK(dump(t) == before);
    // With TTL the timestamp follows the w bytes; an expired aggregate starts over.
    TtlBatchSpec ttl;
    ttl.enabled = true;
    ttl.ttl_ms = 10;
    ttl.now = 100;
    StateTable tt(0, 127);
    int64_t expired = 0;
    add_batch(tt, sp, k2.in(), vt, Reducer::First, v2.in(), out.data(), valid, ttl, &expired);
    CHECK_EQ(dump(tt).at(ekey(1)).size(), static_cast<size_t>(w) + 8);
    ttl.now = 110;
    add_batch(tt, sp, k2.in(), vt, Reducer::First, v2.in(), out.data(), valid, ttl, &expired);
    CHECK_EQ(expired, int64_t{2});  // keys 1 and 3, each met once expired
    CHECK(std::string(out.begin(), out.begin() + w) == val('b'));
    ttl.now = 125;
    get_batch_fixed(tt, sp, keys.in(), vt, out.data(), valid, ttl, &expired);
    CHECK_EQ(int(valid[0]), 0);
    CHECK_EQ(expired, int64_t{2});
    CHECK_EQ(tt.size(), size_t{0});
  }
}

TEST_MAIN()
