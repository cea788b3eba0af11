#include "statecore/block_cache.h"

#include <algorithm>
#include <utility>

#include "statecore/hash.h"

namespace statecore {

size_t BlockCache::KeyHash::operator()(const Key& k) const noexcept {
  return static_cast<size_t>(
      xxh64_u64(static_cast<uint64_t>(k.block), static_cast<uint64_t>(k.file)));
}

namespace {

// Sketch size: about eight counters per 4 KiB of budget (the tiered mode's block size), at least
// 4096; halved after ten records per counter group of a block of that size (Caffeine samples
// ten times the cache's capacity).
constexpr uint64_t kCountedBlockBytes = 4096;
constexpr uint8_t kMaxCount = 15;

size_t sketch_size(uint64_t budget_bytes) {
  const uint64_t want = std::max<uint64_t>(4096, 8 * (budget_bytes / kCountedBlockBytes));
  size_t n = 4096;
  while (n < want && n < (size_t{1} << 26)) n <<= 1;
  return n;
}

// The i-th of the 4 counters of `hash` (double hashing over a table of `mask + 1`).
size_t slot(uint64_t hash, int i, size_t mask) {
  const uint64_t step = (hash >> 32) | 1;
  return static_cast<size_t>(hash + static_cast<uint64_t>(i) * step) & mask;
}

}  // namespace

BlockCache::BlockCache(uint64_t budget_bytes)
    : budget_(budget_bytes), counts_(sketch_size(budget_bytes), 0) {
  sample_ = 10 * std::max<uint64_t>(1, budget_bytes / kCountedBlockBytes);
}

void BlockCache::record(uint64_t hash) {
  const size_t mask = counts_.size() - 1;
  for (int i = 0; i < 4; ++i) {
    uint8_t& c = counts_[slot(hash, i, mask)];
    if (c < kMaxCount) ++c;
  }
  if (++records_ >= sample_) {  // age: halve every count
    for (uint8_t& c : counts_) c >>= 1;
    records_ = 0;
  }
}

uint32_t BlockCache::frequency(uint64_t hash) const {
  const size_t mask = counts_.size() - 1;
  uint32_t f = kMaxCount;
  for (int i = 0; i < 4; ++i) f = std::min<uint32_t>(f, counts_[slot(hash, i, mask)]);
  return f;
}

BlockRef BlockCache::get(int64_t file, int64_t block) {
  const Key key{file, block};
  const uint64_t hash = KeyHash{}(key);
  std::lock_guard<std::mutex> lock(mu_);
  record(hash);
  auto it = map_.find(key);
  if (it == map_.end()) {
    ++stats_.misses;
    return nullptr;
  }
  ++stats_.hits;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->block;
}

void BlockCache::put(int64_t file, int64_t block, BlockRef b) {
  if (!b) return;
  // The evicted blocks are released after the lock: freeing a payload can take a while.
  std::list<Entry> evicted;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const Key key{file, block};
    if (map_.count(key) || b->size > budget_) return;
    if (stats_.used_bytes + b->size > budget_ && !lru_.empty() &&
        frequency(KeyHash{}(key)) <= frequency(KeyHash{}(lru_.back().key))) {
      ++stats_.rejected;
      return;
    }
    evict_for(b->size, &evicted);
    stats_.used_bytes += b->size;
    lru_.push_front(Entry{key, std::move(b)});
    map_.emplace(key, lru_.begin());
    stats_.blocks = map_.size();
  }
}

void BlockCache::evict_for(uint64_t size, std::list<Entry>* out) {
  while (!lru_.empty() && stats_.used_bytes + size > budget_) {
    auto last = std::prev(lru_.end());
    stats_.used_bytes -= last->block->size;
    map_.erase(last->key);
    out->splice(out->begin(), lru_, last);
  }
}

uint64_t BlockCache::budget() const {
  std::lock_guard<std::mutex> lock(mu_);
  return budget_;
}

void BlockCache::set_budget(uint64_t budget_bytes) {
  std::list<Entry> evicted;
  std::lock_guard<std::mutex> lock(mu_);
  budget_ = budget_bytes;
  evict_for(0, &evicted);
}

BlockCacheStats BlockCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  BlockCacheStats s = stats_;
  s.blocks = map_.size();
  return s;
}

void BlockCache::clear() {
  std::list<Entry> dropped;
  std::lock_guard<std::mutex> lock(mu_);
  map_.clear();
  dropped.swap(lru_);
  stats_.used_bytes = 0;
  stats_.blocks = 0;
}

}  // namespace statecore
