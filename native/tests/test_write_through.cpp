// Write-through copy-on-write of the flat engine (detail/write_through.h, docs/state-map.md
// "Write-through copy-on-write"): while a snapshot has not been read, batch kernels write the
// pages it shares in place and save each slot once before its first write; the snapshot's first
// read copies the table and puts the saved slots back. Checked against the contents taken at
// snapshot time: through writes of every slot, inserts and removals, a reader on another thread
// while the owner writes, overlapping snapshots released in either order, and a release on
// another thread while the owner writes through. Over the chained engine (the suite's second
// run) the same contents must hold; only the page-copy counts are flat facts.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "batch_test_arrays.h"
#include "check.h"
#include "statecore/batch.h"
#include "statecore/detail/map_impl.h"
#include "statecore/detail/write_through.h"
#include "statecore/key_groups.h"
#include "statecore/state_table.h"

using namespace statecore;
using namespace statecore_test;

namespace {

constexpr int32_t kMaxP = 8;

BatchKeySpec spec() { return full_range_spec(KeyType::Int64, kMaxP); }

int64_t decode(const uint8_t* key) {
  uint64_t u = 0;
  for (int b = 0; b < 8; ++b) u = (u << 8) | key[1 + b];  // 1-byte key-group prefix
  return static_cast<int64_t>(u);
}

std::map<int64_t, std::string> live(StateTable& t) {
  std::map<int64_t, std::string> out;
  for (const auto& kv : dump(t))
    out[decode(reinterpret_cast<const uint8_t*>(kv.first.data()))] = kv.second;
  return out;
}

std::map<int64_t, std::string> of_snapshot(const TableSnapshot& s) {
  std::map<int64_t, std::string> out;
  for (int32_t kg = s.kg_start(); kg <= s.kg_end(); ++kg) {
    const SortedRun run = s.map(kg)->sorted_entries();
    for (size_t i = 0; i < run.size(); ++i) {
      const ByteView v = run.value(i);
      out[decode(run.key(i).data)] = std::string(reinterpret_cast<const char*>(v.data), v.size);
    }
  }
  return out;
}

uint64_t page_copies(StateTable& t) {
  uint64_t n = 0;
  for (int32_t kg = t.kg_start(); kg <= t.kg_end(); ++kg) n += t.map(kg).stats().page_copies;
  return n;
}

bool flat(StateTable& t) { return t.map(0).is_flat(); }

// A table of `n` int64 keys (k * 104729, value 1) and add_batch(Sum) / put_batch over key sets.
struct Fixture {
  StateTable t{0, kMaxP - 1};
  BatchKeySpec sp = spec();
  std::vector<int64_t> all;

  explicit Fixture(int64_t n) {
    for (int64_t i = 0; i < n; ++i) all.push_back(i * 104729);
    add(all, 1);
  }
  void add(const std::vector<int64_t>& ks, int64_t by) {
    I64 keys, vals;
    for (int64_t k : ks) keys.push_back(k), vals.push_back(by);
    TestArray k = fixed<int64_t>("l", keys), v = fixed<int64_t>("l", vals);
    std::vector<int64_t> out(ks.size());
    std::vector<uint8_t> valid(ks.size());
    add_batch(t, sp, k.in(), ValueType::Int64, Reducer::Sum, v.in(), out.data(), valid.data());
  }
  // put_batch: a null value removes the key.
  void put(const std::vector<int64_t>& ks, const std::vector<std::optional<int64_t>>& vs) {
    I64 keys(ks.begin(), ks.end());
    TestArray k = fixed<int64_t>("l", keys), v = fixed<int64_t>("l", vs);
    put_batch(t, sp, k.in(), ValueType::Int64, v.in());
  }
  std::vector<int64_t> sample(size_t m, uint32_t seed) const {
    std::mt19937_64 rng(seed);
    std::vector<int64_t> out;
    for (size_t i = 0; i < m; ++i) out.push_back(all[rng() % all.size()]);
    return out;
  }
};

}  // namespace

TEST(writes_after_a_snapshot_save_slots_instead_of_copying_pages) {
  Fixture f(30000);  // ~3750 keys a map, 16 pages each
  const uint64_t c0 = page_copies(f.t);
  std::optional<TableSnapshot> s(f.t.snapshot());
  const auto at = live(f.t);
  f.add(f.sample(4000, 1), 5);
  f.add(f.all, 1);  // every slot written, most twice since the snapshot
  if (flat(f.t)) {
    // The first row of each map takes the general path (its directory is shared), which copies
    // that row's page; every other write goes through in place.
    CHECK(page_copies(f.t) - c0 <= uint64_t(kMaxP));
  }
  CHECK(of_snapshot(*s) == at);
  const auto now = live(f.t);
  for (const auto& kv : at) CHECK(now.at(kv.first) != kv.second);
}

TEST(after_the_first_read_the_owner_writes_in_place_without_saving) {
  Fixture f(30000);
  std::optional<TableSnapshot> s(f.t.snapshot());
  const auto at = live(f.t);
  f.add(f.sample(3000, 2), 7);
  CHECK(of_snapshot(*s) == at);  // the read copies the table: the pages are the owner's again
  const uint64_t c1 = page_copies(f.t);
  f.add(f.all, 1);
  f.add(f.sample(3000, 3), 2);
  if (flat(f.t)) CHECK_EQ(page_copies(f.t), c1);
  CHECK(of_snapshot(*s) == at);  // its own copy now
  s.reset();
  f.add(f.all, 1);
  if (flat(f.t)) CHECK_EQ(page_copies(f.t), c1);
}

TEST(inserts_and_removals_through_a_snapshot_keep_its_view) {
  Fixture f(20000);
  std::optional<TableSnapshot> s(f.t.snapshot());
  const auto at = live(f.t);
  std::vector<int64_t> ks;
  std::vector<std::optional<int64_t>> vs;
  std::mt19937_64 rng(4);
  for (int i = 0; i < 6000; ++i) {
    ks.push_back(f.all[rng() % f.all.size()]);
    vs.push_back(i % 3 == 0 ? std::nullopt : std::optional<int64_t>(i));  // removals shift slots
  }
  // Inserts past the load threshold: every map starts a rehash while the snapshot is unread.
  for (int i = 0; i < 8000; ++i) ks.push_back(int64_t(i) * 7 + 1), vs.push_back(i);
  uint64_t rehashes = 0;
  for (int32_t kg = 0; kg < kMaxP; ++kg) rehashes += f.t.map(kg).stats().rehashes;
  f.put(ks, vs);
  uint64_t after = 0;
  for (int32_t kg = 0; kg < kMaxP; ++kg) after += f.t.map(kg).stats().rehashes;
  CHECK(after >= rehashes + kMaxP);
  f.add(f.all, 3);
  std::map<int64_t, std::string> want = at;
  for (size_t i = 0; i < ks.size(); ++i) {
    if (vs[i]) want[ks[i]] = le64(*vs[i]);
    else want.erase(ks[i]);
  }
  for (int64_t k : f.all) {
    auto it = want.find(k);
    int64_t v = 0;
    if (it != want.end()) std::memcpy(&v, it->second.data(), 8);
    want[k] = le64(v + 3);
  }
  CHECK(live(f.t) == want);
  CHECK(of_snapshot(*s) == at);
}

TEST(changes_listed_from_a_written_through_snapshot) {
  Fixture f(20000);
  {
    TableSnapshot s0 = f.t.snapshot();
    for (int32_t kg = 0; kg < kMaxP; ++kg) f.t.map(kg).mark_base(s0.version());
  }
  const uint64_t base = f.t.map(0).base_version();
  const std::vector<int64_t> changed = f.sample(3000, 30);
  f.add(changed, 1);
  std::optional<TableSnapshot> s(f.t.snapshot());
  const auto at = live(f.t);
  f.add(f.all, 1);  // every slot written through, the changed ones saved with their new value
  std::map<int64_t, std::string> listed;
  for (int32_t kg = 0; kg < kMaxP; ++kg) {
    const SortedRun run = s->map(kg)->sorted_changes(base);
    for (size_t i = 0; i < run.size(); ++i) {
      CHECK(!run.removed(i));
      const ByteView v = run.value(i);
      listed[decode(run.key(i).data)] = std::string(reinterpret_cast<const char*>(v.data), v.size);
    }
  }
  std::map<int64_t, std::string> want;
  for (int64_t k : changed) want[k] = at.at(k);
  CHECK(listed == want);
}

THREADED_TEST(a_reader_on_another_thread_sees_its_view_while_the_owner_writes_every_slot) {
  Fixture f(30000);
  for (int round = 0; round < 4; ++round) {
    std::optional<TableSnapshot> s(f.t.snapshot());
    const auto at = live(f.t);
    std::map<int64_t, std::string> seen;
    std::thread reader([&] { seen = of_snapshot(*s); });
    for (int i = 0; i < 6; ++i) f.add(i % 2 ? f.all : f.sample(5000, 10 + round * 8 + i), 1);
    reader.join();
    CHECK(seen == at);
    CHECK(of_snapshot(*s) == at);
  }
}

TEST(overlapping_snapshots_released_in_either_order) {
  for (int order = 0; order < 2; ++order) {
    Fixture f(20000);
    std::optional<TableSnapshot> s1(f.t.snapshot());  // written through
    const auto at1 = live(f.t);
    f.add(f.sample(4000, 20), 2);
    std::optional<TableSnapshot> s2(f.t.snapshot());  // not alone: copy-on-write by pages
    const auto at2 = live(f.t);
    f.add(f.all, 1);
    if (order == 0) {
      s1.reset();  // never read
      f.add(f.sample(4000, 21), 4);
      CHECK(of_snapshot(*s2) == at2);
    } else {
      s2.reset();
      f.add(f.sample(4000, 22), 4);
      CHECK(of_snapshot(*s1) == at1);
    }
    std::optional<TableSnapshot> s3(f.t.snapshot());
    const auto at3 = live(f.t);
    f.add(f.all, 1);
    CHECK(of_snapshot(*s3) == at3);
    if (order == 0) CHECK(of_snapshot(*s2) == at2);
    else CHECK(of_snapshot(*s1) == at1);
  }
}

THREADED_TEST(the_reader_takes_a_page_the_owner_holds_only_after_the_owner_gave_it_back) {
  // WriteThrough alone, two pages of 4 slots of 8 bytes (meta + 4 bytes). The owner writes
  // slot 1 of page 0 in place, holding page 0 until its kernel call ends; the reader copies
  // page 1 meanwhile but not page 0, and after the call ends copies page 0 with the write in it,
  // which the saved record then undoes.
  constexpr uint32_t kStride = 8, kSlots = 4, kVersion = 7;
  std::vector<uint8_t> src0(kSlots * kStride), src1(kSlots * kStride);
  std::vector<uint8_t> dst0(src0.size(), 0xEE), dst1(src1.size(), 0xEE);
  for (size_t i = 0; i < src0.size(); ++i) src0[i] = uint8_t(i), src1[i] = uint8_t(100 + i);
  const std::vector<uint8_t> at0 = src0;
  auto w = std::make_shared<detail::WriteThrough>(kStride, 2);
  CHECK(w->owner_write(0, kStride, src0.data() + kStride, kVersion));
  CHECK_EQ(w->size(), size_t(1));
  std::memset(src0.data() + kStride, 0xAB, kStride);  // the in-place write, meta included
  std::atomic<bool> finished{false};
  const uint8_t* src[2] = {src0.data(), src1.data()};
  uint8_t* dst[2] = {dst0.data(), dst1.data()};
  std::thread reader([&] {
    w->copy_pages(src, dst, 2, src0.size());
    finished.store(true);
  });
  // The reader cannot finish while page 0 is held.
  for (int i = 0; i < 50; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    CHECK(!finished.load());
  }
  detail::release_through_claims();  // gives page 0 back
  reader.join();
  CHECK(finished.load());
  CHECK(dst1 == src1);
  CHECK(dst0 == src0);  // copied after the write
  w->for_each_newest_first([&](uint32_t page, uint32_t offset, const uint8_t* bytes) {
    CHECK_EQ(page, 0u);
    std::memcpy(dst0.data() + offset, bytes, kStride);
  });
  CHECK(dst0 == at0);
  // Both pages copied: the owner writes in place, nothing saved.
  CHECK(w->owner_write(0, 0, src0.data(), kVersion));
  CHECK(w->owner_write(1, 0, src1.data(), kVersion));
  detail::release_through_claims();
  CHECK_EQ(w->size(), size_t(1));
}

THREADED_TEST(a_kernel_call_holding_the_whole_map_keeps_the_reader_out_until_it_ends) {
  // A call that began while the reader had not started writes the map without per-page
  // exchanges (begin_call takes the map); the reader starts only once the call ended, and the
  // owner's later calls keep pages apart.
  constexpr uint32_t kStride = 8, kSlots = 4, kVersion = 3;
  std::vector<uint8_t> src0(kSlots * kStride, 0x11), dst0(src0.size(), 0);
  const std::vector<uint8_t> at0 = src0;
  auto w = std::make_shared<detail::WriteThrough>(kStride, 1);
  w->begin_call();
  CHECK(w->owner_write(0, 0, src0.data(), kVersion));
  std::memset(src0.data(), 0x22, kStride);
  std::atomic<bool> finished{false};
  const uint8_t* src[1] = {src0.data()};
  uint8_t* dst[1] = {dst0.data()};
  std::thread reader([&] {
    w->copy_pages(src, dst, 1, src0.size());
    finished.store(true);
  });
  CHECK(w->owner_write(0, kStride, src0.data() + kStride, kVersion));  // still the whole map
  detail::store_u32(src0.data() + kStride, kVersion);                  // the write stamps the slot
  for (int i = 0; i < 50; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    CHECK(!finished.load());
    CHECK(w->owner_write(0, kStride, src0.data() + kStride, kVersion));  // no second save
  }
  std::memset(src0.data() + kStride + 4, 0x33, kStride - 4);
  detail::release_through_claims();
  reader.join();
  CHECK_EQ(w->size(), size_t(2));
  w->for_each_newest_first([&](uint32_t, uint32_t offset, const uint8_t* bytes) {
    std::memcpy(dst0.data() + offset, bytes, kStride);
  });
  CHECK(dst0 == at0);
  w->begin_call();  // the reader has the map: page by page, and page 0 is copied
  CHECK(w->owner_write(0, 2 * kStride, src0.data() + 2 * kStride, kVersion));
  detail::release_through_claims();
  CHECK_EQ(w->size(), size_t(2));
}

THREADED_TEST(a_reader_copies_pages_while_the_owner_keeps_writing_them) {
  // The reader copies page by page while the owner's kernel calls write the same maps in place:
  // updates of every key, inserts into empty slots and removals (put_batch). The owner runs
  // until the reader is done, so the two overlap on every map; the snapshot must read exactly
  // its contents and the live table must hold every write.
  Fixture f(60000);  // ~7500 keys a map, 20 pages each
  std::map<int64_t, int64_t> want;
  for (int64_t k : f.all) want[k] = 1;
  auto as_bytes = [](const std::map<int64_t, int64_t>& m) {
    std::map<int64_t, std::string> out;
    for (const auto& kv : m) out[kv.first] = le64(kv.second);
    return out;
  };
  std::mt19937_64 rng(77);
  int64_t next_new = 1;
  for (int round = 0; round < (check::kThreadSanitizer ? 2 : 8); ++round) {
    std::optional<TableSnapshot> s(f.t.snapshot());
    const auto at = live(f.t);
    CHECK(at == as_bytes(want));
    std::atomic<bool> finished{false};
    std::map<int64_t, std::string> seen;
    std::thread reader([&] {
      seen = of_snapshot(*s);
      finished.store(true);
    });
    int calls = 0;
    while (!finished.load() || calls < 4) {
      if (calls % 3 == 2) {
        // Inserts of new keys (odd, so never a multiple of 104729 * 2) and removals.
        std::vector<int64_t> ks;
        std::vector<std::optional<int64_t>> vs;
        for (int i = 0; i < 200; ++i) {
          const int64_t k = next_new;
          next_new += 2;
          ks.push_back(k), vs.push_back(k);
          want[k] = k;
        }
        for (int i = 0; i < 50; ++i) {
          const int64_t k = f.all[rng() % f.all.size()];
          ks.push_back(k), vs.push_back(std::nullopt);
          want.erase(k);
        }
        f.put(ks, vs);
      } else {
        const std::vector<int64_t> ks =
            calls % 3 == 0 ? f.all : f.sample(3000, static_cast<uint32_t>(round * 1000 + calls));
        f.add(ks, 1);
        for (int64_t k : ks) ++want[k];
      }
      ++calls;
    }
    reader.join();
    CHECK(seen == at);
    CHECK(of_snapshot(*s) == at);
    CHECK(live(f.t) == as_bytes(want));
  }
}

THREADED_TEST(a_snapshot_released_on_another_thread_while_the_owner_writes_through) {
  Fixture f(30000);
  for (int round = 0; round < 4; ++round) {
    auto s = std::make_shared<TableSnapshot>(f.t.snapshot());
    std::atomic<bool> go{false};
    std::thread releaser([&] {
      while (!go.load()) std::this_thread::yield();
      // Half the maps read (copied), the other half released unread, while the owner writes.
      for (int32_t kg = 0; kg < kMaxP; ++kg) {
        if (kg % 2 == round % 2) (void)s->map(kg)->sorted_entries();
        s->map(kg)->release();
      }
    });
    go = true;
    for (int i = 0; i < 6; ++i) f.add(f.sample(5000, 40 + round * 8 + i), 1);
    releaser.join();
    s.reset();
  }
  // Every slot written through or in place, none lost: the sums add up.
  int64_t total = 0;
  for (const auto& kv : live(f.t)) {
    int64_t v;
    std::memcpy(&v, kv.second.data(), 8);
    total += v;
  }
  CHECK_EQ(total, int64_t(30000) + 4 * 6 * 5000);
}

TEST_MAIN()
