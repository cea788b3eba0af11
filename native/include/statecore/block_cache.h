// The decoded-block cache of the run lookups of the tiered mode (statecore.checkpoint.lookup):
// opened block payloads (docs/formats.md "Block payload", checked and decompressed once) keyed
// by (file id, block number) within a byte budget (a block larger than the budget is never
// kept). Thread-safe: one mutex, held for a map probe, a list splice and a few counter updates,
// never while a block is read or opened.
//
// Replacement is least recently used first, after RocksDB's LRUCache; admission follows TinyLFU
// (Einziger, Friedman and Manes, "TinyLFU: A Highly Efficient Cache Admission Policy", 2017;
// Caffeine's FrequencySketch). Every get() records its block in a count-min sketch of small
// saturating counters, halved every `sample` records so that old popularity fades. A put()
// that needs room is admitted only when its block was asked for more often than the least
// recently used block it would evict first. Why: a batch of uniform keys over a large run opens
// many more blocks than the cache holds, in key order, batch after batch; plain LRU then evicts
// every block before the next batch asks for it again (a scan), and keeps none. With the
// admission test the cache keeps a stable part of the run instead, and blocks asked for often
// (Zipf's hot keys) still replace rarely asked ones.
#pragma once
#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

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
  int64_t hits = 0;      // get() calls that found the block
  int64_t misses = 0;    // get() calls that did not
  int64_t rejected = 0;  // put() calls the admission test refused
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
  // Keeps `b` as block (file, block) when it fits, or when get() asked for it more often than
  // for the least recently used block (TinyLFU admission, above), evicting least recently used
  // blocks to stay within the budget; a block larger than the budget, or one already kept, is
  // not (re)placed.
  void put(int64_t file, int64_t block, BlockRef b);
  BlockCacheStats stats() const;
  uint64_t budget() const;
  // A new budget, the least recently used blocks evicted down to it.
  void set_budget(uint64_t budget_bytes);
  // Drops every block (references held elsewhere stay valid); counters are kept.
  void clear();
  // Drops the blocks of every file not among files[0, n) (references held elsewhere stay
  // valid); counters and the sketch are kept. Why: after a compaction the tiered mode attaches
  // a version whose runs replace the cached ones; their blocks, never asked for again, would
  // keep high sketch counts and make the admission test refuse the new runs' blocks until
  // ageing fades them.
  void retain_files(const int64_t* files, size_t n);

  // get() of keys (files[i], blocks[i]) for i < n into out[i], under one lock (one acquisition
  // per round of a batch instead of one per block): the same hits, misses and sketch records
  // as n calls of get() in that order. With `sizes` (each block's size) and `admit`: also,
  // for each block not found, whether a put() of the blocks not found, in that order, would
  // likely keep it (admit[i] = 1; 0 for a block found): it fits the room left (the budget less
  // the bytes kept and the earlier blocks' sizes forecast kept), or the admission test would
  // take it against the least recently used block after the gets. A forecast, which put() may
  // overrule (the cache changes in between). Why: a lookup opens the blocks the cache would
  // refuse (most of them, for uniform keys over a large run) into a reused buffer, instead of
  // a fresh allocation freed at once.
  void get_many(const int64_t* files, const int64_t* blocks, size_t n, BlockRef* out,
                const uint64_t* sizes = nullptr, uint8_t* admit = nullptr);
  // put() of (files[i], blocks[i], bs[i]) for i < n, in that order, under one lock.
  void put_many(const int64_t* files, const int64_t* blocks, const BlockRef* bs, size_t n);

 private:
  struct Key {
    int64_t file;
    int64_t block;
    bool operator==(const Key& o) const { return file == o.file && block == o.block; }
  };
  struct KeyHash {
    size_t operator()(const Key& k) const noexcept;
  };
  // Count-min sketch of 4 saturating 4-bit counts (one byte each) per key, halved every
  // `sample_` records.
  void record(uint64_t hash);
  uint32_t frequency(uint64_t hash) const;
  struct Entry {
    Key key;
    BlockRef block;
  };
  // Evicts least recently used blocks into *out until `size` more bytes fit. Holds mu_.
  void evict_for(uint64_t size, std::list<Entry>* out);
  // The admission test (above) of a block of `size` bytes whose key hashes to `hash` into a
  // cache holding `used` bytes: it fits, or there is no victim, or it was asked for more often
  // than the least recently used block. Holds mu_.
  bool admits(uint64_t hash, uint64_t size, uint64_t used) const;
  // get() and put() with mu_ held and the key's hash given.
  BlockRef get_locked(const Key& key, uint64_t hash);
  void put_locked(const Key& key, uint64_t hash, BlockRef b, std::list<Entry>* evicted);
  uint64_t budget_;
  mutable std::mutex mu_;
  std::list<Entry> lru_;  // front: most recently used
  std::unordered_map<Key, std::list<Entry>::iterator, KeyHash> map_;
  std::vector<uint8_t> counts_;  // a power of two of them
  uint64_t records_ = 0;
  uint64_t sample_ = 0;
  BlockCacheStats stats_;
};

}  // namespace statecore
