// BlockCache (block_cache.h): the byte budget, least-recently-used eviction order, a block
// larger than the budget, hit and miss counts, and concurrent gets and puts (run under TSan).
#include <cstdlib>
#include <thread>
#include <vector>

#include "check.h"
#include "statecore/block_cache.h"

using namespace statecore;

namespace {

BlockRef block_of(size_t size, uint8_t fill) {
  auto b = std::make_shared<OpenedBlock>();
  b->bytes.reset(new uint8_t[size ? size : 1]);
  for (size_t i = 0; i < size; ++i) b->bytes[i] = fill;
  b->size = size;
  return b;
}

}  // namespace

TEST(counts_hits_and_misses) {
  BlockCache cache(100);
  CHECK(cache.get(1, 0) == nullptr);
  cache.put(1, 0, block_of(10, 7));
  BlockRef got = cache.get(1, 0);
  CHECK(got != nullptr);
  CHECK_EQ(int(got->bytes[9]), 7);
  CHECK(cache.get(2, 0) == nullptr);  // another file's block 0
  const BlockCacheStats s = cache.stats();
  CHECK_EQ(s.hits, int64_t(1));
  CHECK_EQ(s.misses, int64_t(2));
  CHECK_EQ(s.used_bytes, uint64_t(10));
  CHECK_EQ(s.blocks, size_t(1));
}

TEST(evicts_least_recently_used_first) {
  BlockCache cache(30);
  cache.put(1, 0, block_of(10, 0));
  cache.put(1, 1, block_of(10, 1));
  cache.put(1, 2, block_of(10, 2));
  CHECK(cache.get(1, 0) != nullptr);  // now 1 is the least recently used
  cache.put(1, 3, block_of(10, 3));
  CHECK(cache.get(1, 1) == nullptr);
  CHECK(cache.get(1, 0) != nullptr);
  CHECK(cache.get(1, 2) != nullptr);
  CHECK(cache.get(1, 3) != nullptr);
  cache.put(1, 4, block_of(25, 4));  // needs three of the four gone
  CHECK_EQ(cache.stats().blocks, size_t(1));
  CHECK_EQ(cache.stats().used_bytes, uint64_t(25));
  CHECK(cache.get(1, 4) != nullptr);
}

TEST(keeps_no_block_larger_than_the_budget) {
  BlockCache cache(16);
  cache.put(1, 0, block_of(8, 0));
  cache.put(1, 1, block_of(17, 1));
  CHECK(cache.get(1, 1) == nullptr);
  CHECK(cache.get(1, 0) != nullptr);  // nothing was evicted for it
  CHECK_EQ(cache.stats().used_bytes, uint64_t(8));
  BlockCache none(0);
  none.put(1, 0, block_of(1, 0));
  CHECK_EQ(none.stats().blocks, size_t(0));
}

TEST(a_second_put_keeps_the_first_block) {
  BlockCache cache(100);
  cache.put(1, 0, block_of(10, 1));
  cache.put(1, 0, block_of(20, 2));
  CHECK_EQ(int(cache.get(1, 0)->bytes[0]), 1);
  CHECK_EQ(cache.stats().used_bytes, uint64_t(10));
}

TEST(an_evicted_block_stays_valid_while_referenced) {
  BlockCache cache(10);
  cache.put(1, 0, block_of(10, 5));
  BlockRef held = cache.get(1, 0);
  cache.put(1, 1, block_of(10, 6));
  CHECK(cache.get(1, 0) == nullptr);
  CHECK_EQ(int(held->bytes[9]), 5);
  cache.clear();
  CHECK_EQ(cache.stats().used_bytes, uint64_t(0));
  CHECK(cache.get(1, 1) == nullptr);
}

TEST(a_smaller_budget_evicts_least_recently_used_first) {
  BlockCache cache(40);
  for (int64_t b = 0; b < 4; ++b) cache.put(1, b, block_of(10, static_cast<uint8_t>(b)));
  CHECK(cache.get(1, 0) != nullptr);
  cache.set_budget(20);
  CHECK_EQ(cache.budget(), uint64_t(20));
  CHECK_EQ(cache.stats().used_bytes, uint64_t(20));
  CHECK(cache.get(1, 0) != nullptr);
  CHECK(cache.get(1, 3) != nullptr);
  CHECK(cache.get(1, 1) == nullptr);
  CHECK(cache.get(1, 2) == nullptr);
}

TEST(concurrent_gets_and_puts_keep_the_budget) {
  BlockCache cache(64 * 8);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&cache, t] {
      for (int i = 0; i < 2000; ++i) {
        const int64_t b = (i * 7 + t) % 200;
        BlockRef got = cache.get(t % 2, b);
        if (got) {
          if (got->bytes[0] != static_cast<uint8_t>(b)) std::abort();
        } else {
          cache.put(t % 2, b, block_of(8 + b % 16, static_cast<uint8_t>(b)));
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  const BlockCacheStats s = cache.stats();
  CHECK(s.used_bytes <= 64 * 8);
  CHECK_EQ(s.hits + s.misses, int64_t(8000));
  uint64_t sum = 0;
  for (int f = 0; f < 2; ++f)
    for (int64_t b = 0; b < 200; ++b) {
      BlockRef got = cache.get(f, b);
      if (got) sum += got->size;
    }
  CHECK_EQ(sum, s.used_bytes);
}

TEST_MAIN()
