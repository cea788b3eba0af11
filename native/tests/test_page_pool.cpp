// Unit tests of the flat engine's page memory (detail/page_pool.h): blocks are distinct, aligned,
// writable and reused; chunks return to the OS once empty (one kept per size class, the others
// spares of any class); a prefault helper feeding spares, and stopping where the loader mapped
// chunks itself; frees from other threads; small pages and the ASan build go to operator new.
// Entry memory (small_alloc): 16-byte classes up to kPoolSmallMaxBytes, realloc across classes
// and into malloc, a chained map of string keys living in the pool. Fixed seeds throughout.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "check.h"
#include "statecore/detail/page_pool.h"
#include "statecore/state_map.h"

using statecore::detail::kPoolChunkBytes;
using statecore::detail::kPoolSmallMaxBytes;
using statecore::detail::page_alloc;
using statecore::detail::page_free;
using statecore::detail::page_pool_stats;
using statecore::detail::PagePrefault;
using statecore::detail::small_alloc;
using statecore::detail::small_free;
using statecore::detail::small_realloc;

TEST(blocks_are_distinct_aligned_and_keep_their_bytes) {
  const bool pooled = page_pool_stats().enabled;
  const size_t in_use = page_pool_stats().blocks_in_use;
  const size_t chunks = page_pool_stats().chunks;
  std::mt19937_64 rng(3);
  std::vector<std::pair<uint8_t*, size_t>> blocks;
  for (int i = 0; i < 600; ++i) {  // two size classes, several chunks each
    const size_t bytes = i % 2 ? 10760 : 16392;
    auto* p = static_cast<uint8_t*>(page_alloc(bytes));
    CHECK(reinterpret_cast<uintptr_t>(p) % 16 == 0);
    std::memset(p, i & 0xff, bytes);
    blocks.emplace_back(p, bytes);
  }
  if (pooled) {
    CHECK_EQ(page_pool_stats().blocks_in_use, in_use + 600);
    CHECK(page_pool_stats().chunks >= 600 * 10760 / kPoolChunkBytes);
  }
  // No two blocks overlap, and each still holds its own fill.
  std::vector<std::pair<uint8_t*, size_t>> sorted = blocks;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 1; i < sorted.size(); ++i)
    CHECK(sorted[i - 1].first + sorted[i - 1].second <= sorted[i].first);
  for (size_t i = 0; i < blocks.size(); ++i) {
    const uint8_t want = static_cast<uint8_t>(i & 0xff);
    CHECK(blocks[i].first[0] == want && blocks[i].first[blocks[i].second - 1] == want);
  }
  // Freed in random order; freed blocks are handed out again.
  std::shuffle(blocks.begin(), blocks.end(), rng);
  std::set<uint8_t*> freed;
  for (size_t i = 0; i < 300; ++i) {
    page_free(blocks[i].first);
    if (blocks[i].second == 16392) freed.insert(blocks[i].first);
  }
  if (pooled && !freed.empty()) CHECK(freed.count(static_cast<uint8_t*>(page_alloc(16392))) == 1);
  for (size_t i = 300; i < blocks.size(); ++i) page_free(blocks[i].first);
  if (pooled) {
    CHECK_EQ(page_pool_stats().blocks_in_use, in_use + 1);  // the one re-allocated above
    // Empty chunks went back to the OS but one per size class (two classes here), besides the
    // chunk of the block re-allocated above.
    CHECK(page_pool_stats().chunks <= chunks + 3);
  }
  page_free(nullptr);  // a no-op
}

// Chunks emptied beyond the one kept per class become spares that another size class reuses:
// the same 2 MiB mappings, their blocks writable again (MADV_FREE memory reads back as either
// its old bytes or zeros until written).
TEST(empty_chunks_are_spares_for_any_class) {
  if (!page_pool_stats().enabled) return;
  std::vector<uint8_t*> blocks;
  for (int i = 0; i < 3000; ++i) {  // 12 chunks of 254 8256-byte blocks
    auto* p = static_cast<uint8_t*>(page_alloc(8256));
    std::memset(p, 0x5A, 8256);
    blocks.push_back(p);
  }
  std::set<uintptr_t> bases;
  for (uint8_t* p : blocks)
    bases.insert(reinterpret_cast<uintptr_t>(p) & ~(uintptr_t(kPoolChunkBytes) - 1));
  const size_t spares = page_pool_stats().spare_chunks;  // those left after the allocations
  for (uint8_t* p : blocks) page_free(p);
  const size_t freed = page_pool_stats().spare_chunks;
  CHECK(freed >= spares + bases.size() - 2);  // one kept for the class, maybe one partly used
  // Another class takes the spares first, newest first, before mapping new chunks.
  std::vector<uint8_t*> other;
  size_t reused = 0;
  for (int i = 0; i < 1000; ++i) {
    auto* p = static_cast<uint8_t*>(page_alloc(20032));
    std::memset(p, i & 0xff, 20032);
    other.push_back(p);
    reused += bases.count(reinterpret_cast<uintptr_t>(p) & ~(uintptr_t(kPoolChunkBytes) - 1));
  }
  CHECK(reused >= 8 * (kPoolChunkBytes / 20032));
  for (size_t i = 0; i < other.size(); ++i)
    CHECK(other[i][0] == (i & 0xff) && other[i][20031] == (i & 0xff));
  for (uint8_t* p : other) page_free(p);
}

// A prefault helper hands faulted-in chunks to the pool while the owner allocates from it: the
// owner's blocks stay distinct and keep their bytes, the helper stops at what it was asked for
// less the spares already kept, and destruction waits for it. Nothing with the pool off.
TEST(prefault_helper_feeds_spares_while_the_owner_allocates) {
  const size_t in_use = page_pool_stats().blocks_in_use;
  std::vector<uint8_t*> blocks;
  size_t helped = 0;
  {
    const size_t spares = page_pool_stats().spare_chunks;
    PagePrefault helper((spares + 6) * kPoolChunkBytes);
    for (int i = 0; i < 1500; ++i) {  // about 6 chunks of 8256-byte blocks
      auto* p = static_cast<uint8_t*>(page_alloc(8256));
      std::memset(p, i & 0xff, 8256);
      blocks.push_back(p);
    }
    helped = helper.chunks();
    CHECK(helped <= 6);
  }
  std::set<uint8_t*> distinct(blocks.begin(), blocks.end());
  CHECK_EQ(distinct.size(), blocks.size());
  for (size_t i = 0; i < blocks.size(); ++i)
    CHECK(blocks[i][0] == (i & 0xff) && blocks[i][8255] == (i & 0xff));
  for (uint8_t* p : blocks) page_free(p);
  CHECK_EQ(page_pool_stats().blocks_in_use, in_use);
  if (!page_pool_stats().enabled) CHECK_EQ(helped, size_t{0});
  // Asked for no more than the spares kept: no helper at all.
  PagePrefault none(page_pool_stats().spare_chunks * kPoolChunkBytes);
  CHECK_EQ(none.chunks(), size_t{0});
}

// A loader that runs ahead of the helper maps fresh chunks itself; each counts against what the
// helper was asked for, so the helper stops instead of faulting in chunks nobody takes. Here the
// owner takes every spare and maps the rest before the helper has populated more than a chunk
// or two (it only maps, never writes): at most the chunk the helper was populating is left over.
TEST(prefault_helper_stops_when_the_loader_maps_the_chunks_itself) {
  if (!page_pool_stats().enabled) return;
  const size_t spares = page_pool_stats().spare_chunks;
  const size_t asked = 8;
  std::vector<void*> blocks;
  size_t helped = 0;
  {
    PagePrefault helper((spares + asked) * kPoolChunkBytes);
    // One size class; blocks for the spares, the chunks asked for and two more (its class may
    // keep an empty chunk of its own).
    const size_t per_chunk = kPoolChunkBytes / 8256;
    for (size_t i = 0; i < (spares + asked + 2) * per_chunk; ++i)
      blocks.push_back(page_alloc(8256));
    while (!helper.finished()) std::this_thread::yield();
    helped = helper.chunks();
  }
  CHECK(helped <= asked);
  CHECK(page_pool_stats().spare_chunks <= 1);
  for (void* p : blocks) page_free(p);
}

TEST(small_blocks_and_disabled_pool_use_operator_new) {
  const size_t in_use = page_pool_stats().blocks_in_use;
  void* small = page_alloc(100);
  CHECK_EQ(page_pool_stats().blocks_in_use, in_use);
  std::memset(small, 1, 100);
  page_free(small);
#if defined(__SANITIZE_ADDRESS__)
  CHECK(!page_pool_stats().enabled);
#endif
}

TEST(frees_from_other_threads) {
  const size_t in_use = page_pool_stats().blocks_in_use;
  std::vector<void*> blocks;
  for (int i = 0; i < 400; ++i) blocks.push_back(page_alloc(12000));
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&blocks, t] {
      for (size_t i = static_cast<size_t>(t); i < blocks.size(); i += 4) page_free(blocks[i]);
    });
  }
  // The owner allocates and frees meanwhile, as a map copying pages does.
  for (int i = 0; i < 200; ++i) page_free(page_alloc(12000));
  for (auto& th : threads) th.join();
  CHECK_EQ(page_pool_stats().blocks_in_use, in_use);
}

// A flat map large enough for full pages uses the pool, and gives every block back.
TEST(a_large_flat_map_lives_in_the_pool) {
  const size_t in_use = page_pool_stats().blocks_in_use;
  {
    statecore::StateMap m;
    for (uint64_t i = 0; i < 200000; ++i) {
      uint8_t k[10] = {1};
      for (int b = 0; b < 8; ++b) k[1 + b] = static_cast<uint8_t>(i >> (8 * b));
      uint8_t* v = m.put(k, sizeof k, 8);
      std::memcpy(v, &i, 8);
    }
    auto snap = m.snapshot();
    for (uint64_t i = 0; i < 200000; i += 3) {  // copy-on-write of shared pages
      uint8_t k[10] = {1};
      for (int b = 0; b < 8; ++b) k[1 + b] = static_cast<uint8_t>(i >> (8 * b));
      m.put(k, sizeof k, 8)[0] = 0xAB;
    }
    if (page_pool_stats().enabled && m.is_flat())
      CHECK(page_pool_stats().blocks_in_use > in_use + 100);
    snap->release();
  }
  CHECK_EQ(page_pool_stats().blocks_in_use, in_use);
}

TEST(entry_blocks_are_distinct_aligned_and_keep_their_bytes) {
  const bool pooled = page_pool_stats().enabled;
  const size_t in_use = page_pool_stats().blocks_in_use;
  std::mt19937_64 rng(5);
  std::vector<std::pair<uint8_t*, size_t>> blocks;
  for (int i = 0; i < 20000; ++i) {
    const size_t bytes = 1 + rng() % (kPoolSmallMaxBytes + 200);  // some go to malloc
    auto* p = static_cast<uint8_t*>(small_alloc(bytes));
    CHECK(reinterpret_cast<uintptr_t>(p) % 16 == 0);
    std::memset(p, i & 0xff, bytes);
    blocks.emplace_back(p, bytes);
  }
  size_t small = 0;
  for (const auto& b : blocks) small += b.second <= kPoolSmallMaxBytes;
  if (pooled) CHECK_EQ(page_pool_stats().blocks_in_use, in_use + small);
  std::vector<std::pair<uint8_t*, size_t>> sorted = blocks;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 1; i < sorted.size(); ++i)
    CHECK(sorted[i - 1].first + sorted[i - 1].second <= sorted[i].first);
  // Grown and shrunk, within a class, across classes and past the small limit: the kept prefix
  // survives every move.
  for (size_t i = 0; i < blocks.size(); ++i) {
    const size_t to = 1 + rng() % (2 * kPoolSmallMaxBytes);
    const size_t keep = std::min(blocks[i].second, to);
    auto* q = static_cast<uint8_t*>(small_realloc(blocks[i].first, blocks[i].second, to));
    CHECK(q != nullptr && reinterpret_cast<uintptr_t>(q) % 16 == 0);
    const uint8_t want = static_cast<uint8_t>(i & 0xff);
    CHECK(q[0] == want && q[keep - 1] == want);
    std::memset(q, want, to);
    blocks[i] = {q, to};
  }
  std::shuffle(blocks.begin(), blocks.end(), rng);
  for (const auto& b : blocks) small_free(b.first);
  small_free(nullptr);  // a no-op
  CHECK_EQ(page_pool_stats().blocks_in_use, in_use);
}

TEST(entry_blocks_freed_from_other_threads) {
  const size_t in_use = page_pool_stats().blocks_in_use;
  std::vector<void*> blocks;
  for (int i = 0; i < 40000; ++i) blocks.push_back(small_alloc(40 + (i % 5) * 16));
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&blocks, t] {
      for (size_t i = static_cast<size_t>(t); i < blocks.size(); i += 4) small_free(blocks[i]);
    });
  }
  for (int i = 0; i < 20000; ++i) small_free(small_realloc(small_alloc(48), 48, 200));
  for (auto& th : threads) th.join();
  CHECK_EQ(page_pool_stats().blocks_in_use, in_use);
}

// The chained engine (variable-length keys): entries and full bucket pages in the pool, a
// snapshot's copies too, and every block given back.
TEST(a_chained_map_of_string_keys_lives_in_the_pool) {
  const size_t in_use = page_pool_stats().blocks_in_use;
  {
    statecore::StateMap m(nullptr, statecore::MapEngine::Chained);
    auto key = [](uint64_t i) {
      std::string k(1 + 8 + i % 24, 'k');
      for (int b = 0; b < 8; ++b) k[1 + b] = static_cast<char>(i >> (8 * b));
      return k;
    };
    for (uint64_t i = 0; i < 100000; ++i) {
      const std::string k = key(i);
      std::memcpy(m.put(reinterpret_cast<const uint8_t*>(k.data()), k.size(), 8), &i, 8);
    }
    auto snap = m.snapshot();
    for (uint64_t i = 0; i < 100000; i += 3) {
      const std::string k = key(i);
      m.put(reinterpret_cast<const uint8_t*>(k.data()), k.size(), 8)[0] = 0xAB;
    }
    if (page_pool_stats().enabled) CHECK(page_pool_stats().blocks_in_use > in_use + 100000);
    for (uint64_t i = 1; i < 100000; i += 3) {
      const std::string k = key(i);
      statecore::ByteView v;
      CHECK(m.get(reinterpret_cast<const uint8_t*>(k.data()), k.size(), &v));
      uint64_t x;
      std::memcpy(&x, v.data, 8);
      CHECK_EQ(x, i);
    }
    snap->release();
  }
  CHECK_EQ(page_pool_stats().blocks_in_use, in_use);
}

TEST_MAIN()
