// The decoded-block cache of the run lookups of the tiered mode (statecore.checkpoint.lookup):
// opened block payloads (docs/formats.md "Block payload", checked and decompressed once) keyed
// by (file id, block number), least recently used first out within a byte budget, after
// RocksDB's LRUCache (a block larger than the budget is never kept). Thread-safe: one mutex,
// held for a map probe and a list splice, never while a block is read or opened.
#pragma once
#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <unordered_map>

namespace statecore {

// One checked, decompressed block payload of `size` bytes (the block table's raw_length) in a
// buffer of its own, immutable once opened. Shared: the cache and every lookup searching it
// hold a reference, so an eviction never frees a block a search is reading.
struct OpenedBlock {
  std::unique_ptr<uint8_t[]> bytes;
  size_t size = 0;
};
using BlockRef = std::shared_ptr<const OpenedBlock>;

struct BlockCacheStats {
  int64_t hits = 0;    // get() calls that found the block
  int64_t misses = 0;  // get() calls that did not
  uint64_t used_bytes = 0;
  size_t blocks = 0;
};

class BlockCache {
 public:
  // `budget_bytes`: the most payload bytes kept (each block counted by its `size`).
  explicit BlockCache(uint64_t budget_bytes);
  BlockCache(const BlockCache&) = delete;
  BlockCache& operator=(const BlockCache&) = delete;

  // The block (now the most recently used), or null; counted as a hit or a miss.
  BlockRef get(int64_t file, int64_t block);
  // Keeps `b` as block (file, block), evicting the least recently used ones to stay within
  // the budget; a block larger than the budget, or one already kept, is not (re)placed.
  void put(int64_t file, int64_t block, BlockRef b);
  BlockCacheStats stats() const;
  uint64_t budget() const;
  // A new budget, the least recently used blocks evicted down to it.
  void set_budget(uint64_t budget_bytes);
  // Drops every block (references held elsewhere stay valid); counters are kept.
  void clear();

 private:
  struct Key {
    int64_t file;
    int64_t block;
    bool operator==(const Key& o) const { return file == o.file && block == o.block; }
  };
  struct KeyHash {
    size_t operator()(const Key& k) const noexcept;
  };
  struct Entry {
    Key key;
    BlockRef block;
  };
  // Evicts least recently used blocks into *out until `size` more bytes fit. Holds mu_.
  void evict_for(uint64_t size, std::list<Entry>* out);
  uint64_t budget_;
  mutable std::mutex mu_;
  std::list<Entry> lru_;  // front: most recently used
  std::unordered_map<Key, std::list<Entry>::iterator, KeyHash> map_;
  BlockCacheStats stats_;
};

}  // namespace statecore
