#include "statecore/block_cache.h"

#include <utility>

#include "statecore/hash.h"

namespace statecore {

size_t BlockCache::KeyHash::operator()(const Key& k) const noexcept {
  return static_cast<size_t>(
      xxh64_u64(static_cast<uint64_t>(k.block), static_cast<uint64_t>(k.file)));
}

BlockCache::BlockCache(uint64_t budget_bytes) : budget_(budget_bytes) {}

BlockRef BlockCache::get(int64_t file, int64_t block) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = map_.find(Key{file, block});
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
