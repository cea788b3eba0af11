// batch_encoded_keys (tiered_batch.h): the keys a batch's rows address, each once, all or only
// those the table lacks, against the entries put_batch writes for the same rows; bad keys throw
// with nothing appended.
#include <map>
#include <set>
#include <string>
#include <vector>

#include "batch_test_arrays.h"
#include "check.h"
#include "statecore/tiered_batch.h"

using namespace statecore;
using namespace statecore_test;

namespace {

std::vector<std::string> keys_of(const std::vector<int32_t>& off, const std::vector<uint8_t>& d) {
  std::vector<std::string> out;
  for (size_t i = 0; i + 1 < off.size(); ++i)
    out.emplace_back(reinterpret_cast<const char*>(d.data()) + off[i], off[i + 1] - off[i]);
  return out;
}

}  // namespace

TEST(every_row_once_in_first_row_order_as_put_batch_addresses_them) {
  StateTable t(0, 127);
  const BatchKeySpec sp = int64_spec();
  TestArray k = fixed<int64_t>("l", I64{5, 9, 5, -3, 9, 1000000007}, 2);
  TestArray v = fixed<int64_t>("l", I64{1, 2, 3, 4, 5, 6});
  std::vector<int32_t> off;
  std::vector<uint8_t> data;
  batch_encoded_keys(t, sp, k.in(), nullptr, false, &off, &data);
  const std::vector<std::string> got = keys_of(off, data);
  CHECK_EQ(got.size(), size_t(4));
  put_batch(t, sp, k.in(), ValueType::Int64, v.in());
  std::set<std::string> stored;
  for (const auto& kv : dump(t)) stored.insert(kv.first);
  CHECK(std::set<std::string>(got.begin(), got.end()) == stored);
  // First-row order: 5, 9, -3, 1000000007 (the key follows the 1-byte key-group prefix).
  CHECK_EQ(got[0].substr(1, 8), be64(5));
  CHECK_EQ(got[1].substr(1, 8), be64(9));
  CHECK_EQ(got[2].substr(1, 8), be64(-3));
}

TEST(only_absent_and_selected_rows) {
  StateTable t(0, 127);
  const BatchKeySpec sp = int64_spec();
  TestArray held = fixed<int64_t>("l", I64{1, 2});
  TestArray hv = fixed<int64_t>("l", I64{10, 20});
  put_batch(t, sp, held.in(), ValueType::Int64, hv.in());
  TestArray k = fixed<int64_t>("l", I64{1, 3, 2, 4, 3, 5});
  std::vector<int32_t> off;
  std::vector<uint8_t> data;
  batch_encoded_keys(t, sp, k.in(), nullptr, true, &off, &data);
  std::vector<std::string> got = keys_of(off, data);
  CHECK_EQ(got.size(), size_t(3));  // 3, 4, 5
  CHECK_EQ(got[0].substr(1, 8), be64(3));
  CHECK_EQ(got[2].substr(1, 8), be64(5));
  const uint8_t rows[6] = {1, 0, 1, 1, 0, 0};
  off.clear();
  data.clear();
  batch_encoded_keys(t, sp, k.in(), rows, false, &off, &data);
  got = keys_of(off, data);
  CHECK_EQ(got.size(), size_t(3));  // 1, 2, 4
  CHECK_EQ(got[1].substr(1, 8), be64(2));
  CHECK_EQ(got[2].substr(1, 8), be64(4));
  CHECK_EQ(dump(t).size(), size_t(2));  // nothing written
}

// Maps of many pages (the read lanes' path for int64 keys) and of string keys: the absent keys
// are exactly those put_batch never wrote, whichever slot of a long probe holds the others.
TEST(only_absent_over_large_maps_matches_the_written_keys) {
  for (const KeyType kt : {KeyType::Int64, KeyType::String}) {
    StateTable t(0, 127);
    const BatchKeySpec sp = kt == KeyType::Int64 ? int64_spec() : full_range_spec(kt, 128);
    auto keys_array = [&](const std::vector<int64_t>& ks) {
      if (kt == KeyType::Int64) {
        I64 xs(ks.begin(), ks.end());
        return fixed<int64_t>("l", xs);
      }
      Str xs;
      for (int64_t k : ks) xs.emplace_back("k" + std::to_string(k));
      return varwidth<int32_t>("u", xs);
    };
    std::vector<int64_t> held;
    for (int64_t k = 0; k < 200000; k += 2) held.push_back(k * 7919 % 1000003);
    TestArray hk = keys_array(held);
    I64 ones(held.size(), int64_t{1});
    TestArray hv = fixed<int64_t>("l", ones);
    put_batch(t, sp, hk.in(), ValueType::Int64, hv.in());
    std::set<int64_t> written(held.begin(), held.end());
    std::vector<int64_t> asked;
    for (int64_t k = 0; k < 50000; ++k) asked.push_back(k * 7919 % 1000003);
    TestArray ak = keys_array(asked);
    std::vector<int32_t> off;
    std::vector<uint8_t> data;
    batch_encoded_keys(t, sp, ak.in(), nullptr, true, &off, &data);
    const std::vector<std::string> got = keys_of(off, data);
    std::vector<int32_t> all_off;
    std::vector<uint8_t> all_data;
    batch_encoded_keys(t, sp, ak.in(), nullptr, false, &all_off, &all_data);
    const std::vector<std::string> all = keys_of(all_off, all_data);
    CHECK_EQ(all.size(), asked.size());  // distinct by construction
    std::vector<std::string> want;
    for (size_t i = 0; i < asked.size(); ++i)
      if (!written.count(asked[i])) want.push_back(all[i]);
    CHECK_EQ(got.size(), size_t(25000));
    CHECK(got == want);
  }
}

TEST(string_keys_repeat_and_empty) {
  StateTable t(0, 127);
  const BatchKeySpec sp = full_range_spec(KeyType::String, 128);
  TestArray k = varwidth<int32_t>(
      "u",
      Str{std::string("a"), std::string(""), std::string("a"), std::string("bcd"), std::string("")},
      1);
  std::vector<int32_t> off;
  std::vector<uint8_t> data;
  batch_encoded_keys(t, sp, k.in(), nullptr, false, &off, &data);
  CHECK_EQ(keys_of(off, data).size(), size_t(3));
  TestArray v = fixed<int64_t>("l", I64{1, 2, 3, 4, 5});
  put_batch(t, sp, k.in(), ValueType::Int64, v.in());
  std::set<std::string> stored;
  for (const auto& kv : dump(t)) stored.insert(kv.first);
  const std::vector<std::string> got = keys_of(off, data);
  CHECK(std::set<std::string>(got.begin(), got.end()) == stored);
}

TEST(bad_keys_throw_with_nothing_appended) {
  StateTable t(0, 127);
  const BatchKeySpec sp = int64_spec();
  TestArray k = fixed<int64_t>("l", I64{1, std::nullopt, 3});
  std::vector<int32_t> off{0};
  std::vector<uint8_t> data;
  CHECK_THROWS(batch_encoded_keys(t, sp, k.in(), nullptr, false, &off, &data), BatchError);
  CHECK_EQ(off.size(), size_t(1));
  CHECK(data.empty());
  TestArray wrong = fixed<double>("g", F64{1.0});
  CHECK_THROWS(batch_encoded_keys(t, sp, wrong.in(), nullptr, false, &off, &data), BatchError);
  CHECK_EQ(off.size(), size_t(1));
}

TEST(load_clean_batch_inserts_clean_entries_and_skips_nulls_and_held_keys) {
  StateTable t(0, 127);
  const BatchKeySpec sp = int64_spec();
  TestArray held = fixed<int64_t>("l", I64{37});
  TestArray hv = fixed<int64_t>("l", I64{70});
  put_batch(t, sp, held.in(), ValueType::Int64, hv.in());
  const uint64_t base = t.rebase();
  CHECK(base > 0);
  // 200 keys: 37 (held: skipped), every 10th a NULL value (skipped), the rest loaded.
  std::vector<int32_t> kgs, ko{0}, vo{0};
  std::vector<uint8_t> kd, vd, valid(25, 0);
  std::map<std::string, std::string> want = dump(t);
  for (int i = 0; i < 200; ++i) {
    const int64_t k = i * 37 % 1000;
    TestArray one = fixed<int64_t>("l", I64{k});
    std::vector<int32_t> o;
    std::vector<uint8_t> d;
    batch_encoded_keys(t, sp, one.in(), nullptr, false, &o, &d);
    kgs.push_back(d[0]);
    kd.insert(kd.end(), d.begin(), d.end());
    ko.push_back(static_cast<int32_t>(kd.size()));
    const bool null = i % 10 == 3;
    const std::string v = null ? "" : be64(k);
    vd.insert(vd.end(), v.begin(), v.end());
    vo.push_back(static_cast<int32_t>(vd.size()));
    if (!null) valid[i / 8] |= static_cast<uint8_t>(1u << (i % 8));
    const std::string key(d.begin(), d.end());
    if (!null && !want.count(key)) want[key] = v;
  }
  const size_t n = load_clean_batch(t, kgs.data(), ko.data(), kd.data(), vo.data(), vd.data(),
                                    valid.data(), 0, kgs.size());
  CHECK_EQ(n + 1, want.size());
  CHECK(dump(t) == want);
  for (const auto& kv : want) {
    const auto* k = reinterpret_cast<const uint8_t*>(kv.first.data());
    CHECK(t.map(static_cast<uint8_t>(kv.first[0])).is_clean(k, kv.first.size()));
  }
}

TEST_MAIN()
