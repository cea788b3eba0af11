// LookupStep and open_table_block (run_lookup.h) against a model: a file of blocks of sorted
// keys (some tombstones), keys routed to their blocks; rounds within open_bytes, cached blocks
// not read again, missing blocks coalesced by gap and read size, every key found or not as the
// model says (in rounds and in run() on a fetch pool), and a corrupt block reported and never
// cached.
#include <unistd.h>

#include <dirent.h>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <initializer_list>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "payload_builder.h"
#include "statecore/block_codec.h"
#include "statecore/hash.h"
#include "statecore/run_lookup.h"

using namespace statecore;
using statecore_test::payload;

namespace {

// A file of `nblocks` blocks of 4 keys each ("k<block><j>"), `gap` bytes between blocks.
struct File {
  std::vector<uint8_t> bytes;
  std::vector<StoredBlockRef> refs;
  std::vector<int64_t> key_offsets{0};
  std::vector<uint8_t> key_data;
  std::map<std::string, std::string> model;
  RunBlockTable table;

  File(int nblocks, size_t gap, int64_t file_id) {
    for (int b = 0; b < nblocks; ++b) {
      std::map<std::string, std::string> e;
      for (int j = 0; j < 4; ++j) {
        char k[16];
        std::snprintf(k, sizeof k, "k%03d%d", b, j * 2);
        e[k] = (b + j) % 5 == 0 ? "" : std::string(1 + (b + j) % 3, static_cast<char>('a' + j));
      }
      model.insert(e.begin(), e.end());
      const std::vector<uint8_t> p = payload(e, true);
      std::vector<uint8_t> stored;
      lz4_block_compress(p.data(), p.size(), &stored);
      bytes.insert(bytes.end(), gap, 0);
      StoredBlockRef r;
      r.offset = bytes.size();
      r.stored_length = stored.size();
      r.raw_length = p.size();
      r.entries = e.size();
      r.xxh64 = xxh64(stored.data(), stored.size(), 0);
      refs.push_back(r);
      bytes.insert(bytes.end(), stored.begin(), stored.end());
      const std::string& last = e.rbegin()->first;
      key_data.insert(key_data.end(), last.begin(), last.end());
      key_offsets.push_back(static_cast<int64_t>(key_data.size()));
    }
    table.file_id = file_id;
    table.has_validity = true;
    table.blocks = refs.data();
    table.block_count = refs.size();
    table.key_offsets = key_offsets.data();
    table.key_data = key_data.data();
  }
};

struct Keys {
  std::vector<int32_t> offsets{0};
  std::vector<uint8_t> data;
  std::vector<std::string> text;
  std::vector<int64_t> block;
  void add(const std::string& k, int64_t b) {
    data.insert(data.end(), k.begin(), k.end());
    offsets.push_back(static_cast<int32_t>(data.size()));
    text.push_back(k);
    block.push_back(b);
  }
};

// Searches and gathers the keys of round `slot` of `step`, every block pinned, checking each
// against the model and counting it in *seen.
void search_and_check(LookupStep& step, const File& f, const Keys& keys, size_t slot,
                      std::vector<int>* seen) {
  const size_t n = step.round_key_count(slot);
  std::vector<int64_t> rows(n);
  const uint64_t total = step.search(keys.offsets.data(), keys.data.data(), rows.data(), slot);
  std::vector<int32_t> off(n + 1);
  std::vector<uint8_t> data(total + 1), valid((n + 7) / 8, 0);
  step.gather(off.data(), data.data(), valid.data(), slot);
  CHECK_EQ(uint64_t(off[n]), total);
  for (size_t i = 0; i < n; ++i) {
    const int64_t k = step.round_key(i, slot);
    ++(*seen)[k];
    auto it = f.model.find(keys.text[k]);
    CHECK_EQ(rows[i] >= 0, it != f.model.end());
    const bool has = (valid[i >> 3] >> (i & 7)) & 1;
    CHECK_EQ(has, it != f.model.end() && !it->second.empty());
    if (has) CHECK_EQ(std::string(data.begin() + off[i], data.begin() + off[i + 1]), it->second);
  }
}

// Runs every round of `step` (reads served from `f`), checking each key against the model;
// returns the blocks read.
size_t run_step(LookupStep& step, const File& f, const Keys& keys, uint64_t open_bytes,
                std::vector<size_t>* reads_per_round = nullptr) {
  size_t read = 0;
  std::vector<int> seen(keys.text.size(), 0);
  while (step.next_round()) {
    CHECK(step.round_bytes() <= open_bytes || step.missing().size() + step.round_hits() == 1);
    for (size_t r = 0; r < step.ranges().size(); ++r) {
      const ReadRange& rr = step.ranges()[r];
      std::string why;
      CHECK_EQ(step.open_range(r, f.bytes.data() + rr.offset, rr.length, &why), int64_t(-1));
      read += rr.count;
    }
    if (reads_per_round) reads_per_round->push_back(step.ranges().size());
    search_and_check(step, f, keys, 0, &seen);
  }
  for (int s : seen) CHECK_EQ(s, 1);
  return read;
}

// Opens the reads r % workers == worker of round `slot` of `step` from `f`; returns the blocks
// read.
size_t open_all(LookupStep& step, const File& f, size_t slot, size_t worker = 0,
                size_t workers = 1) {
  size_t read = 0;
  for (size_t r = worker; r < step.ranges(slot).size(); r += workers) {
    const ReadRange& rr = step.ranges(slot)[r];
    std::string why;
    if (step.open_range(r, f.bytes.data() + rr.offset, rr.length, &why, slot) != -1) std::abort();
    read += rr.count;
  }
  return read;
}

// run_step with two round slots: `openers` threads open the next round's reads (slot 1 - s)
// while this one searches and gathers round s, as RunLookup does. Adds the blocks open_range
// searched to *on_open.
size_t run_step_pipelined(LookupStep& step, const File& f, const Keys& keys, size_t openers = 1,
                          size_t* on_open = nullptr) {
  std::vector<int> seen(keys.text.size(), 0);
  size_t slot = 0;
  if (!step.next_round(slot)) return 0;
  size_t read = open_all(step, f, slot);
  for (bool more = true; more;) {
    const size_t ahead = 1 - slot;
    more = step.next_round(ahead);
    std::vector<size_t> ahead_read(openers, 0);
    std::vector<std::thread> threads;
    for (size_t w = 0; more && w < openers; ++w)
      threads.emplace_back([&, w] { ahead_read[w] = open_all(step, f, ahead, w, openers); });
    if (on_open) *on_open += step.round_searched_on_open(slot);
    search_and_check(step, f, keys, slot, &seen);
    for (std::thread& t : threads) t.join();
    for (size_t n : ahead_read) read += n;
    slot = ahead;
  }
  for (int s : seen) CHECK_EQ(s, 1);
  return read;
}

// Routes every key of `keys` (key index i) to its block keys.block[i] of `f` in each of `steps`.
void add_every_key(const File& f, const Keys& keys, std::initializer_list<LookupStep*> steps) {
  std::vector<int64_t> idx(keys.text.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<int64_t>(i);
  for (LookupStep* step : steps) step->add(&f.table, idx.data(), keys.block.data(), idx.size());
}

Keys routed_keys(const File& f, int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Keys keys;
  for (int i = 0; i < n; ++i) {
    const int64_t b = static_cast<int64_t>(rng() % f.refs.size());
    char k[16];
    std::snprintf(k, sizeof k, "k%03d%d", static_cast<int>(b), static_cast<int>(rng() % 8));
    keys.add(k, b);
  }
  return keys;
}

}  // namespace

TEST(every_key_is_answered_as_the_model_says) {
  // With set_keys the keys of each opened block are searched by open_range, those of cached
  // blocks by search(): the answers are the same.
  const File f(40, 5, 1);
  const Keys keys = routed_keys(f, 300, 7);
  for (bool on_open : {false, true}) {
    for (uint64_t open_bytes : {uint64_t(1), uint64_t(200), uint64_t(1) << 30}) {
      BlockCache cache(1 << 20);
      LookupStep step(&cache, open_bytes, 128, 1 << 20);
      add_every_key(f, keys, {&step});
      if (on_open) step.set_keys(keys.offsets.data(), keys.data.data());
      const size_t read = run_step(step, f, keys, open_bytes);
      CHECK(read <= f.refs.size());
      // A second step finds every block in the cache: no read.
      LookupStep again(&cache, open_bytes, 128, 1 << 20);
      add_every_key(f, keys, {&again});
      if (on_open) again.set_keys(keys.offsets.data(), keys.data.data());
      CHECK_EQ(run_step(again, f, keys, open_bytes), size_t(0));
    }
  }
}

TEST(rounds_hold_at_most_open_bytes) {
  const File f(30, 0, 1);
  Keys keys;
  for (int b = 0; b < 30; ++b) keys.add("k" + std::to_string(1000 + b).substr(1) + "0", b);
  std::vector<int64_t> idx(30);
  for (int i = 0; i < 30; ++i) idx[i] = i;
  const uint64_t two = f.refs[0].raw_length + f.refs[1].raw_length;
  BlockCache cache(0);  // keeps nothing
  LookupStep step(&cache, two, 1 << 20, 1 << 20);
  step.add(&f.table, idx.data(), keys.block.data(), 30);
  size_t rounds = 0;
  while (step.next_round()) {
    ++rounds;
    CHECK(step.round_bytes() <= two);
    CHECK(step.missing().size() >= 1);
    CHECK_EQ(step.ranges().size(), size_t(1));  // adjacent blocks: one read
  }
  CHECK(rounds >= 15);
}

TEST(missing_blocks_coalesce_by_gap_and_read_size) {
  const File near(10, 16, 1), far(10, 1000, 2);
  Keys keys;
  std::vector<int64_t> idx, blocks;
  for (int b = 0; b < 10; b += 2) {
    keys.add("x", b);
    idx.push_back(static_cast<int64_t>(idx.size()));
    blocks.push_back(b);
  }
  BlockCache cache(1 << 20);
  {
    LookupStep step(&cache, 1 << 30, 512, 1 << 20);
    step.add(&near.table, idx.data(), blocks.data(), idx.size());
    step.add(&far.table, idx.data(), blocks.data(), idx.size());
    CHECK(step.next_round());
    // near: blocks 0, 2, ..., 8 one read; far: gaps of > 1000 bytes, one read each.
    CHECK_EQ(step.ranges().size(), size_t(6));
    CHECK_EQ(step.ranges()[0].count, size_t(5));
    CHECK_EQ(step.ranges()[0].offset, near.refs[0].offset);
    CHECK_EQ(step.ranges()[0].length,
             near.refs[8].offset + near.refs[8].stored_length - near.refs[0].offset);
    for (size_t r = 1; r < 6; ++r) CHECK_EQ(step.ranges()[r].count, size_t(1));
  }
  {
    const uint64_t cap = near.refs[2].offset + near.refs[2].stored_length - near.refs[0].offset;
    LookupStep step(&cache, 1 << 30, 512, cap);
    step.add(&near.table, idx.data(), blocks.data(), idx.size());
    CHECK(step.next_round());
    CHECK(step.ranges().size() >= 2);
    for (const ReadRange& r : step.ranges()) CHECK(r.length <= cap || r.count == 1);
  }
}

TEST(a_corrupt_block_is_reported_and_never_cached) {
  File f(4, 0, 1);
  f.bytes[f.refs[2].offset + 1] ^= 0xFF;
  Keys keys;
  keys.add("k0000", 0);
  keys.add("k0020", 2);
  std::vector<int64_t> idx{0, 1};
  BlockCache cache(1 << 20);
  for (int attempt = 0; attempt < 2; ++attempt) {
    LookupStep step(&cache, 1 << 30, 1 << 20, 1 << 20);
    step.add(&f.table, idx.data(), keys.block.data(), 2);
    CHECK(step.next_round());
    CHECK_EQ(step.ranges().size(), size_t(attempt == 0 ? 1 : 1));
    const ReadRange& rr = step.ranges()[0];
    std::string why;
    const int64_t bad = step.open_range(0, f.bytes.data() + rr.offset, rr.length, &why);
    CHECK_EQ(step.missing()[rr.first + bad].second, int64_t(2));
    CHECK_EQ(why, std::string("block checksum mismatch"));
  }
  CHECK(cache.get(1, 2) == nullptr);
  CHECK(cache.get(1, 0) != nullptr);  // the good block before it was kept
  std::string why;
  f.key_data.back() ^= 1;  // the last key no longer the footer's
  CHECK(open_table_block(f.table, 3, f.bytes.data(), f.bytes.size(), 0, &why) == nullptr);
  CHECK_EQ(why, std::string("last key differs from the footer's"));
  CHECK(open_table_block(f.table, 1, f.bytes.data() + 1, f.bytes.size() - 1, 1, &why) != nullptr);
}

THREADED_TEST(two_round_slots_open_the_next_round_while_this_one_is_searched) {
  // The same keys, blocks and cache as one slot gives, each key answered once as the model
  // says, with threads opening the next round's blocks (and offering them to the shared
  // cache) while this one searches the current round and gathers its values: one opener
  // without set_keys (search() searches every block), three with it (each block searched by
  // the thread that opened it); run under TSan.
  const File f(60, 5, 1);
  for (bool on_open : {false, true}) {
    const Keys keys = routed_keys(f, 400, on_open ? 13 : 11);
    for (uint64_t open_bytes : {uint64_t(1), uint64_t(300), uint64_t(1) << 30}) {
      BlockCache cache_one(1 << 20), cache_two(1 << 20);
      LookupStep one(&cache_one, open_bytes, 0, 1 << 20), two(&cache_two, open_bytes, 0, 1 << 20);
      add_every_key(f, keys, {&one, &two});
      if (on_open) two.set_keys(keys.offsets.data(), keys.data.data());
      const size_t single = run_step(one, f, keys, open_bytes);
      size_t searched_on_open = 0;
      CHECK_EQ(run_step_pipelined(two, f, keys, on_open ? 3 : 1, &searched_on_open), single);
      CHECK_EQ(searched_on_open, on_open ? single : size_t(0));
      CHECK_EQ(cache_two.stats().used_bytes, cache_one.stats().used_bytes);
      CHECK_EQ(cache_two.stats().misses, cache_one.stats().misses);
    }
  }
}

// A temporary file holding `bytes` (unlinked: gone when closed).
int temp_file(const std::vector<uint8_t>& bytes) {
  char path[] = "/tmp/statecore-run-lookup-XXXXXX";
  const int fd = ::mkstemp(path);
  CHECK(fd >= 0);
  ::unlink(path);
  CHECK_EQ(::write(fd, bytes.data(), bytes.size()), ssize_t(bytes.size()));
  return fd;
}

// Checks every key of a step run() answered against the model, each once.
void check_run(const LookupStep& step, const File& f, const Keys& keys) {
  const size_t n = step.key_count();
  CHECK_EQ(n, keys.text.size());
  std::vector<int64_t> idx(n), rows(n);
  std::vector<int32_t> off(n + 1);
  std::vector<uint8_t> data(step.value_bytes() + 1), valid((n + 7) / 8, 0);
  step.gather_step(idx.data(), rows.data(), off.data(), data.data(), valid.data());
  CHECK_EQ(uint64_t(off[n]), step.value_bytes());
  std::vector<int> seen(n, 0);
  for (size_t i = 0; i < n; ++i) {
    const int64_t k = idx[i];
    ++seen[k];
    auto it = f.model.find(keys.text[k]);
    CHECK_EQ(rows[i] >= 0, it != f.model.end());
    const bool has = (valid[i >> 3] >> (i & 7)) & 1;
    CHECK_EQ(has, it != f.model.end() && !it->second.empty());
    if (has) CHECK_EQ(std::string(data.begin() + off[i], data.begin() + off[i + 1]), it->second);
  }
  for (int c : seen) CHECK_EQ(c, 1);
}

THREADED_TEST(run_answers_every_key_on_the_pool_and_the_calling_thread) {
  // run() over a file on disk: chunks read, opened and searched by the pool's threads and
  // this one, with no barrier; the same answers as the model, the same misses as rounds on
  // one thread, no more than open_bytes open at once (blocks smaller than a chunk), and a
  // second run served by the cache alone; under TSan.
  const File f(60, 5, 1);
  const Keys keys = routed_keys(f, 400, 17);
  const int fd = temp_file(f.bytes);
  FetchPool pool(3);
  uint64_t largest = 0;
  for (const StoredBlockRef& r : f.refs) largest = std::max<uint64_t>(largest, r.raw_length);
  for (uint64_t open_bytes : {uint64_t(1), 4 * largest, uint64_t(1) << 30}) {
    for (FetchPool* p : {static_cast<FetchPool*>(nullptr), &pool}) {
      BlockCache cache_one(1 << 20), cache_run(1 << 20);
      LookupStep one(&cache_one, open_bytes, 0, 1 << 20), step(&cache_run, open_bytes, 0, 1 << 20);
      add_every_key(f, keys, {&one, &step});
      step.set_keys(keys.offsets.data(), keys.data.data());
      const size_t read = run_step(one, f, keys, open_bytes);
      StepFailure failure;
      CHECK(step.run(p, &fd, 1, 3, &failure));
      CHECK_EQ(failure.bad, int64_t(-1));
      check_run(step, f, keys);
      CHECK_EQ(step.counts().blocks_read, uint64_t(read));
      CHECK_EQ(cache_run.stats().misses, cache_one.stats().misses);
      CHECK(step.counts().peak_open_bytes > 0);
      if (open_bytes == 4 * largest) CHECK(step.counts().peak_open_bytes <= open_bytes);
      if (open_bytes == 1) CHECK(step.counts().peak_open_bytes <= 4 * largest);
      LookupStep again(&cache_run, open_bytes, 0, 1 << 20);
      add_every_key(f, keys, {&again});
      again.set_keys(keys.offsets.data(), keys.data.data());
      CHECK(again.run(p, &fd, 1, 3, &failure));
      check_run(again, f, keys);
      CHECK_EQ(again.counts().blocks_read, uint64_t(0));
    }
  }
  ::close(fd);
}

THREADED_TEST(run_with_a_cache_that_refuses_most_blocks_answers_every_key) {
  // A cache of a few blocks: run() opens the blocks it forecasts refused into a reused
  // buffer and searches them there, the others into blocks offered to the cache. Runs after
  // runs answer as the model says; every block kept holds its file's bytes.
  const File f(60, 5, 1);
  const int fd = temp_file(f.bytes);
  FetchPool pool(3);
  uint64_t largest = 0;
  for (const StoredBlockRef& r : f.refs) largest = std::max<uint64_t>(largest, r.raw_length);
  for (uint64_t budget : {uint64_t(0), 5 * largest}) {
    for (FetchPool* p : {static_cast<FetchPool*>(nullptr), &pool}) {
      BlockCache cache(budget);
      for (uint64_t seed = 1; seed <= 6; ++seed) {
        const Keys keys = routed_keys(f, 300, 100 + seed);
        LookupStep step(&cache, 2 * largest, 0, 1 << 20);
        add_every_key(f, keys, {&step});
        step.set_keys(keys.offsets.data(), keys.data.data());
        StepFailure failure;
        CHECK(step.run(p, &fd, 1, 3, &failure));
        check_run(step, f, keys);
      }
      const BlockCacheStats s = cache.stats();
      CHECK(s.used_bytes <= budget);
      if (budget > 0) CHECK(s.blocks > 0);
      CHECK(s.misses > 0);
    }
  }
  ::close(fd);
}

THREADED_TEST(run_reports_a_short_file_and_a_corrupt_block_and_caches_no_bad_block) {
  const File f(60, 5, 1);
  const Keys keys = routed_keys(f, 400, 19);
  FetchPool pool(3);
  {  // a file cut short: a read ends early
    const int fd = temp_file(std::vector<uint8_t>(f.bytes.begin(), f.bytes.begin() + 16));
    BlockCache cache(1 << 20);
    LookupStep step(&cache, 1, 0, 1 << 20);
    add_every_key(f, keys, {&step});
    step.set_keys(keys.offsets.data(), keys.data.data());
    StepFailure failure;
    CHECK(!step.run(&pool, &fd, 1, 3, &failure));
    CHECK_EQ(failure.bad, LookupStep::kReadShort);
    CHECK_EQ(failure.file, size_t(0));
    CHECK(failure.length > 0);
    CHECK(!failure.why.empty());
    ::close(fd);
  }
  // A corrupt block: reported by its number, never cached; opened into a block offered to
  // the cache, or into the reused buffer (a cache that keeps nothing).
  for (uint64_t budget : {uint64_t(1) << 20, uint64_t(0)}) {
    File bad(60, 5, 1);
    bad.bytes[bad.refs[31].offset + 1] ^= 0xFF;
    const int fd = temp_file(bad.bytes);
    BlockCache cache(budget);
    for (int attempt = 0; attempt < 2; ++attempt) {
      LookupStep step(&cache, 1, 0, 1 << 20);
      add_every_key(bad, keys, {&step});
      step.set_keys(keys.offsets.data(), keys.data.data());
      StepFailure failure;
      CHECK(!step.run(&pool, &fd, 1, 3, &failure));
      CHECK_EQ(failure.bad, int64_t(31));
      CHECK_EQ(failure.why, std::string("block checksum mismatch"));
      CHECK(failure.first_block <= 31);
      CHECK(cache.get(1, 31) == nullptr);
    }
    ::close(fd);
  }
}

#ifdef __linux__
// The threads of this process whose name (/proc/self/task/<tid>/comm) is `name`.
size_t threads_named(const std::string& name) {
  size_t n = 0;
  DIR* dir = ::opendir("/proc/self/task");
  if (dir == nullptr) return 0;
  while (const dirent* e = ::readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream comm(std::string("/proc/self/task/") + e->d_name + "/comm");
    std::string line;
    if (std::getline(comm, line) && line == name) ++n;
  }
  ::closedir(dir);
  return n;
}

THREADED_TEST(fetch_pool_threads_are_named) {
  // Named so that top -H, perf and /proc tell them apart from the threads handing out reads.
  const size_t before = threads_named("sc-fetch");
  size_t seen = before;
  {
    FetchPool pool(3);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while ((seen = threads_named("sc-fetch")) < before + 3 &&
           std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  CHECK_EQ(seen, before + 3);
}
#endif

TEST_MAIN()
