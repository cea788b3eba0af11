// Unit tests of StateMap's flat engine: differential against the chained engine (the same
// operations on both must give the same contents, snapshots, change listings and walks), the
// layout rule and the conversion, and copy-on-write at page granularity. Fixed seeds throughout.
#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "statecore/state_map.h"

using statecore::ByteView;
using statecore::KeyHashFunction;
using statecore::MapChange;
using statecore::MapEngine;
using statecore::MapSnapshot;
using statecore::SortedRun;
using statecore::StateMap;
using Ref = std::map<std::string, std::string>;

namespace {

const uint8_t* u8(const std::string& s) { return reinterpret_cast<const uint8_t*>(s.data()); }
std::string str(ByteView v) { return std::string(reinterpret_cast<const char*>(v.data), v.size); }

// As the key codec encodes an int64 key of key group `kg` (max parallelism <= 128): 9 bytes.
std::string key9(uint64_t x, uint8_t kg = 7) {
  std::string s(9, '\0');
  s[0] = static_cast<char>(kg);
  for (int i = 8; i >= 1; --i, x >>= 8) s[i] = static_cast<char>(x & 0xff);
  return s;
}
std::string val8(uint64_t x) { return std::string(reinterpret_cast<const char*>(&x), 8); }

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

Ref live(StateMap& m) {
  Ref r;
  m.for_each([&r](ByteView k, ByteView v) { r.emplace(str(k), str(v)); });
  return r;
}
Ref entries(const MapSnapshot& s) {
  Ref r;
  for (const MapChange& kv : s.sorted_entries()) r.emplace(str(kv.key), str(kv.value));
  return r;
}
std::vector<std::string> listing(const SortedRun& run) {
  std::vector<std::string> out;
  for (const MapChange& c : run)
    out.push_back(str(c.key) + "|" + str(c.value) + (c.removed ? "-" : "+"));
  return out;
}

uint32_t colliding_hash(const uint8_t*, size_t) { return 42; }
uint32_t weak_hash(const uint8_t* d, size_t n) { return n ? d[n - 1] % 5 : 0; }

// One full pass of collect_buckets; how often each key was seen.
std::map<std::string, int> one_pass(StateMap& m, size_t step, bool remove_odd_seen = false) {
  std::map<std::string, int> seen;
  uint64_t cursor = 0;
  SortedRun run;
  for (int calls = 0; calls < (1 << 22); ++calls) {
    bool wrapped = m.collect_buckets(&cursor, step, &run);
    for (size_t i = 0; i < run.size(); ++i) {
      std::string k = str(run.key(i));
      if (++seen[k] == 1 && remove_odd_seen && (k.back() & 1)) m.remove(u8(k), k.size());
    }
    if (wrapped) break;
  }
  return seen;
}

// The keys a differential run draws from: int64 keys as the codec encodes them (one fixed
// layout), keys of 0-40 bytes (var layouts, growing through their classes), or those with one
// key in 50 of 70 bytes (too long for any var class: a conversion).
enum class Keys { Int64, Sized, SomeTooLong };

// Key number k of the form: sizes spread over the range by a multiplicative hash of k, bytes
// from k, so that keys of one size differ and a key number always names the same key.
std::string key_of(Keys form, uint64_t k) {
  if (form == Keys::Int64) return key9(k);
  size_t n = static_cast<size_t>((k * 0x9E3779B97F4A7C15ull) >> 58) % 41;
  if (form == Keys::SomeTooLong && k % 50 == 7) n = 70;
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((k >> (8 * (i % 4))) + i);
  return s;
}

// Same random operations on a flat and a chained map, compared after every step; snapshots and
// change listings compared when taken. `values_vary` mixes value sizes, which converts the flat
// map (the comparison then covers the conversion); so does Keys::SomeTooLong.
void differential(KeyHashFunction h, uint32_t seed, int steps, int key_space, bool values_vary,
                  Keys form = Keys::Int64) {
  StateMap flat(h, MapEngine::Flat), chained(h, MapEngine::Chained);
  std::mt19937_64 rng(seed);
  struct Pair {
    std::shared_ptr<MapSnapshot> f, c;
  };
  std::vector<Pair> snaps;
  bool converted_seen = false;
  bool ok = true;
  for (int step = 0; step < steps && ok; ++step) {
    const std::string k = key_of(form, rng() % key_space);
    const int op = static_cast<int>(rng() % 100);
    if (op < 45) {
      std::string v = val8(rng());
      if (values_vary && rng() % 200 == 0) v += "x";
      put(flat, k, v);
      put(chained, k, v);
    } else if (op < 60) {
      size_t fs = 0, cs = 0;
      uint8_t* fp = flat.get_for_update(u8(k), k.size(), &fs);
      uint8_t* cp = chained.get_for_update(u8(k), k.size(), &cs);
      ok = ok && (fp == nullptr) == (cp == nullptr) && fs == cs;
      if (fp && cp && fs) {
        fp[0] ^= 0x5a;
        cp[0] ^= 0x5a;
      }
    } else if (op < 80) {
      ok = ok && flat.remove(u8(k), k.size()) == chained.remove(u8(k), k.size());
    } else if (op < 92) {
      std::string a, b;
      const bool fa = get(flat, k, &a), ca = get(chained, k, &b);
      ok = ok && fa == ca && a == b;
    } else if (op < 95) {
      snaps.push_back({flat.snapshot(), chained.snapshot()});
      const Pair& p = snaps.back();
      ok = ok && p.f->version() == p.c->version() && entries(*p.f) == entries(*p.c);
      const uint64_t base =
          p.f->base_version() + rng() % (p.f->version() - p.f->base_version() + 1);
      ok = ok && listing(p.f->sorted_changes(base)) == listing(p.c->sorted_changes(base));
      if (snaps.size() > 3) snaps.erase(snaps.begin() + static_cast<long>(rng() % snaps.size()));
    } else if (op < 97 && !snaps.empty()) {
      const uint64_t v = snaps[rng() % snaps.size()].f->version();
      flat.mark_base(v);
      chained.mark_base(v);
    } else if (op < 98) {
      auto a = one_pass(flat, 1 + rng() % 7), b = one_pass(chained, 5);
      ok = ok && a.size() == b.size();
      for (auto& kv : a) ok = ok && kv.second == 1;
    } else if (rng() % 20 == 0) {
      flat.clear();
      chained.clear();
    }
    ok = ok && flat.size() == chained.size() && flat.bytes() == chained.bytes();
    if (step % 997 == 0) ok = ok && live(flat) == live(chained);
    converted_seen = converted_seen || !flat.is_flat();
  }
  CHECK(ok);
  CHECK(live(flat) == live(chained));
  for (const Pair& p : snaps) CHECK(entries(*p.f) == entries(*p.c));
  const bool converts = values_vary || form == Keys::SomeTooLong;
  if (!converts) CHECK(flat.is_flat());
  if (converts) CHECK(converted_seen);
  if (form == Keys::Sized) CHECK(flat.stats().relayouts > 0);
}

}  // namespace

TEST(fixed_width_maps_stay_flat_and_hold_their_entries) {
  StateMap m(nullptr, MapEngine::Flat);
  CHECK(m.is_flat());
  for (int i = 0; i < 5000; ++i) put(m, key9(i), val8(i * 3));
  CHECK(m.is_flat());
  CHECK_EQ(m.size(), size_t{5000});
  CHECK_EQ(m.bytes(), size_t{5000 * 17});
  std::string v;
  CHECK(get(m, key9(4321), &v) && v == val8(4321 * 3));
  CHECK(!get(m, key9(4321, 8), &v));            // another prefix cannot be stored here
  CHECK(!get(m, key9(4321).substr(0, 8), &v));  // nor another size
  CHECK(!m.remove(u8(key9(1, 9)), 9));
  CHECK(m.is_flat());
}

// Another key size or first byte relayouts the table into the var form (stays flat); another
// value size converts it to the chained engine. Either way entries, snapshots and change
// listings are as before.
TEST(a_put_of_another_size_relayouts_or_converts_keeping_entries_snapshots_and_changes) {
  for (int which = 0; which < 3; ++which) {
    StateMap m(nullptr, MapEngine::Flat);
    for (int i = 0; i < 3000; ++i) put(m, key9(i), val8(i));
    auto s1 = m.snapshot();
    m.mark_base(s1->version());
    for (int i = 0; i < 100; ++i) put(m, key9(i), val8(i + 1));
    for (int i = 100; i < 150; ++i) m.remove(u8(key9(i)), 9);
    const Ref before = live(m);
    if (which == 0) put(m, "short", val8(1));         // another key size
    if (which == 1) put(m, key9(5000, 99), val8(1));  // another prefix
    if (which == 2) put(m, key9(7), "longer value");  // another value size
    CHECK(m.is_flat() == (which != 2));
    CHECK_EQ(m.stats().relayouts, uint64_t(which != 2 ? 1 : 0));
    Ref after = live(m);
    if (which == 0) after.erase("short");
    if (which == 1) after.erase(key9(5000, 99));
    if (which == 2) after[key9(7)] = val8(8);
    CHECK(after == before);
    // The snapshot taken while flat still reads its tables.
    CHECK_EQ(entries(*s1).size(), size_t{3000});
    auto s2 = m.snapshot();
    size_t puts = 0, tombstones = 0;
    for (const MapChange& c : s2->sorted_changes(s1->version())) (c.removed ? tombstones : puts)++;
    CHECK_EQ(puts, size_t(which == 2 ? 100 : 101));
    CHECK_EQ(tombstones, size_t{50});
    // Relayouted or converted entries are under copy-on-write as before.
    put(m, key9(2000), val8(0));
    CHECK(entries(*s2)[key9(2000)] == val8(2000));
    std::string v;
    CHECK(get(m, key9(2000), &v) && v == val8(0));
  }
}

TEST(keys_of_many_sizes_stay_flat_through_the_var_classes) {
  StateMap m(nullptr, MapEngine::Flat);
  auto s0 = m.snapshot();
  Ref ref;
  // Sizes 1..63 in rising order: a fixed layout, then every var class in turn.
  for (int i = 0; i < 4000; ++i) {
    const size_t n = 1 + static_cast<size_t>(i) * 63 / 4000;
    std::string k(n, 'a');
    for (size_t j = 0; j < n; ++j) k[j] = static_cast<char>((i >> (j % 3 * 4)) + j);
    k[0] = static_cast<char>(i);
    k[n - 1] = static_cast<char>(i >> 8);
    put(m, k, val8(i));
    ref[k] = val8(i);
  }
  CHECK(m.is_flat());
  CHECK_EQ(m.stats().relayouts, uint64_t{6});  // fixed -> 15 -> 23 -> 31 -> 39 -> 47 -> 63
  CHECK(live(m) == ref);
  for (auto& kv : ref) {
    std::string v;
    CHECK(get(m, kv.first, &v) && v == kv.second);
  }
  std::string v;
  CHECK(!get(m, std::string(63, 'z'), &v));
  // A key with trailing zero bytes differs from its prefix (the size byte).
  put(m, std::string("ab\0", 3), val8(1));
  put(m, "ab", val8(2));
  CHECK(get(m, std::string("ab\0", 3), &v) && v == val8(1));
  CHECK(get(m, "ab", &v) && v == val8(2));
  CHECK(entries(*s0).empty());
  auto s1 = m.snapshot();
  CHECK_EQ(entries(*s1).size(), ref.size() + 2);
  put(m, std::string(64, 'k'), "12345678");  // past the largest class: converts
  CHECK(!m.is_flat());
  CHECK_EQ(entries(*s1).size(), ref.size() + 2);
  CHECK(get(m, "ab", &v) && v == val8(2));
}

TEST(oversized_layouts_start_chained) {
  StateMap m(nullptr, MapEngine::Flat);
  put(m, std::string(80, 'k'), "v");
  CHECK(!m.is_flat());
  StateMap n(nullptr, MapEngine::Flat);
  put(n, key9(1), std::string(300, 'v'));
  CHECK(!n.is_flat());
}

TEST(clear_forgets_the_layout) {
  StateMap m(nullptr, MapEngine::Flat);
  put(m, key9(1), val8(1));
  m.clear();
  put(m, "abc", "de");  // a new layout, no conversion
  CHECK(m.is_flat());
  std::string v;
  CHECK(get(m, "abc", &v) && v == "de");
}

TEST(snapshot_is_o1_and_writes_copy_one_page) {
  StateMap m(nullptr, MapEngine::Flat);
  for (int i = 0; i < 20000; ++i) put(m, key9(i), val8(i));
  while (m.is_rehashing()) m.get(u8(key9(0)), 9, nullptr);
  auto before = m.stats();
  auto s = m.snapshot();
  auto after = m.stats();
  CHECK_EQ(after.page_copies, before.page_copies);
  CHECK_EQ(after.directory_copies, before.directory_copies);
  put(m, key9(123), val8(7));
  auto w1 = m.stats();
  CHECK_EQ(w1.directory_copies, after.directory_copies + 1);
  CHECK(w1.page_copies - after.page_copies >= 1);
  CHECK(w1.page_copies - after.page_copies <= 2);  // a probe may end on the next page
  put(m, key9(123), val8(8));
  CHECK_EQ(m.stats().page_copies, w1.page_copies);
  std::string v;
  CHECK(get(m, key9(123), &v) && v == val8(8));
  Ref snap = entries(*s);
  CHECK(snap[key9(123)] == val8(123));
  s->release();
  auto r = m.stats();
  for (int i = 0; i < 20000; i += 7) put(m, key9(i), val8(1));
  CHECK_EQ(m.stats().page_copies, r.page_copies);  // no live snapshot: writes in place
}

TEST(incremental_rehash_with_removals_in_both_tables) {
  StateMap m(nullptr, MapEngine::Flat);
  std::set<uint64_t> ref;
  std::mt19937_64 rng(11);
  bool saw_rehash_removal = false;
  for (int i = 0; i < 200000; ++i) {
    const uint64_t k = rng() % 60000;
    if (rng() % 3 == 0) {
      const bool was_rehashing = m.is_rehashing();
      CHECK_EQ(m.remove(u8(key9(k)), 9), ref.erase(k) == 1);
      saw_rehash_removal = saw_rehash_removal || was_rehashing;
    } else {
      put(m, key9(k), val8(k));
      ref.insert(k);
    }
  }
  CHECK(saw_rehash_removal);
  CHECK_EQ(m.size(), ref.size());
  Ref l = live(m);
  CHECK_EQ(l.size(), ref.size());
  bool all = true;
  for (uint64_t k : ref) all = all && l.count(key9(k)) == 1 && l[key9(k)] == val8(k);
  CHECK(all);
}

// Batch kernels' upsert() finishes a rehash in flight at once (StateMap::upsert); single-row
// operations keep the incremental steps. A snapshot taken mid-rehash keeps its contents.
TEST(upsert_completes_a_rehash_in_flight_on_both_engines) {
  for (MapEngine engine : {MapEngine::Flat, MapEngine::Chained}) {
    StateMap m(nullptr, engine);
    int n = 0;
    while (!m.is_rehashing() || n < 3000) {
      put(m, key9(n), val8(n));
      ++n;
      if (n > 100000) break;
    }
    CHECK(m.is_rehashing());
    auto s = m.snapshot();
    const Ref before = entries(*s);
    CHECK_EQ(before.size(), static_cast<size_t>(n));
    size_t vs = 0;
    bool inserted = true;
    const std::string old = key9(5);
    uint8_t* p = m.upsert(m.hash(u8(old), 9), u8(old), 9, 8, &vs, &inserted);
    CHECK(!m.is_rehashing());
    CHECK(!inserted);
    CHECK_EQ(vs, size_t(8));
    CHECK(std::string(reinterpret_cast<const char*>(p), 8) == val8(5));
    std::memcpy(p, val8(55).data(), 8);
    const std::string fresh = key9(n);
    p = m.upsert(m.hash(u8(fresh), 9), u8(fresh), 9, 8, &vs, &inserted);
    CHECK(inserted);
    std::memcpy(p, val8(n).data(), 8);
    Ref want = before;
    want[old] = val8(55);
    want[fresh] = val8(n);
    CHECK(live(m) == want);
    CHECK(entries(*s) == before);  // the snapshot still reads the tables as they were
    CHECK_EQ(m.is_flat(), engine == MapEngine::Flat);
    s->release();
  }
}

// The default hash over keys of 9-16 bytes (its short-key path): sequential and strided int64
// keys of one key group must fill the low bits (the slot index) and the high bits evenly.
TEST(default_hash_spreads_short_keys) {
  // The varying 8 bytes at the end (an int64 key, or a namespace after a fixed key) or right
  // after the prefix (an int64 key before a fixed namespace), for the short (9-16) and medium
  // (17-24) key paths and the word loop beyond.
  StateMap m(nullptr, MapEngine::Flat);
  for (size_t ks :
       {size_t(9), size_t(10), size_t(16), size_t(17), size_t(20), size_t(24), size_t(25)}) {
    for (int pattern = 0; pattern < 6; ++pattern) {
      constexpr size_t kBuckets = 1 << 12, kKeys = kBuckets * 64;
      std::vector<uint32_t> low(kBuckets), high(kBuckets);
      std::string k(ks, '\0');
      k[0] = 7;
      k[ks - 1] = ks > 16 && pattern >= 3 ? 9 : k[ks - 1];
      const size_t at = pattern >= 3 ? 1 : ks - 8;
      for (size_t i = 0; i < kKeys; ++i) {
        const uint64_t x = pattern % 3 == 0 ? i : pattern % 3 == 1 ? i << 32 : i * 0x10000000001ULL;
        for (size_t b = 0; b < 8; ++b) k[at + b] = static_cast<char>(x >> (56 - 8 * b));
        const uint32_t h = m.hash(u8(k), ks);
        ++low[h & (kBuckets - 1)];
        ++high[h >> 20];
      }
      // chi-square / degrees of freedom: 1 +- 0.07 at 3 sigma for 4096 buckets.
      auto chi = [](const std::vector<uint32_t>& c) {
        const double e = double(kKeys) / kBuckets;
        double x = 0;
        for (uint32_t v : c) x += (v - e) * (v - e) / e;
        return x / kBuckets;
      };
      CHECK(chi(low) < 1.15);
      CHECK(chi(high) < 1.15);
    }
  }
}

TEST(collect_buckets_once_per_pass_while_the_visitor_removes) {
  for (KeyHashFunction h : {static_cast<KeyHashFunction>(nullptr), &weak_hash}) {
    StateMap m(h, MapEngine::Flat);
    for (int i = 0; i < 3000; ++i) put(m, key9(i), val8(i));
    CHECK(m.is_flat());
    for (size_t step : {1, 5, 1000}) {
      auto seen = one_pass(m, step, /*remove_odd_seen=*/true);
      bool once = true;
      for (auto& kv : seen) once = once && kv.second == 1;
      CHECK(once);
      CHECK_EQ(seen.size(), step == 1 ? size_t{3000} : m.size());
    }
  }
}

// The snapshot thread contract on the flat engine (run under TSan in CI): a reader lists and
// releases a snapshot while the owner writes, removes and grows the map.
THREADED_TEST(snapshot_read_and_released_concurrently_with_writes) {
  StateMap m(nullptr, MapEngine::Flat);
  std::mt19937_64 rng(12);
  Ref ref;
  bool all_ok = true;
  for (int round = 0; round < 6; ++round) {
    for (int i = 0; i < 3000; ++i) {
      const std::string k = key9(rng() % 5000), v = val8(rng());
      put(m, k, v);
      ref[k] = v;
    }
    const Ref expected = ref;
    auto snap = m.snapshot();
    bool ok = false;
    std::thread reader([&] {
      ok = entries(*snap) == expected &&
           listing(snap->sorted_changes(snap->base_version())).size() > 0;
      snap->release();
    });
    for (int i = 0; i < 20000; ++i) {
      const std::string k = key9(rng() % (6000 + 4000 * round));
      if (rng() % 3 == 0) {
        m.remove(u8(k), k.size());
        ref.erase(k);
      } else {
        const std::string v = val8(rng());
        put(m, k, v);
        ref[k] = v;
      }
    }
    reader.join();
    all_ok = all_ok && ok && live(m) == ref;
  }
  CHECK(all_ok);
  CHECK(m.is_flat());
}

TEST(differential_against_the_chained_engine_default_hash) {
  differential(nullptr, 1, 60000, 3000, false);
  differential(nullptr, 2, 60000, 40000, false);
}

TEST(differential_against_the_chained_engine_colliding_hashes) {
  differential(&colliding_hash, 3, 4000, 200, false);
  differential(&weak_hash, 4, 20000, 2000, false);
}

TEST(differential_over_keys_of_many_sizes) {
  differential(nullptr, 7, 60000, 3000, false, Keys::Sized);
  differential(&weak_hash, 8, 20000, 2000, false, Keys::Sized);
  differential(&colliding_hash, 9, 4000, 200, false, Keys::Sized);
}

TEST(differential_across_a_conversion_from_var_keys) {
  differential(nullptr, 10, 30000, 2000, false, Keys::SomeTooLong);
  differential(nullptr, 11, 30000, 2000, true, Keys::Sized);
}

TEST(differential_across_a_conversion) {
  differential(nullptr, 5, 30000, 2000, true);
  differential(&weak_hash, 6, 10000, 500, true);
}

TEST_MAIN()
