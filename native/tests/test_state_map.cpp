// Unit tests of the copy-on-write, incrementally rehashing StateMap (fixed seeds throughout).
#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "statecore/state_map.h"

using statecore::ByteView;
using statecore::MapChange;
using statecore::MapSnapshot;
using statecore::StateMap;
using Ref = std::map<std::string, std::string>;  // std::string order == memcmp, shorter first

namespace {

const uint8_t* u8(const std::string& s) { return reinterpret_cast<const uint8_t*>(s.data()); }
std::string str(ByteView v) { return std::string(reinterpret_cast<const char*>(v.data), v.size); }

void put(StateMap& m, const std::string& k, const std::string& v) {
  uint8_t* p = m.put(u8(k), k.size(), v.size());
  if (!v.empty()) std::memcpy(p, v.data(), v.size());
}

bool get(StateMap& m, const std::string& k, std::string* v) {
  ByteView out;
  if (!m.get(u8(k), k.size(), &out)) return false;
  *v = str(out);
  return true;
}

bool contains(StateMap& m, const std::string& k) {
  ByteView out;
  return m.get(u8(k), k.size(), &out);
}

bool del(StateMap& m, const std::string& k) { return m.remove(u8(k), k.size()); }

// 8-byte big-endian key, as the key codec encodes an int64 key.
std::string be64(uint64_t x) {
  std::string s(8, '\0');
  for (int i = 7; i >= 0; --i, x >>= 8) s[i] = static_cast<char>(x & 0xff);
  return s;
}

Ref snapshot_contents(const MapSnapshot& s) {
  Ref r;
  for (const MapChange& kv : s.sorted_entries()) r.emplace(str(kv.key), str(kv.value));
  return r;
}

Ref live_contents(StateMap& m) {
  Ref r;
  m.for_each([&r](ByteView k, ByteView v) { r.emplace(str(k), str(v)); });
  return r;
}

// True when the snapshot's sorted_entries() equal `ref` in content and order.
bool snapshot_equals(const MapSnapshot& s, const Ref& ref) {
  auto entries = s.sorted_entries();
  if (entries.size() != ref.size() || s.size() != ref.size()) return false;
  size_t i = 0;
  for (const auto& kv : ref) {
    if (str(entries[i].key) != kv.first || str(entries[i].value) != kv.second) return false;
    ++i;
  }
  return true;
}

size_t ref_bytes(const Ref& r) {
  size_t n = 0;
  for (const auto& kv : r) n += kv.first.size() + kv.second.size();
  return n;
}

uint32_t colliding_hash(const uint8_t*, size_t size) { return static_cast<uint32_t>(size % 3); }

}  // namespace

TEST(basic_operations) {
  StateMap m;
  std::string v;
  CHECK_EQ(m.size(), 0u);
  CHECK_EQ(m.bytes(), 0u);
  CHECK(!get(m, "a", &v));
  CHECK(!del(m, "a"));
  put(m, "a", "1234");
  CHECK(get(m, "a", &v));
  CHECK_EQ(v, std::string("1234"));
  CHECK_EQ(m.size(), 1u);
  CHECK_EQ(m.bytes(), 5u);
  put(m, "a", "5678");  // same size: in place
  CHECK(get(m, "a", &v));
  CHECK_EQ(v, std::string("5678"));
  put(m, "a", "xy");  // other size: reallocated and relinked
  CHECK(get(m, "a", &v));
  CHECK_EQ(v, std::string("xy"));
  CHECK_EQ(m.bytes(), 3u);
  put(m, "b", "");  // empty values are legal (timers)
  CHECK(get(m, "b", &v));
  CHECK_EQ(v, std::string());
  CHECK_EQ(m.size(), 2u);

  size_t vs = 0;
  uint8_t* p = m.get_for_update(u8(std::string("a")), 1, &vs);
  CHECK(p != nullptr);
  CHECK_EQ(vs, 2u);
  p[0] = 'X';
  CHECK(get(m, "a", &v));
  CHECK_EQ(v, std::string("Xy"));
  CHECK(m.get_for_update(u8(std::string("zz")), 2, &vs) == nullptr);

  // int64 values are inline and 8-byte aligned.
  int64_t x = -42;
  uint8_t* slot = m.put(u8(std::string("int")), 3, 8);
  CHECK_EQ(reinterpret_cast<uintptr_t>(slot) % 8, 0u);
  std::memcpy(slot, &x, 8);
  ByteView out;
  CHECK(m.get(u8(std::string("int")), 3, &out));
  int64_t y;
  std::memcpy(&y, out.data, 8);
  CHECK_EQ(y, int64_t(-42));

  CHECK(del(m, "a"));
  CHECK(!del(m, "a"));
  CHECK(!get(m, "a", &v));
  CHECK_EQ(m.size(), 2u);
  CHECK_EQ(m.bytes(), 1u + 3u + 8u);

  Ref live = live_contents(m);
  CHECK_EQ(live.size(), 2u);
  CHECK(live.count("b") == 1 && live.count("int") == 1);

  // Empty key and keys with embedded zero bytes are ordinary keys.
  put(m, "", "e");
  put(m, std::string("\0\0", 2), "z");
  CHECK(get(m, "", &v) && v == "e");
  CHECK(get(m, std::string("\0\0", 2), &v) && v == "z");
  CHECK(!contains(m, std::string("\0", 1)));

  m.clear();
  CHECK_EQ(m.size(), 0u);
  CHECK_EQ(m.bytes(), 0u);
  CHECK(!contains(m, "b"));
  put(m, "c", "3");
  CHECK(get(m, "c", &v) && v == "3");
}

// The batch kernels' resize / resize_by: the prefix kept and the rest zeroed through a flat
// map's conversion, a snapshot keeps the old bytes (a shared entry is copied, an owned one
// realloc'd without a copy), shrinking, inserting, sizes, and the write counted as a change.
TEST(resize_keeps_prefix_snapshots_and_change_tracking) {
  StateMap m;
  const std::string a = be64(1), b = be64(2), c = be64(3);
  auto h = [&m](const std::string& k) { return m.hash(u8(k), k.size()); };
  std::string v;
  put(m, a, "12345678");
  put(m, b, "abcdefgh");
  const bool started_flat = m.is_flat();
  size_t old = 0;
  uint8_t* p = m.resize(h(a), u8(a), a.size(), 8, &old);  // same size: a flat map stays flat
  CHECK_EQ(old, 8u);
  CHECK(std::memcmp(p, "12345678", 8) == 0);
  CHECK_EQ(m.is_flat(), started_flat);
  auto s1 = m.snapshot();
  p = m.resize_by(h(a), u8(a), a.size(), 4, &old);  // another size: a flat map converts
  CHECK_EQ(old, 8u);
  CHECK(std::memcmp(p, "12345678\0\0\0\0", 12) == 0);
  std::memcpy(p + 8, "WXYZ", 4);
  CHECK(!m.is_flat());
  CHECK(snapshot_contents(*s1) == (Ref{{a, "12345678"}, {b, "abcdefgh"}}));
  CHECK(get(m, a, &v) && v == "12345678WXYZ");

  auto s2 = m.snapshot();
  m.mark_base(s1->version());
  const uint64_t copies = m.stats().entry_copies;
  p = m.resize_by(h(b), u8(b), b.size(), 2, &old);  // b is shared with s2: copied
  CHECK_EQ(old, 8u);
  p[8] = '!';
  CHECK_EQ(m.stats().entry_copies, copies + 1);
  p = m.resize_by(h(b), u8(b), b.size(), 3, &old);  // now owned: realloc'd, no copy
  CHECK_EQ(old, 10u);
  std::memcpy(p + 10, "xyz", 3);
  CHECK_EQ(m.stats().entry_copies, copies + 1);
  p = m.resize(h(a), u8(a), a.size(), 3, &old);  // shrink keeps the prefix
  CHECK_EQ(old, 12u);
  p = m.resize_by(h(c), u8(c), c.size(), 5, &old);  // absent: inserted, zeroed
  CHECK_EQ(old, 0u);
  CHECK(std::memcmp(p, "\0\0\0\0\0", 5) == 0);
  const Ref now{{a, "123"}, {b, std::string("abcdefgh!\0xyz", 13)}, {c, std::string(5, '\0')}};
  CHECK(live_contents(m) == now);
  CHECK_EQ(m.size(), 3u);
  CHECK_EQ(m.bytes(), 3 * 8 + 3 + 13 + 5u);
  CHECK(snapshot_contents(*s2) == (Ref{{a, "12345678WXYZ"}, {b, "abcdefgh"}}));
  auto s3 = m.snapshot();
  Ref changed;
  for (const MapChange& ch : s3->sorted_changes(s2->version())) {
    CHECK(!ch.removed);
    changed.emplace(str(ch.key), str(ch.value));
  }
  CHECK(changed == now);  // every key was resized since s2
  CHECK_THROWS(m.resize(h(a), nullptr, 3, 1, &old), std::invalid_argument);
  s1->release();
  s2->release();
  s3->release();
  m.reclaim();
  CHECK_EQ(m.retired_entries(), 0u);
}

TEST(bad_arguments_throw_and_do_not_change_state) {
  StateMap m;
  put(m, "k", "v");
  CHECK_THROWS(m.put(nullptr, 3, 1), std::invalid_argument);
  CHECK_THROWS(m.get(nullptr, 1, nullptr), std::invalid_argument);
  CHECK_THROWS(m.remove(nullptr, 2), std::invalid_argument);
  CHECK_THROWS(m.put(u8(std::string("k")), 1, size_t(1) << 33), std::length_error);
  CHECK_EQ(m.size(), 1u);
  std::string v;
  CHECK(get(m, "k", &v) && v == "v");
}

TEST(capacity_load_factor_and_growth) {
  StateMap m(nullptr, statecore::MapEngine::Chained);  // the chained engine's mechanics
  CHECK_EQ(m.capacity(), 4u);                          // minimum capacity
  for (int i = 0; i < 4; ++i) put(m, be64(i), "v");
  CHECK_EQ(m.capacity(), 4u);  // 4 entries > threshold 3 is only checked at the next insert
  CHECK(!m.is_rehashing());
  put(m, be64(4), "v");
  CHECK_EQ(m.capacity(), 8u);
  CHECK_EQ(m.stats().rehashes, 1u);
  for (int i = 5; i < 5000; ++i) put(m, be64(i), "v");
  // power of two, load factor 3/4 (may be mid-rehash: then the newest table counts)
  size_t cap = m.capacity();
  CHECK((cap & (cap - 1)) == 0);
  CHECK(m.size() <= cap);
  CHECK(m.size() * 4 > (cap / 2) * 3);
  for (int i = 0; i < 5000; ++i) del(m, be64(i));
  CHECK_EQ(m.size(), 0u);
  CHECK(m.capacity() >= cap);  // never shrinks
}

// reserve(): an empty map takes the capacity growth would reach, so a bulk load never rehashes;
// over either engine (the default one: ctest runs this suite with STATECORE_MAP_ENGINE=chained
// too); a snapshot of the empty map stays empty, a non-empty map is left alone.
TEST(reserve_presizes_an_empty_map) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{3}, size_t{1000}, size_t{4096}, size_t{50000}}) {
    StateMap grown;
    for (size_t i = 0; i < n; ++i) put(grown, be64(i), "vvvvvvvv");
    while (grown.is_rehashing()) {
      std::string v;
      get(grown, be64(0), &v);
    }

    StateMap m;
    auto empty = m.snapshot();
    m.reserve(n);
    const size_t cap = m.capacity();
    // Flat: exactly the capacity growth reaches; chained (which grows one insert later) at
    // most one doubling more.
    CHECK(cap >= grown.capacity());
    CHECK(cap <= 2 * grown.capacity());
    if (grown.is_flat()) CHECK_EQ(cap, grown.capacity());
    const uint64_t rehashes = m.stats().rehashes;
    for (size_t i = 0; i < n; ++i) put(m, be64(i), "vvvvvvvv");
    CHECK_EQ(m.stats().rehashes, rehashes);  // no rehash during the load
    CHECK(!m.is_rehashing());
    CHECK_EQ(m.capacity(), cap);
    CHECK_EQ(m.size(), n);
    std::string v;
    for (size_t i = 0; i < n; i += 97) CHECK(get(m, be64(i), &v) && v == "vvvvvvvv");
    CHECK_EQ(empty->size(), 0u);
    CHECK(empty->sorted_entries().empty());
    empty->release();
    // More inserts grow as usual.
    for (size_t i = n; i < n + 2 * cap; ++i) put(m, be64(i), "vvvvvvvv");
    CHECK_EQ(m.size(), n + 2 * cap);
    CHECK(m.capacity() > cap);
  }
  StateMap full;
  put(full, be64(1), "v");
  const size_t cap = full.capacity();
  full.reserve(100000);  // not empty: no-op
  CHECK_EQ(full.capacity(), cap);
  std::string v;
  CHECK(get(full, be64(1), &v) && v == "v");
  // Emptied by removals: reserve applies again, and the contents stay empty.
  del(full, be64(1));
  full.reserve(100000);
  CHECK(full.capacity() > cap);
  CHECK_EQ(full.size(), 0u);
  CHECK(!contains(full, be64(1)));
  full.reserve(10);  // never shrinks
  CHECK(full.capacity() > cap);
}

// Flink acceptance scenario 8: ascending inserts, the oldest removed every 8 inserts, through
// several rehashes; size and membership exact after every single operation.
TEST(incremental_rehash_keeps_size_and_membership_exact) {
  StateMap m;
  uint64_t next = 0, oldest = 0;
  size_t rehashes_finished = 0;
  size_t max_rehash_ops = 0, ops_in_rehash = 0;
  bool was_rehashing = false;
  bool all_ok = true;
  // Called after every map operation (puts, removes and the membership gets all migrate).
  auto after_op = [&] {
    bool r = m.is_rehashing();
    if (r) ++ops_in_rehash;
    if (was_rehashing && !r) {
      ++rehashes_finished;
      max_rehash_ops = std::max(max_rehash_ops, ops_in_rehash);
      ops_in_rehash = 0;
    }
    was_rehashing = r;
  };
  while (rehashes_finished < 10) {
    put(m, be64(next), be64(next * 7));
    ++next;
    after_op();
    if (next % 8 == 0) {
      CHECK(del(m, be64(oldest)));
      ++oldest;
      after_op();
    }
    if (m.size() != next - oldest) all_ok = false;
    // Membership: every live key present with its value, the removed ones absent.
    if (next < 1200 || next % 97 == 0) {
      std::string v;
      for (uint64_t k = oldest; k < next; ++k) {
        if (!get(m, be64(k), &v) || v != be64(k * 7)) all_ok = false;
        after_op();
      }
      if (oldest > 0 && contains(m, be64(oldest - 1))) all_ok = false;
      if (contains(m, be64(next))) all_ok = false;
      after_op();
    }
  }
  CHECK(all_ok);
  CHECK_EQ(m.size(), next - oldest);
  CHECK_EQ(m.stats().rehashes, 10u + (m.is_rehashing() ? 1u : 0u));
  // The rehash 2048 -> 4096 buckets (~1500 entries, >= 4 moved per operation) was spread over
  // hundreds of operations: no operation rehashed the whole table.
  CHECK(max_rehash_ops > 200);
  CHECK(m.capacity() >= (size_t(4) << 10));
}

// A get alone drives the migration to completion (Flink migrates on reads too).
TEST(reads_drive_the_migration) {
  StateMap m;
  for (int i = 0; i < 769; ++i) put(m, be64(i), "v");  // 769 > 768 = 3/4 of 1024 at next insert
  put(m, be64(769), "v");
  CHECK(m.is_rehashing());
  size_t gets = 0;
  while (m.is_rehashing() && gets < 100000) {
    contains(m, be64(gets % 100));
    ++gets;
  }
  CHECK(!m.is_rehashing());
  // >= 4 entries or <= 64 buckets per step: 1024 buckets / 770 entries need at least 16 steps.
  CHECK(gets >= 16);
  CHECK(gets <= 1024);
  CHECK_EQ(m.size(), 770u);
  for (int i = 0; i < 770; ++i) CHECK(contains(m, be64(i)));
}

TEST(sorted_entries_order_is_memcmp_shorter_prefix_first) {
  StateMap m;
  std::vector<std::string> keys = {
      "b", "a", "ab", "", std::string("\xff", 1), "a\x01", "aa", std::string("a\0", 2), "\x7f"};
  for (const auto& k : keys) put(m, k, "v" + k);
  auto s = m.snapshot();
  auto e = s->sorted_entries();
  std::vector<std::string> got;
  for (const MapChange& kv : e) got.push_back(str(kv.key));
  std::vector<std::string> want = {"",  "a",    std::string("a\0", 2), "a\x01", "aa", "ab",
                                   "b", "\x7f", std::string("\xff", 1)};
  CHECK(got == want);
  CHECK_EQ(str(e[0].value), std::string("v"));
}

TEST(snapshot_isolation_basic_and_release_idempotent) {
  StateMap m;
  for (int i = 0; i < 100; ++i) put(m, be64(i), "old" + std::to_string(i));
  Ref before = live_contents(m);
  auto s1 = m.snapshot();
  CHECK_EQ(s1->version(), 1u);
  CHECK_EQ(m.version(), 1u);
  put(m, be64(5), "new5");         // same size overwrite -> copy
  put(m, be64(6), "much longer");  // other size
  del(m, be64(7));
  put(m, be64(1000), "inserted");
  size_t vs;
  uint8_t* p = m.get_for_update(u8(be64(8)), 8, &vs);
  p[0] = 'X';
  CHECK(snapshot_equals(*s1, before));
  Ref mid = live_contents(m);
  auto s2 = m.snapshot();
  CHECK_EQ(s2->version(), 2u);
  m.clear();
  put(m, be64(1), "after clear");
  CHECK(snapshot_equals(*s1, before));
  CHECK(snapshot_equals(*s2, mid));
  CHECK_EQ(s2->size(), mid.size());
  s1->release();
  s1->release();  // idempotent
  CHECK_THROWS(s1->sorted_entries(), std::logic_error);
  CHECK_EQ(s1->size(), before.size());
  CHECK(snapshot_equals(*s2, mid));
  s2->release();
  m.reclaim();
  CHECK_EQ(m.retired_entries(), 0u);
  CHECK_EQ(m.size(), 1u);
}

TEST(snapshot_is_o1_and_writes_copy_only_what_they_touch) {
  StateMap m(nullptr, statecore::MapEngine::Chained);  // the chained engine's mechanics
  for (int i = 0; i < 20000; ++i) put(m, be64(i), "v");
  while (m.is_rehashing()) contains(m, be64(0));
  size_t cap = m.capacity();
  CHECK(cap >= 32768);
  auto before = m.stats();
  auto s = m.snapshot();
  auto after = m.stats();
  // Taking the snapshot copied nothing.
  CHECK_EQ(after.entry_copies, before.entry_copies);
  CHECK_EQ(after.page_copies, before.page_copies);
  CHECK_EQ(after.directory_copies, before.directory_copies);
  // First write: one directory, one page, and at most the chain down to the entry.
  put(m, be64(123), "w");
  auto w1 = m.stats();
  CHECK_EQ(w1.directory_copies, after.directory_copies + 1);
  CHECK_EQ(w1.page_copies, after.page_copies + 1);
  CHECK(w1.entry_copies - after.entry_copies >= 1);
  CHECK(w1.entry_copies - after.entry_copies <= 8);
  // Writing the same entry again copies nothing more.
  put(m, be64(123), "x");
  auto w2 = m.stats();
  CHECK_EQ(w2.entry_copies, w1.entry_copies);
  CHECK_EQ(w2.page_copies, w1.page_copies);
  CHECK_EQ(w2.directory_copies, w1.directory_copies);
  // Reads copy nothing.
  for (int i = 0; i < 1000; ++i) contains(m, be64(i));
  auto r = m.stats();
  CHECK_EQ(r.entry_copies, w2.entry_copies);
  CHECK_EQ(r.page_copies, w2.page_copies);
  CHECK(s->size() == 20000u);
  s->release();
}

THREADED_TEST(no_copies_after_last_release) {
  StateMap m;
  for (int i = 0; i < 3000; ++i) put(m, be64(i), "v" + std::to_string(i));
  auto s1 = m.snapshot();
  auto s2 = m.snapshot();
  for (int i = 0; i < 3000; i += 3) put(m, be64(i), "w");
  CHECK(m.stats().entry_copies > 0);
  CHECK(m.retired_entries() > 0);
  s2->release();
  // Released from another thread, as a checkpoint thread would.
  std::thread t([&s1] { s1->release(); });
  t.join();
  std::mt19937_64 rng(7);
  auto base = m.stats();
  for (int i = 0; i < 20000; ++i) {
    int k = static_cast<int>(rng() % 4000);
    switch (rng() % 4) {
      case 0: put(m, be64(k), "x"); break;
      case 1: put(m, be64(k), "a longer value"); break;
      case 2: del(m, be64(k)); break;
      default: {
        size_t vs;
        uint8_t* p = m.get_for_update(u8(be64(k)), 8, &vs);
        if (p && vs) p[0] ^= 1;
      }
    }
  }
  auto end = m.stats();
  CHECK_EQ(end.entry_copies, base.entry_copies);
  CHECK_EQ(end.page_copies, base.page_copies);
  CHECK_EQ(end.directory_copies, base.directory_copies);
  CHECK_EQ(end.entries_retired, base.entries_retired);
  CHECK_EQ(m.retired_entries(), 0u);  // swept at the first operation after the releases
  CHECK_EQ(end.retired_freed, end.entries_retired);
}

// Retired entries are freed exactly when no live snapshot in (created, unlinked] remains.
TEST(reclamation_follows_snapshot_intervals) {
  StateMap m(nullptr, statecore::MapEngine::Chained);  // the chained engine's mechanics
  put(m, "a", "1");                                    // created at version 0
  auto s1 = m.snapshot();                              // version 1 needs a
  put(m, "b", "2");                                    // created at version 1
  auto s2 = m.snapshot();                              // version 2 needs a, b
  put(m, "c", "3");                                    // created at version 2, no snapshot needs it
  CHECK(del(m, "c"));
  CHECK_EQ(m.retired_entries(), 0u);  // freed immediately
  CHECK(del(m, "a"));
  CHECK(del(m, "b"));
  CHECK_EQ(m.retired_entries(), 2u);
  s2->release();
  m.reclaim();
  CHECK_EQ(m.retired_entries(), 1u);  // b (1 < s <= 2) is free, a still needed by s1
  CHECK(snapshot_equals(*s1, Ref{{"a", "1"}}));
  s1->release();
  m.reclaim();
  CHECK_EQ(m.retired_entries(), 0u);
  // An entry that outlived a snapshot that never saw it is freed at once.
  auto s3 = m.snapshot();
  put(m, "d", "4");
  CHECK(del(m, "d"));
  CHECK_EQ(m.retired_entries(), 0u);
  s3.reset();  // destruction releases
  put(m, "e", "5");
  CHECK_EQ(m.retired_entries(), 0u);
}

THREADED_TEST(map_destroyed_while_snapshots_alive) {
  std::shared_ptr<MapSnapshot> s1, s2;
  Ref r1, r2;
  {
    StateMap m;
    for (int i = 0; i < 2000; ++i) put(m, be64(i), std::string(i % 13, 'a' + i % 26));
    r1 = live_contents(m);
    s1 = m.snapshot();
    for (int i = 0; i < 2000; i += 2) del(m, be64(i));
    for (int i = 2000; i < 2600; ++i) put(m, be64(i), "n");  // drives a rehash
    r2 = live_contents(m);
    s2 = m.snapshot();
    for (int i = 1; i < 2600; i += 4) put(m, be64(i), "changed value");
  }
  CHECK(snapshot_equals(*s1, r1));
  CHECK(snapshot_equals(*s2, r2));
  s1->release();
  CHECK(snapshot_equals(*s2, r2));
  std::thread t([&s2] { s2->release(); });  // the last release frees the engine state
  t.join();
  CHECK_THROWS(s2->sorted_entries(), std::logic_error);
}

// A snapshot serialized on another thread while the owner keeps writing (checkpoint pattern).
THREADED_TEST(snapshot_read_concurrently_with_writes) {
  StateMap m;
  std::mt19937_64 rng(11);
  Ref ref;
  for (int round = 0; round < 6; ++round) {
    for (int i = 0; i < 3000; ++i) {
      std::string k = be64(rng() % 5000);
      std::string v(rng() % 20, static_cast<char>('a' + round));
      put(m, k, v);
      ref[k] = v;
    }
    Ref expected = ref;
    auto snap = m.snapshot();
    bool ok = false;
    std::thread reader([&] {
      ok = snapshot_equals(*snap, expected);
      snap->release();
    });
    for (int i = 0; i < 20000; ++i) {
      std::string k = be64(rng() % 6000);
      if (rng() % 3 == 0) {
        del(m, k);
        ref.erase(k);
      } else {
        std::string v(rng() % 20, 'z');
        put(m, k, v);
        ref[k] = v;
      }
    }
    reader.join();
    CHECK(ok);
    CHECK(live_contents(m) == ref);
  }
}

namespace {

// Randomized copy-on-write isolation (Flink acceptance scenario 7): random put / get / remove /
// overwrite-with-different-size / get_for_update over a few hundred keys in several namespaces,
// snapshots every few hundred operations held across thousands, compared with a reference copy.
void run_isolation(uint64_t seed, size_t ops, size_t keys_per_ns, StateMap::Stats* stats_out,
                   statecore::KeyHashFunction hash) {
  std::mt19937_64 rng(seed);
  auto m = std::make_unique<StateMap>(hash);
  Ref ref;
  struct Held {
    std::shared_ptr<MapSnapshot> snap;
    Ref expected;
    size_t release_at;
  };
  std::vector<Held> held;
  const char* namespaces[] = {"window-0", "w1", "session-long-namespace", ""};
  auto make_key = [&](uint64_t r) {
    std::string k(1, '\x05');  // key-group prefix
    k += be64(r % keys_per_ns);
    const char* ns = namespaces[(r / keys_per_ns) % 4];
    k += std::string(1, static_cast<char>(std::strlen(ns) + 1)) + ns;
    return k;
  };
  auto random_value = [&](size_t size) {
    std::string v(size, '\0');
    for (auto& c : v) c = static_cast<char>(rng());
    return v;
  };
  size_t next_snapshot = 1 + rng() % 600;
  size_t failures = 0, snapshots_checked = 0, max_held = 0;
  StateMap::Stats total;
  auto add_stats = [&total](const StateMap::Stats& s) {
    total.entry_copies += s.entry_copies;
    total.page_copies += s.page_copies;
    total.directory_copies += s.directory_copies;
    total.rehashes += s.rehashes;
    total.snapshots += s.snapshots;
  };
  for (size_t op = 0; op < ops; ++op) {
    std::string k = make_key(rng());
    unsigned kind = rng() % 100;
    std::string got;
    auto it = ref.find(k);
    if (kind < 35) {  // put, size kept when present (in-place / entry copy path)
      size_t size = it != ref.end() && rng() % 2 ? it->second.size() : rng() % 24;
      std::string v = random_value(size);
      put(*m, k, v);
      ref[k] = v;
    } else if (kind < 45) {  // overwrite with a different size (reallocate + relink path)
      if (it != ref.end()) {
        std::string v = random_value(it->second.size() + 1 + rng() % 9);
        put(*m, k, v);
        it->second = v;
      }
    } else if (kind < 50) {
      // The batch kernels' resize / resize_by (absent: insert; present: realloc of an entry no
      // snapshot reaches, else a copy the snapshot keeps apart): the old prefix is kept, the
      // grown bytes are zero; then one byte is written through the returned pointer.
      const bool by = rng() % 2;
      const size_t had = it != ref.end() ? it->second.size() : 0;
      const size_t add = rng() % 12;
      const size_t ns = by ? had + add : rng() % 24;
      size_t old = 99;
      const uint32_t h = m->hash(u8(k), k.size());
      uint8_t* p = by ? m->resize_by(h, u8(k), k.size(), add, &old)
                      : m->resize(h, u8(k), k.size(), ns, &old);
      if (old != had) ++failures;
      std::string expect = it != ref.end() ? it->second : std::string();
      expect.resize(ns, '\0');
      if (ns && std::memcmp(p, expect.data(), ns) != 0) ++failures;
      if (ns) {
        p[ns - 1] = static_cast<uint8_t>(rng());
        expect[ns - 1] = static_cast<char>(p[ns - 1]);
      }
      ref[k] = expect;
    } else if (kind < 60) {  // get_for_update
      size_t vs = 0;
      uint8_t* p = m->get_for_update(u8(k), k.size(), &vs);
      if ((p != nullptr) != (it != ref.end())) ++failures;
      if (p && vs != it->second.size()) ++failures;
      if (p && vs) {
        p[0] = static_cast<uint8_t>(p[0] + 1);
        it->second[0] = static_cast<char>(it->second[0] + 1);
      }
    } else if (kind < 80) {  // remove
      bool removed = del(*m, k);
      if (removed != (it != ref.end())) ++failures;
      if (it != ref.end()) ref.erase(it);
    } else {  // get
      bool found = get(*m, k, &got);
      if (found != (it != ref.end()) || (found && got != it->second)) ++failures;
    }
    // After every operation: size, bytes and the touched key match the reference.
    if (m->size() != ref.size()) ++failures;
    auto it2 = ref.find(k);
    bool found = get(*m, k, &got);
    if (found != (it2 != ref.end()) || (found && got != it2->second)) ++failures;
    if ((op & 1023) == 0) {
      if (m->bytes() != ref_bytes(ref) || live_contents(*m) != ref) ++failures;
    }
    if (op == next_snapshot) {
      next_snapshot = op + 1 + rng() % 600;
      held.push_back({m->snapshot(), ref, op + 1000 + rng() % 8000});
      max_held = std::max(max_held, held.size());
      // Spot-check a random held snapshot mid-life.
      const Held& h = held[rng() % held.size()];
      if (!snapshot_equals(*h.snap, h.expected)) ++failures;
    }
    // Release expired snapshots in random order.
    for (size_t i = 0; i < held.size();) {
      if (held[i].release_at <= op && rng() % 4 == 0) {
        if (!snapshot_equals(*held[i].snap, held[i].expected)) ++failures;
        ++snapshots_checked;
        held[i].snap->release();
        held[i] = std::move(held.back());
        held.pop_back();
      } else {
        ++i;
      }
    }
    // Occasionally: clear, or destroy the map with snapshots alive and start a new one.
    if (op % 250000 == 249999) {
      if (rng() % 2) {
        m->clear();
      } else {
        add_stats(m->stats());
        m = std::make_unique<StateMap>(hash);
      }
      ref.clear();
    }
  }
  for (Held& h : held) {
    if (!snapshot_equals(*h.snap, h.expected)) ++failures;
    ++snapshots_checked;
  }
  held.clear();  // destruction releases
  m->reclaim();
  if (m->retired_entries() != 0) ++failures;
  add_stats(m->stats());
  CHECK_EQ(failures, 0u);
  CHECK(snapshots_checked > ops / 1000);
  CHECK(max_held >= 5);
  CHECK(total.entry_copies > 0);
  CHECK(total.page_copies > 0);
  if (stats_out) *stats_out = total;
}

}  // namespace

TEST(randomized_isolation_default_hash) {
  StateMap::Stats s;
  run_isolation(20240601, 2000000, 200, &s, nullptr);
  CHECK(s.rehashes >= 8);
}

TEST(randomized_isolation_colliding_hash) {
  StateMap::Stats s;
  run_isolation(99, 150000, 40, &s, &colliding_hash);
  CHECK(s.rehashes >= 4);
}

// Snapshots taken while a rehash is in flight and at every capacity on the way up, with removals,
// so snapshot directories of both tables, multi-page tables and migration copies are exercised.
TEST(snapshots_during_rehash) {
  StateMap m;
  std::mt19937_64 rng(5);
  Ref ref;
  std::vector<std::string> inserted;
  std::vector<std::pair<std::shared_ptr<MapSnapshot>, Ref>> held;
  size_t taken_while_rehashing = 0;
  bool ok = true;
  for (uint64_t i = 0; i < 12000; ++i) {
    std::string k = be64(i * 2654435761u);
    std::string v = std::to_string(i);
    put(m, k, v);
    ref[k] = v;
    inserted.push_back(k);
    if (i % 5 == 0) {
      const std::string& victim = inserted[rng() % inserted.size()];
      if (del(m, victim) != (ref.erase(victim) == 1)) ok = false;
    }
    if (i % 29 == 0) {
      if (m.is_rehashing()) ++taken_while_rehashing;
      held.emplace_back(m.snapshot(), ref);
    }
    if (held.size() > 6) {
      size_t j = rng() % held.size();
      if (!snapshot_equals(*held[j].first, held[j].second)) ok = false;
      held.erase(held.begin() + static_cast<long>(j));
    }
  }
  for (auto& h : held) {
    if (!snapshot_equals(*h.first, h.second)) ok = false;
  }
  CHECK(ok);
  CHECK(taken_while_rehashing > 10);
  CHECK(m.capacity() >= 8192);
  CHECK(live_contents(m) == ref);
  held.clear();
  m.reclaim();
  CHECK_EQ(m.retired_entries(), 0u);
}

TEST_MAIN()
