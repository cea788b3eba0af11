// Unit tests of the tiered mode's map calls: insert_clean, is_clean, evict_clean (StateMap) and
// StateTable::evict_clean. A clean entry is part of the base: no listing reports it, its
// eviction is no removal, and a write makes it an ordinary change (fixed seeds throughout).
#include <cstring>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "check.h"
#include "statecore/state_map.h"
#include "statecore/state_table.h"

using statecore::ByteView;
using statecore::MapChange;
using statecore::MapSnapshot;
using statecore::StateMap;
using statecore::StateTable;
using Ref = std::map<std::string, std::string>;

namespace {

const uint8_t* u8(const std::string& s) { return reinterpret_cast<const uint8_t*>(s.data()); }
std::string str(ByteView v) { return std::string(reinterpret_cast<const char*>(v.data), v.size); }

void put(StateMap& m, const std::string& k, const std::string& v) {
  uint8_t* p = m.put(u8(k), k.size(), v.size());
  if (!v.empty()) std::memcpy(p, v.data(), v.size());
}

bool clean(StateMap& m, const std::string& k, const std::string& v) {
  return m.insert_clean(u8(k), k.size(), u8(v), v.size());
}

std::string key(uint64_t x) {  // a one-byte key-group prefix and a big-endian int64
  std::string s(9, '\0');
  for (int i = 8; i >= 1; --i, x >>= 8) s[i] = static_cast<char>(x & 0xff);
  return s;
}

Ref changes(const MapSnapshot& s, uint64_t base) {
  Ref out;
  for (const MapChange& c : s.sorted_changes(base))
    out.emplace(str(c.key), c.removed ? std::string("<removed>") : str(c.value));
  return out;
}

Ref live(StateMap& m) {
  Ref r;
  m.for_each([&r](ByteView k, ByteView v) { r.emplace(str(k), str(v)); });
  return r;
}

// A map whose base is a completed snapshot (what a tiered backend has once attached).
void complete_a_checkpoint(StateMap& m) {
  auto s = m.snapshot();
  m.mark_base(s->version());
}

}  // namespace

TEST(insert_clean_needs_a_base_and_skips_present_keys) {
  StateMap m;
  CHECK_THROWS(clean(m, key(1), "v"), std::logic_error);
  put(m, key(1), "dirty");
  complete_a_checkpoint(m);
  CHECK(!clean(m, key(1), "other"));  // present: the map's entry is newer
  ByteView out;
  CHECK(m.get(u8(key(1)), 9, &out));
  CHECK_EQ(str(out), std::string("dirty"));
  CHECK(clean(m, key(2), "loaded"));
  CHECK(m.is_clean(u8(key(2)), 9));
  CHECK(m.is_clean(u8(key(1)), 9));  // written before the base: clean as well
  CHECK(!m.is_clean(u8(key(3)), 9));
}

TEST(clean_entries_are_not_changes_and_their_eviction_is_no_removal) {
  StateMap m;
  complete_a_checkpoint(m);
  for (uint64_t k = 0; k < 100; ++k) CHECK(clean(m, key(k), "base"));
  CHECK_EQ(m.write_log_size(), 0u);
  put(m, key(5), "new!");  // a write makes a clean entry a change
  CHECK(m.remove(u8(key(6)), 9));
  uint64_t cursor = 0;
  CHECK_EQ(m.evict_clean(0, &cursor), 98u);  // every clean entry, never the written one
  CHECK_EQ(m.size(), 1u);
  CHECK_EQ(m.removal_log_size(), 1u);  // key 6's removal only
  auto s = m.snapshot();
  Ref expect{{key(5), "new!"}, {key(6), "<removed>"}};
  CHECK(changes(*s, m.base_version()) == expect);
}

TEST(evict_removes_one_clean_entry_without_logging_it) {
  StateMap m;
  put(m, key(1), "old");
  CHECK(!m.evict(u8(key(1)), 9));  // no base yet: nothing is clean
  complete_a_checkpoint(m);
  CHECK(clean(m, key(2), "loaded"));
  put(m, key(3), "dirty");
  CHECK(m.evict(u8(key(1)), 9));
  CHECK(m.evict(u8(key(2)), 9));
  CHECK(!m.evict(u8(key(3)), 9));  // written since the base: stays
  CHECK(!m.evict(u8(key(4)), 9));  // absent
  CHECK_EQ(m.size(), 1u);
  CHECK_EQ(m.removal_log_size(), 0u);
  auto s = m.snapshot();
  CHECK((changes(*s, m.base_version()) == Ref{{key(3), "dirty"}}));
}

TEST(eviction_stops_at_the_target_and_the_hand_goes_round) {
  StateMap m;
  complete_a_checkpoint(m);
  for (uint64_t k = 0; k < 1000; ++k) CHECK(clean(m, key(k), "12345678"));
  const size_t per = 9 + 8;
  CHECK_EQ(m.bytes(), 1000 * per);
  uint64_t cursor = 0;
  const size_t n = m.evict_clean(600 * per, &cursor);
  CHECK_EQ(n, 400u);
  CHECK_EQ(m.bytes(), 600 * per);
  CHECK_EQ(m.evict_clean(600 * per, &cursor), 0u);  // at the target: nothing to do
  CHECK_EQ(m.evict_clean(100 * per, &cursor), 500u);
  CHECK_EQ(m.size(), 100u);
}

TEST(eviction_sparing_recent_entries_takes_older_clean_ones_first) {
  StateMap m;
  complete_a_checkpoint(m);
  const size_t per = 9 + 8;
  for (uint64_t k = 0; k < 100; ++k) CHECK(clean(m, key(k), "12345678"));  // loaded
  for (uint64_t k = 100; k < 200; ++k) put(m, key(k), "12345678");         // written
  complete_a_checkpoint(m);  // 100..199: written in the last epoch; 0..99 loaded before it
  for (uint64_t k = 200; k < 250; ++k) CHECK(clean(m, key(k), "12345678"));  // loaded now
  uint64_t cursor = 0;
  CHECK_EQ(m.evict_clean(160 * per, &cursor, true), 90u);
  CHECK_EQ(m.evict_clean(100 * per, &cursor, true), 10u);  // the last older ones, then none
  ByteView out;
  for (uint64_t k = 0; k < 100; ++k) CHECK(!m.get(u8(key(k)), 9, &out));
  for (uint64_t k = 100; k < 250; ++k) CHECK(m.get(u8(key(k)), 9, &out));
  CHECK_EQ(m.evict_clean(100 * per, &cursor, true), 0u);  // none older until the base moves
  CHECK_EQ(m.evict_clean(100 * per, &cursor, false), 50u);
  complete_a_checkpoint(m);  // every entry left is now older than the last epoch
  CHECK_EQ(m.evict_clean(40 * per, &cursor, true), 60u);
  CHECK_EQ(m.size(), 40u);
}

TEST(collect_buckets_stamps_tell_each_entry_age_in_both_engines) {
  // The clock hand's copies carry each entry's stamp: below the base for clean entries
  // (base - 1 for those loaded since it), at or above it for written ones, whichever engine.
  for (auto engine : {statecore::MapEngine::Flat, statecore::MapEngine::Chained}) {
    StateMap m(nullptr, engine);
    for (uint64_t k = 0; k < 300; ++k) put(m, key(k), "12345678");
    complete_a_checkpoint(m);
    for (uint64_t k = 300; k < 3000; ++k) CHECK(clean(m, key(k), "12345678"));
    for (uint64_t k = 0; k < 3000; k += 7) put(m, key(k), "written!");
    const uint64_t base = m.base_version();
    uint64_t cursor = 0;
    statecore::SortedRun run;
    std::vector<uint64_t> stamps;
    size_t seen = 0, loaded = 0;  // loaded: stamped base - 1
    bool wrapped = false;
    while (!wrapped) {
      wrapped = m.collect_buckets(&cursor, 50, &run, &stamps);
      CHECK_EQ(stamps.size(), run.size());
      for (size_t i = 0; i < run.size(); ++i) {
        const ByteView k = run.key(i);
        CHECK_EQ(stamps[i] < base, m.is_clean(k.data, k.size));
        loaded += stamps[i] == base - 1;
      }
      seen += run.size();
    }
    CHECK_EQ(seen, size_t(3000));
    // Stamped base - 1: loaded since the base or written in the epoch before it, and not
    // written since (the 429 keys k % 7 == 0).
    CHECK_EQ(loaded, size_t(3000 - 429));
  }
}

TEST(snapshots_keep_what_eviction_and_clean_inserts_change_in_the_live_map) {
  StateMap m;
  put(m, key(1), "a");
  put(m, key(2), "b");
  complete_a_checkpoint(m);
  auto s = m.snapshot();  // a running checkpoint: copy-on-write view
  uint64_t cursor = 0;
  CHECK_EQ(m.evict_clean(0, &cursor), 2u);
  CHECK(clean(m, key(3), "c"));
  CHECK_EQ(s->size(), 2u);
  Ref all;
  for (const MapChange& c : s->sorted_entries()) all.emplace(str(c.key), str(c.value));
  CHECK((all == Ref{{key(1), "a"}, {key(2), "b"}}));
  CHECK(changes(*s, m.base_version()).empty());
  CHECK((live(m) == Ref{{key(3), "c"}}));
}

// Random writes, removals, clean loads, evictions and completed checkpoints: the changes each
// snapshot lists, applied to the previous checkpoint's contents, give the logical state (the
// map's live entries plus the evicted clean ones), as a tiered backend's runs must.
void randomized(uint64_t seed) {
  std::mt19937_64 rng(seed);
  StateMap m;
  Ref logical;    // what the state holds
  Ref committed;  // the contents of the last completed checkpoint
  for (int round = 0; round < 30; ++round) {
    for (int i = 0; i < 300; ++i) {
      const std::string k = key(rng() % 400);
      const int op = static_cast<int>(rng() % 4);
      // A key is loaded before it is touched, when the checkpoint holds it (and a base exists).
      ByteView out;
      auto it = committed.find(k);
      if (m.base_version() > 0 && it != committed.end() && logical.count(k) &&
          !m.get(u8(k), k.size(), &out)) {
        CHECK(clean(m, k, it->second));
      }
      if (op == 0) {
        put(m, k, std::to_string(rng() % 1000));
        m.get(u8(k), k.size(), &out);
        logical[k] = str(out);
      } else if (op == 1) {
        m.remove(u8(k), k.size());
        logical.erase(k);
      } else if (op == 2) {
        uint64_t cursor = rng();
        m.evict_clean(m.bytes() / 2, &cursor, rng() % 2 == 0);
      }
    }
    auto s = m.snapshot();
    Ref next = committed;
    for (const auto& [k, v] : changes(*s, m.base_version())) {
      if (v == "<removed>") {
        next.erase(k);
      } else {
        next[k] = v;
      }
    }
    CHECK(next == logical);
    if (rng() % 4 != 0) {  // most checkpoints complete
      m.mark_base(s->version());
      committed = next;
    }
    // Every live entry agrees with the logical state; a clean one with the checkpoint.
    for (const auto& [k, v] : live(m)) {
      CHECK_EQ(logical.at(k), v);
      if (m.is_clean(u8(k), k.size())) CHECK_EQ(committed.at(k), v);
    }
  }
}

TEST(randomized_tiered_changes_reproduce_the_state) {
  randomized(1);
  randomized(7);
}

TEST(table_eviction_spreads_over_key_groups_to_the_target) {
  StateTable t(0, 3);
  t.snapshot().release();
  t.mark_base(t.version());
  for (int32_t kg = 0; kg < 4; ++kg) {
    for (uint64_t k = 0; k < 100; ++k) {
      std::string kk = key(k);
      kk[0] = static_cast<char>(kg);
      CHECK(t.map(kg).insert_clean(u8(kk), kk.size(), u8(std::string("v")), 1));
    }
  }
  const size_t per = 10;
  CHECK_EQ(t.bytes(), 400 * per);
  t.map(2).put(u8(key(1000)), 9, 1);  // a dirty entry in key group 2
  CHECK_EQ(t.evict_clean(150 * per), 251u);
  CHECK_EQ(t.bytes(), 150 * per);
  CHECK_EQ(t.evict_clean(0), 149u);
  CHECK_EQ(t.size(), 1u);
}

TEST(table_eviction_takes_older_entries_from_every_key_group_first) {
  StateTable t(0, 1);
  t.snapshot().release();
  t.mark_base(t.version());
  auto kg_key = [](int32_t kg, uint64_t k) {
    std::string kk = key(k);
    kk[0] = static_cast<char>(kg);
    return kk;
  };
  for (uint64_t k = 0; k < 100; ++k) {
    const std::string kk = kg_key(1, k);
    CHECK(t.map(1).insert_clean(u8(kk), kk.size(), u8(std::string("v")), 1));
  }
  t.snapshot().release();
  t.mark_base(t.version());  // key group 1's entries are now older than the last epoch
  for (uint64_t k = 0; k < 100; ++k) {
    const std::string kk = kg_key(0, k);
    CHECK(t.map(0).insert_clean(u8(kk), kk.size(), u8(std::string("v")), 1));
  }
  const size_t per = 10;
  CHECK_EQ(t.evict_clean(120 * per), 80u);  // the hand starts at key group 0: all spared
  CHECK_EQ(t.map(0).size(), 100u);
  CHECK_EQ(t.evict_clean(50 * per), 70u);  // key group 1's last 20, then 50 recent ones
  CHECK_EQ(t.map(1).size(), 0u);
  CHECK_EQ(t.map(0).size(), 50u);
}

TEST_MAIN()
