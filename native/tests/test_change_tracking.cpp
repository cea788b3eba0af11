// Unit tests of the StateMap's change tracking (incremental snapshots): sorted_changes, mark_base,
// rebase and the removal log (fixed seeds throughout).
#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "statecore/state_map.h"
#include "statecore/state_table.h"

using statecore::ByteView;
using statecore::MapChange;
using statecore::MapSnapshot;
using statecore::StateMap;
using statecore::StateTable;
using Ref = std::map<std::string, std::string>;  // std::string order == memcmp, shorter first

namespace {

const uint8_t* u8(const std::string& s) { return reinterpret_cast<const uint8_t*>(s.data()); }
std::string str(ByteView v) { return std::string(reinterpret_cast<const char*>(v.data), v.size); }

void put(StateMap& m, const std::string& k, const std::string& v) {
  uint8_t* p = m.put(u8(k), k.size(), v.size());
  if (!v.empty()) std::memcpy(p, v.data(), v.size());
}

bool del(StateMap& m, const std::string& k) { return m.remove(u8(k), k.size()); }

std::string be64(uint64_t x) {
  std::string s(8, '\0');
  for (int i = 7; i >= 0; --i, x >>= 8) s[i] = static_cast<char>(x & 0xff);
  return s;
}

Ref contents(const MapSnapshot& s) {
  Ref r;
  for (const MapChange& kv : s.sorted_entries()) r.emplace(str(kv.key), str(kv.value));
  return r;
}

Ref live(StateMap& m) {
  Ref r;
  m.for_each([&r](ByteView k, ByteView v) { r.emplace(str(k), str(v)); });
  return r;
}

struct Change {
  std::string key;
  std::string value;
  bool removed;
  bool operator==(const Change& o) const {
    return key == o.key && value == o.value && removed == o.removed;
  }
};

std::vector<Change> changes(const MapSnapshot& s, uint64_t base) {
  std::vector<Change> out;
  for (const MapChange& c : s.sorted_changes(base))
    out.push_back({str(c.key), str(c.value), c.removed});
  return out;
}

bool strictly_sorted(const std::vector<Change>& cs) {
  for (size_t i = 1; i < cs.size(); ++i) {
    if (!(cs[i - 1].key < cs[i].key)) return false;
  }
  return true;
}

// Newest wins, tombstones delete (what a checkpoint restore does with runs).
Ref merge_changes(Ref base, const std::vector<Change>& cs) {
  for (const Change& c : cs) {
    if (c.removed) {
      base.erase(c.key);
    } else {
      base[c.key] = c.value;
    }
  }
  return base;
}

uint32_t colliding_hash(const uint8_t*, size_t size) { return static_cast<uint32_t>(size % 3); }

// 1,000 keys loaded as a base (rebase), with a write log that may hold max(8, size / 16) = 62
// records an epoch.
void load_1000_keys_with_a_small_log(StateMap& m) {
  m.set_write_log_min(8);
  for (uint64_t k = 0; k < 1000; ++k) put(m, be64(k), "v");
  m.rebase();
}

}  // namespace

TEST(fresh_map_lists_everything_then_only_changes_after_the_base) {
  StateMap m;
  CHECK_EQ(m.base_version(), 0u);
  put(m, "a", "1");
  put(m, "b", "2");
  put(m, "c", "3");
  del(m, "c");  // created and removed before any snapshot: a (harmless) tombstone
  auto s1 = m.snapshot();
  auto c1 = changes(*s1, 0);
  CHECK((c1 == std::vector<Change>{{"a", "1", false}, {"b", "2", false}, {"c", "", true}}));
  m.mark_base(s1->version());
  CHECK_EQ(m.base_version(), s1->version());

  std::string v;
  ByteView out;
  CHECK(m.get(u8(std::string("a")), 1, &out));  // reads are not changes
  put(m, "b", "22");                            // overwrite, same size
  put(m, "d", "4444");                          // new key
  del(m, "a");                                  // removal of a base key
  del(m, "zz");                                 // absent: not logged
  del(m, "d");
  put(m, "d", "4");  // removed then re-put: a put
  size_t vs = 0;
  uint8_t* p = m.get_for_update(u8(std::string("d")), 1, &vs);  // writable access = a write
  CHECK(p != nullptr && vs == 1);
  auto s2 = m.snapshot();
  auto c2 = changes(*s2, s1->version());
  CHECK((c2 == std::vector<Change>{{"a", "", true}, {"b", "22", false}, {"d", "4", false}}));
  CHECK(merge_changes(contents(*s1), c2) == contents(*s2));
  // The base moved past 0: changes since the empty map are no longer listed.
  CHECK_THROWS(s2->sorted_changes(0), std::invalid_argument);
  CHECK_EQ(m.removal_log_size(), 2u);  // a and d; mark_base dropped the chunk holding only c
}

TEST(bad_bases_throw) {
  StateMap m;
  put(m, "k", "v");
  auto s1 = m.snapshot();
  CHECK_THROWS(m.mark_base(s1->version() + 1), std::invalid_argument);
  m.mark_base(s1->version());
  m.mark_base(0);  // older: ignored
  CHECK_EQ(m.base_version(), s1->version());
  auto s2 = m.snapshot();
  CHECK_EQ(s2->base_version(), s1->version());
  CHECK_THROWS(s2->sorted_changes(0), std::invalid_argument);  // no longer tracked
  CHECK_THROWS(s2->sorted_changes(s2->version() + 1), std::invalid_argument);
  CHECK(s2->sorted_changes(s2->version()).empty());
  s2->release();
  CHECK_THROWS(s2->sorted_changes(s1->version()), std::logic_error);
}

TEST(rebase_after_bulk_load_is_not_a_change) {
  StateMap m;
  for (int i = 0; i < 500; ++i) put(m, be64(i), std::string(i % 7, 'x'));
  del(m, be64(3));
  uint64_t b = m.rebase();
  CHECK_EQ(b, m.version());
  CHECK_EQ(m.removal_log_size(), 0u);
  auto s1 = m.snapshot();
  CHECK(s1->sorted_changes(b).empty());
  put(m, be64(7), "new");
  del(m, be64(8));
  auto s2 = m.snapshot();
  auto c = changes(*s2, b);
  CHECK((c == std::vector<Change>{{be64(7), "new", false}, {be64(8), "", true}}));
  CHECK(merge_changes(contents(*s1), c) == contents(*s2));
}

TEST(table_versions_move_in_lockstep) {
  StateTable t(3, 6);
  put(t.map(4), "a", "1");
  auto s1 = t.snapshot();
  CHECK_EQ(s1.version(), t.version());
  CHECK_EQ(s1.base_version(), 0u);
  for (int kg = 3; kg <= 6; ++kg) CHECK_EQ(s1.map(kg)->version(), s1.version());
  CHECK_THROWS(t.mark_base(t.version() + 1), std::invalid_argument);
  t.mark_base(s1.version());
  put(t.map(6), "b", "2");
  del(t.map(4), "a");
  auto s2 = t.snapshot();
  CHECK_EQ(s2.base_version(), s1.version());
  CHECK((changes(*s2.map(4), s1.version()) == std::vector<Change>{Change{"a", "", true}}));
  CHECK((changes(*s2.map(6), s1.version()) == std::vector<Change>{Change{"b", "2", false}}));
  CHECK(changes(*s2.map(3), s1.version()).empty());
  CHECK_EQ(t.removal_log_size(), 1u);
  uint64_t b = t.rebase();
  for (int kg = 3; kg <= 6; ++kg) CHECK_EQ(t.map(kg).base_version(), b);
  CHECK_EQ(t.removal_log_size(), 0u);
}

TEST(removal_log_is_bounded_by_removals_since_the_base) {
  StateMap m;
  for (int round = 0; round < 20; ++round) {
    for (int i = 0; i < 1000; ++i) put(m, be64(i), "v");
    for (int i = 0; i < 1000; ++i) del(m, be64(i));
    auto s = m.snapshot();
    m.mark_base(s->version());
    // Everything logged is older than the base now: at most one partial chunk may remain.
    CHECK(m.removal_log_size() <= 64);
  }
  // Without completion the log keeps every removal.
  for (int i = 0; i < 1000; ++i) put(m, be64(i), "v");
  for (int i = 0; i < 1000; ++i) del(m, be64(i));
  CHECK(m.removal_log_size() >= 1000 && m.removal_log_size() <= 1064);
}

TEST(rehash_migration_copies_are_not_changes) {
  StateMap m(nullptr, statecore::MapEngine::Chained);  // the chained engine's mechanics
  for (int i = 0; i < 3000; ++i) put(m, be64(i), "base");
  auto s1 = m.snapshot();  // held: the migration below must copy every moved entry
  m.mark_base(s1->version());
  size_t cap = m.capacity();
  auto before = m.stats();
  int i = 3000;
  while (m.capacity() == cap || m.is_rehashing()) put(m, be64(i++), "new");
  CHECK(m.stats().entry_copies > before.entry_copies + 1000);
  auto s2 = m.snapshot();
  auto c = changes(*s2, s1->version());
  CHECK_EQ(c.size(), static_cast<size_t>(i - 3000));
  bool only_new = true;
  for (const Change& ch : c) only_new = only_new && ch.value == "new" && !ch.removed;
  CHECK(only_new);
  CHECK(merge_changes(contents(*s1), c) == contents(*s2));
}

TEST(snapshot_taken_during_rehash_lists_exact_changes) {
  StateMap m;
  for (int i = 0; i < 1000; ++i) put(m, be64(i), "a");
  auto s0 = m.snapshot();
  m.mark_base(s0->version());
  del(m, be64(1));
  put(m, be64(2), "c");
  int next = 1000;
  while (!m.is_rehashing()) put(m, be64(next++), "b");
  CHECK(m.is_rehashing());
  auto s1 = m.snapshot();  // directories of both tables, migration in flight
  Ref expect = contents(*s0);
  for (int k = 1000; k < next; ++k) expect[be64(k)] = "b";
  expect.erase(be64(1));
  expect[be64(2)] = "c";
  CHECK(contents(*s1) == expect);
  CHECK(merge_changes(contents(*s0), changes(*s1, s0->version())) == expect);
  // Keep writing through the rest of the migration; the listing does not move.
  auto listed = changes(*s1, s0->version());
  for (int k = 0; k < 4000; ++k) put(m, be64(k), "z");
  CHECK(changes(*s1, s0->version()) == listed);
}

namespace {

// Randomized: ops over a few thousand keys (put of varying sizes, get_for_update, remove, clear
// rarely), snapshots every few hundred ops, some checkpoints completed (mark_base), some never;
// snapshots kept alive and some released. For every snapshot s and every base b it accepts
// (b = 0 or the version of an older snapshot, b >= s.base_version()), applying
// s.sorted_changes(b) to the contents of snapshot b gives the contents of s.
// Returns how many listings used the write log and how many walked the table.
std::pair<size_t, size_t> run_random(uint64_t seed, statecore::KeyHashFunction hash,
                                     size_t key_space, int rounds, size_t write_log_min = 1024) {
  StateMap m(hash);
  m.set_write_log_min(write_log_min);
  size_t from_log = 0, walked = 0;
  std::mt19937_64 rng(seed);
  Ref ref;
  std::map<uint64_t, Ref> at;  // version -> contents at that snapshot (0 -> empty)
  at[0] = Ref{};
  std::vector<std::shared_ptr<MapSnapshot>> snaps;
  std::vector<uint64_t> removal_versions;  // map version of every removal of a present key
  auto removals_since = [&](uint64_t b) {
    return static_cast<size_t>(std::count_if(removal_versions.begin(), removal_versions.end(),
                                             [b](uint64_t v) { return v >= b; }));
  };
  bool ok_contents = true, ok_sorted = true, ok_merge = true, ok_bound = true;
  size_t pairs = 0;
  for (int round = 0; round < rounds; ++round) {
    int ops = 50 + static_cast<int>(rng() % 400);
    for (int i = 0; i < ops; ++i) {
      std::string k = be64(rng() % key_space);
      unsigned op = rng() % 100;
      if (op < 50) {
        std::string v(rng() % 12, static_cast<char>('a' + rng() % 26));
        put(m, k, v);
        ref[k] = v;
      } else if (op < 65) {
        size_t vs = 0;
        uint8_t* p = m.get_for_update(u8(k), k.size(), &vs);
        if (p && vs) {
          p[0] = static_cast<uint8_t>('A' + rng() % 26);
          ref[k][0] = static_cast<char>(p[0]);
        }
      } else if (op < 99) {
        bool was = ref.erase(k) > 0;
        CHECK_EQ(del(m, k), was);
        if (was) removal_versions.push_back(m.version());
      } else if (rng() % 20 == 0) {
        removal_versions.insert(removal_versions.end(), ref.size(), m.version());
        m.clear();
        ref.clear();
      }
    }
    auto s = m.snapshot();
    at[s->version()] = ref;
    snaps.push_back(s);
    if (rng() % 3 == 0) {
      // Complete a random snapshot at least as new as the base (maybe an old one).
      std::vector<uint64_t> eligible;
      for (const auto& sp : snaps) {
        if (sp->version() > m.base_version()) eligible.push_back(sp->version());
      }
      if (!eligible.empty()) {
        uint64_t b = eligible[rng() % eligible.size()];
        m.mark_base(b);
      }
    }
    // The log holds every removal since the base, plus at most one partly older chunk.
    size_t need = removals_since(m.base_version());
    ok_bound = ok_bound && m.removal_log_size() >= need && m.removal_log_size() <= need + 64;
    if (rng() % 4 == 0 && snaps.size() > 3) {
      size_t j = rng() % (snaps.size() - 1);
      snaps[j]->release();
      snaps.erase(snaps.begin() + static_cast<std::ptrdiff_t>(j));
    }
    ok_contents = ok_contents && live(m) == ref;
  }
  for (const auto& s : snaps) {
    ok_contents = ok_contents && contents(*s) == at[s->version()];
    for (const auto& kv : at) {
      uint64_t b = kv.first;
      if (b < s->base_version() || b > s->version()) continue;
      auto cs = changes(*s, b);
      (s->changes_from_log(b) ? from_log : walked) += 1;
      ok_sorted = ok_sorted && strictly_sorted(cs);
      ok_merge = ok_merge && merge_changes(kv.second, cs) == at[s->version()];
      ++pairs;
    }
  }
  CHECK(ok_contents);
  CHECK(ok_sorted);
  CHECK(ok_merge);
  CHECK(ok_bound);
  CHECK(pairs > static_cast<size_t>(rounds));
  return {from_log, walked};
}

}  // namespace

TEST(randomized_incremental_reproduces_snapshots_default_hash) {
  for (uint64_t seed : {1u, 2u, 3u}) run_random(seed, nullptr, 3000, 60);
}

TEST(randomized_incremental_reproduces_snapshots_colliding_hash) {
  run_random(7, colliding_hash, 300, 40);
}

// A small write-log limit makes busy epochs give up, so listings mix both paths.
TEST(randomized_incremental_with_a_small_write_log_uses_both_paths) {
  size_t from_log = 0, walked = 0;
  for (uint64_t seed : {11u, 12u}) {
    auto r = run_random(seed, nullptr, 3000, 60, 150);
    from_log += r.first;
    walked += r.second;
  }
  auto r = run_random(13, colliding_hash, 300, 40, 20);
  from_log += r.first;
  walked += r.second;
  CHECK(from_log > 20);
  CHECK(walked > 20);
}

TEST(a_fresh_maps_first_epoch_is_listed_by_walking_and_the_next_one_from_the_log) {
  StateMap m;
  for (uint64_t k = 0; k < 10; ++k) put(m, be64(k), "v");
  CHECK_EQ(m.write_log_size(), 0u);  // version 0: changes against the empty map, not logged
  auto s0 = m.snapshot();
  CHECK(!s0->changes_from_log(0));
  CHECK_EQ(changes(*s0, 0).size(), 10u);
  CHECK(merge_changes({}, changes(*s0, 0)) == contents(*s0));
  for (uint64_t k = 5; k < 8; ++k) put(m, be64(k), "w");
  CHECK_EQ(m.write_log_size(), 3u);
  auto s1 = m.snapshot();
  CHECK(s1->changes_from_log(s0->version()));
  CHECK_EQ(changes(*s1, s0->version()).size(), 3u);
  CHECK(merge_changes(contents(*s0), changes(*s1, s0->version())) == contents(*s1));
  CHECK(!s1->changes_from_log(0));
  CHECK(merge_changes({}, changes(*s1, 0)) == contents(*s1));
}

TEST(write_log_lists_a_few_changes_of_a_large_map_without_walking) {
  StateMap m;
  for (uint64_t k = 0; k < 50000; ++k) put(m, be64(k), "v");
  CHECK_EQ(m.write_log_size(), 0u);  // a fresh map does not log its first epoch
  auto s0 = m.snapshot();
  CHECK(!s0->changes_from_log(0));
  m.mark_base(s0->version());
  CHECK_EQ(m.write_log_size(), 0u);
  for (uint64_t k = 100; k < 110; ++k) put(m, be64(k), "changed");
  put(m, be64(100), "changed twice");  // second write of the epoch: no second record
  size_t vs = 0;
  m.get_for_update(u8(be64(200)), 8, &vs)[0] = 'W';
  del(m, be64(300));
  put(m, be64(90000), "new");
  put(m, be64(90001), "new, then removed");
  del(m, be64(90001));
  CHECK_EQ(m.write_log_size(), 13u);  // 10 puts + 1 get_for_update + 2 new keys
  auto s1 = m.snapshot();
  CHECK(s1->changes_from_log(s0->version()));
  auto c = changes(*s1, s0->version());
  CHECK_EQ(c.size(), 14u);  // 10 + 200 + 90000 + tombstones of 300 and 90001
  CHECK(merge_changes(contents(*s0), c) == contents(*s1));
  // The next epoch writes key 100 again: logged again, listed once.
  put(m, be64(100), "third");
  auto s2 = m.snapshot();
  auto c2 = changes(*s2, s0->version());
  CHECK(merge_changes(contents(*s0), c2) == contents(*s2));
  CHECK_EQ(c2.size(), 14u);
  m.mark_base(s2->version());
  CHECK_EQ(m.write_log_size(), 0u);
}

TEST(an_epoch_past_the_write_log_limit_walks_so_does_the_next_then_logging_resumes) {
  StateMap m;
  load_1000_keys_with_a_small_log(m);
  auto a = m.snapshot();
  m.mark_base(a->version());
  for (uint64_t k = 0; k < 100; ++k) put(m, be64(k), "w");  // > max(8, 1000 / 16) records
  CHECK_EQ(m.write_log_size(), 0u);                         // given up and freed
  auto b = m.snapshot();
  CHECK(!b->changes_from_log(a->version()));
  CHECK_EQ(changes(*b, a->version()).size(), 100u);
  CHECK(merge_changes(contents(*a), changes(*b, a->version())) == contents(*b));
  // The next epoch expects as many first writes and does not log from its start (start_epoch);
  // it had 5, so the one after it logs again.
  for (uint64_t k = 500; k < 505; ++k) put(m, be64(k), "x");
  CHECK_EQ(m.write_log_size(), 0u);
  auto c = m.snapshot();
  CHECK(!c->changes_from_log(b->version()));
  CHECK_EQ(changes(*c, b->version()).size(), 5u);
  CHECK(merge_changes(contents(*a), changes(*c, a->version())) == contents(*c));
  for (uint64_t k = 600; k < 603; ++k) put(m, be64(k), "y");
  CHECK_EQ(m.write_log_size(), 3u);
  auto d = m.snapshot();
  CHECK(d->changes_from_log(c->version()));
  CHECK(!d->changes_from_log(b->version()));  // covers the epoch that did not log
  CHECK_EQ(changes(*d, c->version()).size(), 3u);
  CHECK(merge_changes(contents(*b), changes(*d, b->version())) == contents(*d));
  m.mark_base(c->version());
  CHECK(d->changes_from_log(c->version()));
}

TEST(a_light_epoch_after_a_heavy_one_that_stayed_under_the_limit_logs) {
  // The prediction counts first writes, not log records: an epoch of many writes of few keys
  // is light.
  StateMap m;
  load_1000_keys_with_a_small_log(m);
  auto a = m.snapshot();
  for (int r = 0; r < 50; ++r)
    for (uint64_t k = 0; k < 8; ++k) put(m, be64(k), "w" + std::to_string(r));
  auto b = m.snapshot();
  CHECK(b->changes_from_log(a->version()));
  put(m, be64(9), "x");
  CHECK_EQ(m.write_log_size(), 9u);
  auto c = m.snapshot();
  CHECK(c->changes_from_log(b->version()));
  CHECK(merge_changes(contents(*a), changes(*c, a->version())) == contents(*c));
}

TEST(never_completed_snapshots_accumulate_changes) {
  StateMap m;
  for (int i = 0; i < 100; ++i) put(m, be64(i), "0");
  auto s1 = m.snapshot();
  m.mark_base(s1->version());
  Ref ref = contents(*s1);
  std::vector<std::shared_ptr<MapSnapshot>> uncompleted;
  for (int r = 1; r <= 5; ++r) {
    put(m, be64(r), std::to_string(r));
    del(m, be64(50 + r));
    ref[be64(r)] = std::to_string(r);
    ref.erase(be64(50 + r));
    uncompleted.push_back(m.snapshot());  // never completed: the base stays at s1
  }
  auto last = uncompleted.back();
  auto c = changes(*last, m.base_version());
  CHECK_EQ(c.size(), 10u);  // 5 puts + 5 tombstones since s1
  CHECK(merge_changes(contents(*s1), c) == ref);
}

TEST(removed_then_reput_then_removed_again) {
  StateMap m;
  put(m, "k", "1");
  auto s1 = m.snapshot();
  m.mark_base(s1->version());
  del(m, "k");
  put(m, "k", "22");
  auto s2 = m.snapshot();  // present: a put
  del(m, "k");
  put(m, "k", "3");
  del(m, "k");
  auto s3 = m.snapshot();  // logged three times, absent: one tombstone
  CHECK((changes(*s2, s1->version()) == std::vector<Change>{Change{"k", "22", false}}));
  CHECK((changes(*s3, s1->version()) == std::vector<Change>{Change{"k", "", true}}));
  CHECK((changes(*s3, s2->version()) == std::vector<Change>{Change{"k", "", true}}));
}

TEST(listing_survives_map_destruction_and_trimming) {
  std::shared_ptr<MapSnapshot> s2;
  uint64_t b = 0;
  Ref base;
  {
    StateMap m;
    for (int i = 0; i < 300; ++i) put(m, be64(i), "x");
    auto s1 = m.snapshot();
    b = s1->version();
    base = contents(*s1);
    m.mark_base(b);
    for (int i = 0; i < 200; ++i) del(m, be64(i));
    s2 = m.snapshot();
    m.mark_base(s2->version());  // trims the map's log; s2 keeps its chunks
    for (int i = 0; i < 200; ++i) put(m, be64(i), "y");
  }
  auto c = changes(*s2, b);
  CHECK_EQ(c.size(), 200u);
  CHECK(merge_changes(base, c) == contents(*s2));
}

TEST(incremental_listing_read_concurrently_with_writes) {
  StateMap m;
  std::mt19937_64 rng(5);
  Ref ref;
  for (int i = 0; i < 4000; ++i) {
    put(m, be64(i), "base");
    ref[be64(i)] = "base";
  }
  auto s0 = m.snapshot();
  m.mark_base(s0->version());
  Ref base = ref;
  for (int round = 0; round < 5; ++round) {
    for (int i = 0; i < 2000; ++i) {
      std::string k = be64(rng() % 6000);
      if (rng() % 3 == 0) {
        del(m, k);
        ref.erase(k);
      } else {
        std::string v(1 + rng() % 10, static_cast<char>('a' + round));
        put(m, k, v);
        ref[k] = v;
      }
    }
    Ref expected = ref;
    auto snap = m.snapshot();
    uint64_t from = m.base_version();
    Ref from_contents = base;
    bool ok = false;
    std::thread reader([&] {
      ok = merge_changes(from_contents, changes(*snap, from)) == expected;
      snap->release();
    });
    // The owner keeps writing, removing (appending to the log) and completing older checkpoints.
    for (int i = 0; i < 20000; ++i) {
      std::string k = be64(rng() % 8000);
      if (rng() % 2 == 0) {
        del(m, k);
        ref.erase(k);
      } else {
        put(m, k, "w");
        ref[k] = "w";
      }
    }
    reader.join();
    CHECK(ok);
    // Complete this round's snapshot: it becomes the base of the next round.
    m.mark_base(snap->version());
    base = expected;
    CHECK(live(m) == ref);
  }
}

TEST_MAIN()
