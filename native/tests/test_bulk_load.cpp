// Unit tests of load_entries (bulk_load.h): random runs over many key groups against a std::map
// model -- into empty maps (pre-sized), over existing entries (flat lanes, growth past the
// reservation, tombstones, values of another size, empty values), 1- and 2-byte prefixes --
// and the errors that must leave the table unchanged. Fixed seeds.
#include <cstring>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "check.h"
#include "owned_run.h"
#include "statecore/bulk_load.h"
#include "table_model.h"

using statecore::ArrowBinaryRun;
using statecore::StateTable;

namespace {

std::string value_of(uint64_t x, size_t size) {
  std::string v(size, '\0');
  for (size_t i = 0; i < size; ++i) v[i] = static_cast<char>((x >> (8 * (i % 8))) + i);
  return v;
}

// A run of random upserts/tombstones over `keys` keys in key groups [lo, hi], sorted by key
// (so by key group), applied to `model` as load_entries must.
OwnedRun random_run(std::mt19937_64& rng, Model& model, int32_t lo, int32_t hi, uint64_t keys,
                    int pw, size_t value_size, int tombstone_pct) {
  std::map<std::string, std::pair<bool, std::string>> rows;
  for (uint64_t i = 0; i < keys; ++i) {
    const uint64_t key = rng() % (keys * 2);
    const int32_t kg = lo + static_cast<int32_t>(rng() % static_cast<uint64_t>(hi - lo + 1));
    const bool dead = static_cast<int>(rng() % 100) < tombstone_pct;
    // Now and then a value of another size: the map must take it as put() would.
    const size_t vs = rng() % 50 == 0 ? value_size + 8 : value_size;
    rows[encoded_key(kg, key, pw)] = {!dead, value_of(rng(), vs)};
  }
  OwnedRun run(3);  // validity bits from bit 3, as in a sliced Arrow array
  for (const auto& [k, row] : rows) {
    run.add(k, row.first ? &row.second : nullptr);
    if (row.first) {
      model[k] = row.second;
    } else {
      model.erase(k);
    }
  }
  return run;
}

}  // namespace

TEST(random_runs_match_a_model) {
  for (int pw : {1, 2}) {
    std::mt19937_64 rng(pw * 7);
    const int32_t lo = pw == 1 ? 3 : 250, hi = pw == 1 ? 40 : 300;
    StateTable t(lo, hi);
    Model model;
    // Into empty maps, then repeatedly over them: updates, new keys past the reservation
    // (growth), removals.
    for (int round = 0; round < 6; ++round) {
      const OwnedRun run = random_run(rng, model, lo, hi, 20000, pw, 8, round == 0 ? 0 : 10);
      statecore::load_entries(t, run.view(), pw);
      check_table(t, model, pw);
    }
  }
}

TEST(loads_log_no_first_writes_and_the_next_epoch_logs_again) {
  // A restore or catch-up rebases right after its load: its first writes are never listed.
  std::mt19937_64 rng(11);
  StateTable t(0, 3);
  Model model;
  const OwnedRun first = random_run(rng, model, 0, 3, 8000, 1, 8, 0);
  statecore::load_entries(t, first.view(), 1);
  for (int32_t kg = 0; kg <= 3; ++kg) t.map(kg).rebase();  // from here every epoch logs
  // ~400 first writes a key group: fewer than the log may hold (1,024), so it would keep them.
  const OwnedRun changes = random_run(rng, model, 0, 3, 1600, 1, 8, 10);
  statecore::load_entries(t, changes.view(), 1);
  check_table(t, model, 1);
  size_t removals = 0;
  for (int32_t kg = 0; kg <= 3; ++kg) {
    CHECK_EQ(t.map(kg).write_log_size(), size_t{0});
    removals += t.map(kg).removal_log_size();
  }
  CHECK(removals > 0);  // removals are not given up: only rebase() may forget them
  statecore::StateMap& m = t.map(2);
  m.rebase();
  const std::string k = encoded_key(2, 123456789, 1);
  m.put(reinterpret_cast<const uint8_t*>(k.data()), k.size(), 8);
  CHECK_EQ(m.write_log_size(), size_t{1});
}

TEST(a_catch_up_past_the_write_log_limit_starts_an_epoch_without_a_log) {
  // rebase(true) after a change set of more first writes than the log may hold (1,024 a map)
  // predicts the next epoch as a closed heavy epoch does: it logs nothing and lists by walking.
  // A lighter change set, or a restore's rebase(), leaves the next epoch logging.
  std::mt19937_64 rng(12);
  StateTable t(0, 0);
  Model model;
  statecore::StateMap& m = t.map(0);
  const OwnedRun first = random_run(rng, model, 0, 0, 6000, 1, 8, 0);
  statecore::load_entries(t, first.view(), 1);
  m.rebase();
  const auto put_one = [&](int64_t key) {
    const std::string k = encoded_key(0, key, 1);
    m.put(reinterpret_cast<const uint8_t*>(k.data()), k.size(), 8);
  };
  const OwnedRun heavy = random_run(rng, model, 0, 0, 3000, 1, 8, 10);
  statecore::load_entries(t, heavy.view(), 1);
  const uint64_t base = m.rebase(true);
  put_one(123456789);
  CHECK_EQ(m.write_log_size(), size_t{0});
  auto s = m.snapshot();
  CHECK(!s->changes_from_log(base));
  CHECK_EQ(s->sorted_changes(base).size(), size_t{1});  // found by the walk
  s->release();
  // A change set under the limit: the next epoch logs.
  const OwnedRun light = random_run(rng, model, 0, 0, 200, 1, 8, 10);
  statecore::load_entries(t, light.view(), 1);
  m.rebase(true);
  put_one(987654321);
  CHECK_EQ(m.write_log_size(), size_t{1});
  // A heavy load followed by a restore's rebase(): logs too.
  const OwnedRun again = random_run(rng, model, 0, 0, 3000, 1, 8, 10);
  statecore::load_entries(t, again.view(), 1);
  m.rebase();
  put_one(555);
  CHECK_EQ(m.write_log_size(), size_t{1});
}

TEST(empty_values_and_values_changing_size) {
  StateTable t(0, 3);
  Model model;
  OwnedRun a;
  const std::string k1 = encoded_key(1, 5, 1), k2 = encoded_key(1, 6, 1), k3 = encoded_key(2, 7, 1);
  const std::string v8 = value_of(1, 8), v0, v16 = value_of(2, 16);
  a.add(k1, &v8);
  a.add(k2, &v8);
  a.add(k3, &v0);
  statecore::load_entries(t, a.view(), 1);
  model = {{k1, v8}, {k2, v8}, {k3, v0}};
  check_table(t, model, 1);
  OwnedRun b;  // an 8-byte value becomes empty, another 16 bytes; an empty one 8 bytes
  b.add(k1, &v0);
  b.add(k2, &v16);
  b.add(k3, &v8);
  statecore::load_entries(t, b.view(), 1);
  model = {{k1, v0}, {k2, v16}, {k3, v8}};
  check_table(t, model, 1);
}

TEST(bad_runs_raise_before_any_write) {
  StateTable t(2, 5);
  const std::string keep = encoded_key(3, 1, 1), v = value_of(9, 8);
  OwnedRun first;
  first.add(keep, &v);
  statecore::load_entries(t, first.view(), 1);
  const Model model{{keep, v}};
  const std::string other = value_of(10, 8);
  std::vector<std::pair<OwnedRun, std::string>> bad;
  {
    OwnedRun r;  // a valid first entry, then a key group outside [2, 5]
    r.add(keep, &other);
    r.add(encoded_key(6, 1, 1), &other);
    bad.emplace_back(r, "entry 1: key-group prefix 6 is outside [2, 5]");
  }
  {
    OwnedRun r;  // not sorted by key group
    r.add(encoded_key(4, 1, 1), &other);
    r.add(keep, &other);
    bad.emplace_back(r, "entry 1: key-group prefix 3 is outside [2, 5] or below the entry");
  }
  {
    OwnedRun r;  // a key that is only a prefix
    r.add(keep, &other);
    r.add(std::string(1, '\x04'), &other);
    bad.emplace_back(r, "entry 1: its encoded key is not longer than the 1-byte");
  }
  for (const auto& [run, why] : bad) {
    try {
      statecore::load_entries(t, run.view(), 1);
      CHECK(false);
    } catch (const std::invalid_argument& e) {
      CHECK(std::string(e.what()).find(why) == 0);
    }
    check_table(t, model, 1);
  }
  CHECK_THROWS(statecore::load_entries(t, first.view(), 3), std::invalid_argument);
  // Offsets the loop would read through unchecked: decreasing, past the data.
  OwnedRun two;
  two.add(keep, &other);
  two.add(encoded_key(4, 2, 1), &other);
  ArrowBinaryRun r = two.view();
  r.key_data_size -= 1;
  CHECK_THROWS(statecore::load_entries(t, r, 1), std::invalid_argument);
  r = two.view();
  r.value_data_size -= 1;
  CHECK_THROWS(statecore::load_entries(t, r, 1), std::invalid_argument);
  std::vector<int32_t> down = two.value_offsets;
  down[1] = down[2] + 1;
  r = two.view();
  r.value_offsets = down.data();
  CHECK_THROWS(statecore::load_entries(t, r, 1), std::invalid_argument);
  check_table(t, model, 1);
}

TEST_MAIN()
