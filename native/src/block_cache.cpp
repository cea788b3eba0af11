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

BlockRef BlockCache::get_locked(const Key& key, uint64_t hash) {
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

BlockRef BlockCache::get(int64_t file, int64_t block) {
  const Key key{file, block};
  const uint64_t hash = KeyHash{}(key);
  std::lock_guard<std::mutex> lock(mu_);
  return get_locked(key, hash);
}

void BlockCache::get_many(const int64_t* files, const int64_t* blocks, size_t n, BlockRef* out,
                          const uint64_t* sizes, uint8_t* admit) {
  std::vector<uint64_t> hashes(n);
  for (size_t i = 0; i < n; ++i) hashes[i] = KeyHash{}(Key{files[i], blocks[i]});
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < n; ++i) out[i] = get_locked(Key{files[i], blocks[i]}, hashes[i]);
  if (sizes == nullptr || admit == nullptr) return;
  // The forecast, after the gets (a hit moves its block off the least recently used end); a
  // block forecast kept that fits takes its room from the blocks after it.
  uint64_t used = stats_.used_bytes;
  for (size_t i = 0; i < n; ++i) {
    admit[i] = !out[i] && sizes[i] <= budget_ && admits(hashes[i], sizes[i], used);
    if (admit[i] && used + sizes[i] <= budget_) used += sizes[i];
  }
}

bool BlockCache::admits(uint64_t hash, uint64_t size, uint64_t used) const {
  return used + size <= budget_ || lru_.empty() ||
         frequency(hash) > frequency(KeyHash{}(lru_.back().key));
}

void BlockCache::put_locked(const Key& key, uint64_t hash, BlockRef b, std::list<Entry>* evicted) {
  if (!b || map_.count(key) || b->size > budget_) return;
  if (!admits(hash, b->size, stats_.used_bytes)) {
    ++stats_.rejected;
    return;
  }
  evict_for(b->size, evicted);
  stats_.used_bytes += b->size;
  lru_.push_front(Entry{key, std::move(b)});
  map_.emplace(key, lru_.begin());
  stats_.blocks = map_.size();
}

void BlockCache::put(int64_t file, int64_t block, BlockRef b) {
  if (!b) return;
  const Key key{file, block};
  const uint64_t hash = KeyHash{}(key);
  // The evicted blocks are released after the lock: freeing a payload can take a while.
  std::list<Entry> evicted;
  std::lock_guard<std::mutex> lock(mu_);
  put_locked(key, hash, std::move(b), &evicted);
}

void BlockCache::put_many(const int64_t* files, const int64_t* blocks, const BlockRef* bs,
                          size_t n) {
  std::vector<uint64_t> hashes(n);
  for (size_t i = 0; i < n; ++i) hashes[i] = KeyHash{}(Key{files[i], blocks[i]});
  std::list<Entry> evicted;  // released after the lock, as in put()
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < n; ++i) put_locked(Key{files[i], blocks[i]}, hashes[i], bs[i], &evicted);
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

void BlockCache::retain_files(const int64_t* files, size_t n) {
  const std::vector<int64_t> keep = [&] {
    std::vector<int64_t> v(files, files + n);
    std::sort(v.begin(), v.end());
    return v;
  }();
  std::list<Entry> dropped;  // released after the lock
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = lru_.begin(); it != lru_.end();) {
    auto next = std::next(it);
    if (!std::binary_search(keep.begin(), keep.end(), it->key.file)) {
      stats_.used_bytes -= it->block->size;
      map_.erase(it->key);
      dropped.splice(dropped.end(), lru_, it);
    }
    it = next;
  }
  stats_.blocks = map_.size();
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
