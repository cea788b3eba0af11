// The fixed-value batch kernels' flat lanes (detail/flat_lane.h) against a model: add_batch,
// put_batch and get_batch_fixed over int64 keys while the maps switch between the lane and the
// general path -- growth (a rehash started by a batch insert, and one left in flight between
// batches), snapshots alive during a batch (shared directories and pages), a 2-byte key-group
// prefix, a colliding hash (probes crossing pages), a layout change (another value width
// converts a map) and put_batch's string values of varying widths.
#include <cstdint>
#include <cstdlib>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "batch_test_arrays.h"
#include "check.h"
#include "statecore/batch.h"
#include "statecore/key_codec.h"
#include "statecore/key_groups.h"
#include "statecore/state_table.h"

using namespace statecore;
using namespace statecore_test;

namespace {

BatchKeySpec spec_for(int32_t maxp) { return full_range_spec(KeyType::Int64, maxp); }

// The table contents as the model's form: int64 key -> little-endian value bytes. Keys are
// decoded from the encoded form (prefix | big-endian key | 00).
std::map<int64_t, std::string> contents(StateTable& t, int prefix) {
  std::map<int64_t, std::string> out;
  for (const auto& kv : dump(t)) {
    uint64_t u = 0;
    for (int b = 0; b < 8; ++b) u = (u << 8) | static_cast<uint8_t>(kv.first[prefix + b]);
    out[static_cast<int64_t>(u)] = kv.second;
  }
  return out;
}

std::map<int64_t, std::string> snapshot_contents(const TableSnapshot& s, int prefix) {
  std::map<int64_t, std::string> out;
  for (int32_t kg = s.kg_start(); kg <= s.kg_end(); ++kg) {
    const SortedRun run = s.map(kg)->sorted_entries();
    for (size_t i = 0; i < run.size(); ++i) {
      const ByteView k = run.key(i), v = run.value(i);
      uint64_t u = 0;
      for (int b = 0; b < 8; ++b) u = (u << 8) | k.data[prefix + b];
      out[static_cast<int64_t>(u)] = std::string(reinterpret_cast<const char*>(v.data), v.size);
    }
  }
  return out;
}

uint32_t colliding_hash(const uint8_t* data, size_t size) {
  return size > 0 ? data[size - 2] & 1 : 0;  // two buckets per map: long probes, page crossings
}

// Random batches of add_batch (Sum), put_batch and get_batch_fixed over `domain` keys against a
// model, a snapshot taken before some batches and checked after them.
void run_model(int32_t maxp, KeyHashFunction hash, int64_t domain, int batches, int rows,
               uint32_t seed, bool* saw_rehash_in_flight) {
  const BatchKeySpec sp = spec_for(maxp);
  const int prefix = key_group_prefix_size(maxp);
  StateTable t(0, maxp - 1, hash);
  std::map<int64_t, int64_t> model;
  std::mt19937_64 rng(seed);
  for (int b = 0; b < batches; ++b) {
    for (int32_t kg = 0; kg < maxp; ++kg)
      if (t.map(kg).is_rehashing()) *saw_rehash_in_flight = true;
    std::optional<TableSnapshot> snap;
    std::map<int64_t, std::string> before;
    if (b % 3 == 1) {
      snap.emplace(t.snapshot());
      before = contents(t, prefix);
    }
    I64 keys, vals;
    for (int r = 0; r < rows; ++r) {
      keys.push_back(static_cast<int64_t>(rng() % static_cast<uint64_t>(domain)) * 7919 - 1000);
      if (rng() % 16 == 0) vals.push_back(std::nullopt);
      else vals.push_back(static_cast<int64_t>(rng() % 1000) - 500);
    }
    TestArray k = fixed<int64_t>("l", keys, 1), v = fixed<int64_t>("l", vals, 2);
    const int op = b % 4;
    if (op == 0 || op == 3) {  // add_batch Sum: running sums, a null row shows the aggregate
      std::vector<int64_t> out(rows);
      std::vector<uint8_t> valid(rows);
      add_batch(t, sp, k.in(), ValueType::Int64, Reducer::Sum, v.in(), out.data(), valid.data());
      check_running_sums(model, keys, vals, out.data(), valid.data());
    } else if (op == 1) {  // put_batch: last row wins, a null removes
      put_batch(t, sp, k.in(), ValueType::Int64, v.in());
      for (int r = 0; r < rows; ++r) {
        if (vals[r]) model[*keys[r]] = *vals[r];
        else model.erase(*keys[r]);
      }
    } else {  // get_batch_fixed
      std::vector<int64_t> out(rows);
      std::vector<uint8_t> valid(rows);
      get_batch_fixed(t, sp, k.in(), ValueType::Int64, out.data(), valid.data());
      for (int r = 0; r < rows; ++r) {
        auto it = model.find(*keys[r]);
        CHECK_EQ(int(valid[r]), it == model.end() ? 0 : 1);
        CHECK_EQ(out[r], it == model.end() ? int64_t{0} : it->second);
      }
    }
    std::map<int64_t, std::string> want;
    for (const auto& kv : model) want[kv.first] = le64(kv.second);
    CHECK(contents(t, prefix) == want);
    CHECK_EQ(t.size(), model.size());
    if (snap) CHECK(snapshot_contents(*snap, prefix) == before);  // pages were shared
    if (snap && (op == 0 || op == 3)) {
      // Change tracking: the keys the batch wrote, logged by their first write in the epoch.
      std::set<int64_t> want_changed, changed;
      for (int r = 0; r < rows; ++r)
        if (vals[r]) want_changed.insert(*keys[r]);
      const TableSnapshot after = t.snapshot();
      for (int32_t kg = 0; kg < maxp; ++kg) {
        const SortedRun run = after.map(kg)->sorted_changes(snap->version());
        for (size_t i = 0; i < run.size(); ++i) {
          uint64_t u = 0;
          for (int j = 0; j < 8; ++j) u = (u << 8) | run.key(i).data[prefix + j];
          if (!run.removed(i)) changed.insert(static_cast<int64_t>(u));
        }
      }
      CHECK(changed == want_changed);
    }
  }
}

}  // namespace

TEST(lanes_match_the_model_through_growth_and_snapshots) {
  bool rehash = false;
  // Past 16k entries RowKeys prefetches (rows hashed ahead), below it encodes row by row.
  run_model(128, nullptr, 40000, 12, 9000, 1, &rehash);
  CHECK(rehash);
}

TEST(lanes_with_a_two_byte_key_group_prefix) {
  bool rehash = false;
  run_model(4096, nullptr, 30000, 8, 12000, 2, &rehash);
  CHECK(rehash);
}

TEST(lanes_with_a_colliding_hash_cross_pages) {
  bool rehash = false;
  // 2 maps, ~1500 keys each in two clusters: probes run over many 16 KiB pages and wrap.
  run_model(2, colliding_hash, 3000, 10, 2500, 3, &rehash);
}

uint64_t page_copies(StateTable& t) {
  uint64_t n = 0;
  for (int32_t kg = t.kg_start(); kg <= t.kg_end(); ++kg) n += t.map(kg).stats().page_copies;
  return n;
}

TEST(lanes_write_in_place_only_pages_no_snapshot_holds) {
  // The lane writes a page in place only when its directory's owned[] byte says no other
  // directory holds it (flat_table.h). Overlapping snapshots, a release before any write, a
  // release after writes: every snapshot keeps its contents, and pages are copied only while
  // a snapshot holds them. 8 key groups: ~3750 keys a map, 16 pages each.
  const int32_t maxp = 8;
  const BatchKeySpec sp = spec_for(maxp);
  const int prefix = key_group_prefix_size(maxp);
  StateTable t(0, maxp - 1);
  I64 keys, ones;
  for (int64_t i = 0; i < 30000; ++i) keys.push_back(i * 104729), ones.push_back(1);
  TestArray k = fixed<int64_t>("l", keys), v = fixed<int64_t>("l", ones);
  std::vector<int64_t> out(keys.size());
  std::vector<uint8_t> valid(keys.size());
  auto add = [&] {
    add_batch(t, sp, k.in(), ValueType::Int64, Reducer::Sum, v.in(), out.data(), valid.data());
  };
  add();
  add();  // every value 2: a rehash left in flight is finished, no new key starts another
  const uint64_t c0 = page_copies(t);
  auto s1 = std::make_optional(t.snapshot());
  const auto at1 = contents(t, prefix);
  add();  // 3: every page held by s1 is copied once
  const uint64_t c1 = page_copies(t);
  CHECK(c1 > c0);
  auto s2 = std::make_optional(t.snapshot());
  const auto at2 = contents(t, prefix);
  add();  // 4: the copies are shared with s2 now, so copied again
  const uint64_t c2 = page_copies(t);
  CHECK(c2 > c1);
  CHECK(snapshot_contents(*s1, prefix) == at1);
  CHECK(snapshot_contents(*s2, prefix) == at2);
  s1.reset();
  add();  // 5: pages are owned since the last copy: in place
  CHECK_EQ(page_copies(t), c2);
  CHECK(snapshot_contents(*s2, prefix) == at2);
  s2.reset();
  auto s3 = std::make_optional(t.snapshot());
  s3.reset();  // released before any write: the directory is exclusive again, pages never shared
  add();       // 6
  CHECK_EQ(page_copies(t), c2);
  auto s4 = std::make_optional(t.snapshot());
  const auto at4 = contents(t, prefix);
  add();  // 7: copies while s4 holds the pages
  const uint64_t c4 = page_copies(t);
  CHECK(c4 > c2);
  s4.reset();  // the copies' originals go away with s4; the live pages were owned all along
  add();       // 8
  CHECK_EQ(page_copies(t), c4);
  for (int64_t x : out) CHECK_EQ(x, 8);
  for (const auto& kv : at4) CHECK(kv.second == std::string("\x06\0\0\0\0\0\0\0", 8));
}

TEST(lanes_compare_every_key_byte) {
  // Keys equal but for their lowest or highest byte, many of them sharing a key group: with a
  // 2-byte prefix the suffix is 10 bytes, and the two compared words overlap in the middle only.
  for (int32_t maxp : {128, 4096}) {
    StateTable t(0, maxp - 1);
    const BatchKeySpec sp = spec_for(maxp);
    I64 keys, vals;
    for (int64_t hi = 0; hi < 40; ++hi) {
      for (int64_t lo = 0; lo < 256; ++lo) {
        keys.push_back((hi << 8) | lo);
        const uint64_t top = static_cast<uint64_t>(lo) << 56;
        keys.push_back(static_cast<int64_t>(top + 0x12340000u + static_cast<uint64_t>(hi)));
      }
    }
    for (size_t i = 0; i < keys.size(); ++i) vals.push_back(static_cast<int64_t>(i));
    TestArray k = fixed<int64_t>("l", keys), v = fixed<int64_t>("l", vals);
    put_batch(t, sp, k.in(), ValueType::Int64, v.in());
    CHECK_EQ(t.size(), keys.size());
    std::vector<int64_t> out(keys.size());
    std::vector<uint8_t> valid(keys.size());
    get_batch_fixed(t, sp, k.in(), ValueType::Int64, out.data(), valid.data());
    for (size_t i = 0; i < keys.size(); ++i) CHECK_EQ(out[i], static_cast<int64_t>(i));
    add_batch(t, sp, k.in(), ValueType::Int64, Reducer::Sum, v.in(), out.data(), valid.data());
    for (size_t i = 0; i < keys.size(); ++i) CHECK_EQ(out[i], static_cast<int64_t>(2 * i));
  }
}

TEST(lanes_skip_maps_another_value_width_converted) {
  // int64 values fix the flat layouts; int32 values for half the keys convert the maps holding
  // them (put); int64 values for all keys again must then take the general path in those maps
  // (a lane opened there would write a chained map's memory as slots).
  StateTable t(0, 127);
  const BatchKeySpec sp = spec_for(128);
  I64 keys;
  for (int64_t i = 0; i < 3000; ++i) keys.push_back(i);
  TestArray k = fixed<int64_t>("l", keys), v = fixed<int64_t>("l", keys);
  put_batch(t, sp, k.in(), ValueType::Int64, v.in());
  std::vector<std::optional<int32_t>> small;
  for (int64_t i = 0; i < 1500; ++i) small.push_back(static_cast<int32_t>(-i));
  TestArray k2 = fixed<int64_t>("l", I64(keys.begin(), keys.begin() + 1500));
  TestArray v2 = fixed<int32_t>("i", small);
  put_batch(t, sp, k2.in(), ValueType::Int32, v2.in());
  size_t converted = 0;
  for (int32_t kg = 0; kg < 128; ++kg) converted += t.map(kg).is_flat() ? 0 : 1;
  CHECK(converted > 0 || std::getenv("STATECORE_MAP_ENGINE") != nullptr);
  I64 doubled;
  for (int64_t i = 0; i < 3000; ++i) doubled.push_back(2 * i);
  TestArray v3 = fixed<int64_t>("l", doubled);
  put_batch(t, sp, k.in(), ValueType::Int64, v3.in());
  std::vector<int64_t> out(3000);
  std::vector<uint8_t> valid(3000);
  get_batch_fixed(t, sp, k.in(), ValueType::Int64, out.data(), valid.data());
  for (int i = 0; i < 3000; ++i) {
    CHECK_EQ(int(valid[i]), 1);
    CHECK_EQ(out[i], int64_t{2} * i);
  }
  std::vector<int64_t> sums(3000);
  add_batch(t, sp, k.in(), ValueType::Int64, Reducer::Sum, v.in(), sums.data(), valid.data());
  for (int i = 0; i < 3000; ++i) CHECK_EQ(sums[i], int64_t{3} * i);
  CHECK_EQ(t.size(), size_t{3000});
}

TEST(lanes_put_string_values_of_varying_widths) {
  // The first insert of a flat map fixes its value width; a row of another width must not be
  // written through the lane opened for the first (it converts the map instead).
  StateTable t(0, 127);
  const BatchKeySpec sp = spec_for(128);
  I64 keys;
  Str vals;
  std::map<int64_t, std::string> model;
  for (int r = 0; r < 20000; ++r) {
    const int64_t key = r % 700;
    const std::string val(static_cast<size_t>(1 + (r * 7) % 13), static_cast<char>('a' + r % 26));
    keys.push_back(key);
    vals.push_back(val);
    model[key] = val;
  }
  TestArray k = fixed<int64_t>("l", keys), v = varwidth<int32_t>("u", vals);
  put_batch(t, sp, k.in(), ValueType::String, v.in());
  CHECK(contents(t, 1).size() == model.size());
  for (const auto& kv : contents(t, 1)) CHECK(kv.second == model[kv.first]);
}

TEST(hot_rows_count_first_writes_so_a_heavy_epoch_predicts_the_next) {
  // In an epoch that logs nothing, add_batch's hot rows stamp first writes without a call
  // (FoldHotRows); they count them, so that such an epoch, if heavy, keeps the next one from
  // logging too (StateMap::Impl::start_epoch), and a light one lets it log again.
  const int32_t maxp = 4;
  const BatchKeySpec sp = spec_for(maxp);
  const int prefix = key_group_prefix_size(maxp);
  StateTable t(0, maxp - 1, nullptr);
  auto add = [&](int64_t n) {
    I64 keys, vals;
    for (int64_t k = 0; k < n; ++k) {
      keys.push_back(k * 7919);
      vals.push_back(1);
    }
    TestArray k = fixed<int64_t>("l", keys, 1), v = fixed<int64_t>("l", vals, 2);
    std::vector<int64_t> out(keys.size());
    std::vector<uint8_t> valid(keys.size());
    add_batch(t, sp, k.in(), ValueType::Int64, Reducer::Sum, v.in(), out.data(), valid.data());
  };
  auto log_records = [&] {
    size_t n = 0;
    for (int32_t kg = 0; kg < maxp; ++kg) n += t.map(kg).write_log_size();
    return n;
  };
  // Every map lists its changes since `base` from its log (all true) or by walking (all false).
  auto from_log = [&](const TableSnapshot& s, uint64_t base) {
    int n = 0;
    for (int32_t kg = 0; kg < maxp; ++kg) n += s.map(kg)->changes_from_log(base);
    CHECK(n == 0 || n == maxp);
    return n == maxp;
  };
  auto changed = [&](const TableSnapshot& s, uint64_t base) {
    size_t n = 0;
    for (int32_t kg = 0; kg < maxp; ++kg) n += s.map(kg)->sorted_changes(base).size();
    return n;
  };
  add(40000);  // a fresh map's first epoch: filling predicts nothing
  const TableSnapshot s1 = t.snapshot();
  add(40000);  // logs 1,024 records a map, gives up, the rest are hot rows
  const TableSnapshot s2 = t.snapshot();
  CHECK(!from_log(s2, s1.version()));
  CHECK_EQ(changed(s2, s1.version()), 40000u);
  add(40000);  // logs nothing from its start: almost every first write is a hot row's
  CHECK_EQ(log_records(), 0u);
  const TableSnapshot s3 = t.snapshot();
  CHECK(!from_log(s3, s2.version()));
  CHECK_EQ(changed(s3, s2.version()), 40000u);
  add(10);  // the hot rows' count made the last epoch heavy: this one logs nothing either
  CHECK_EQ(log_records(), 0u);
  const TableSnapshot s4 = t.snapshot();
  CHECK(!from_log(s4, s3.version()));
  CHECK_EQ(changed(s4, s3.version()), 10u);
  add(10);  // after a light epoch: logged
  CHECK_EQ(log_records(), 10u);
  const TableSnapshot s5 = t.snapshot();
  CHECK(from_log(s5, s4.version()));
  CHECK_EQ(changed(s5, s4.version()), 10u);
  CHECK(snapshot_contents(s5, prefix) == contents(t, prefix));
}

TEST_MAIN()
