// One step of a batch of point lookups in the runs of a checkpoint version (the tiered mode's
// statecore.checkpoint.lookup), with per-block work all native: the keys a step routed to
// candidate blocks (run_route.h) are grouped by block; the blocks are taken in rounds of at
// most `open_bytes` decoded bytes; per round the blocks in the BlockCache are pinned, the
// missing ones planned as coalesced read ranges (one positional read each, after RocksDB's and
// ForSt's coalesced MultiGet reads), each range's bytes opened (XXH64, LZ4, payload and last
// key checked: payload_lookup.h) into the cache, and the round's keys searched in place (those
// of an opened block by the thread that opened it, set_keys). The caller does per read range at
// most: the read itself.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "statecore/block_cache.h"
#include "statecore/block_codec.h"
#include "statecore/fetch_pool.h"

namespace statecore {

// One format-6 data file's blocks as a lookup sees them (the caller keeps the arrays alive):
// the block table (`blocks[b]`, offsets from the start of the file), the footer's last key of
// every block (block b's is `key_data[key_offsets[b], key_offsets[b + 1])`), whether its
// payloads carry tombstone validity (incremental runs), and its id in the BlockCache.
struct RunBlockTable {
  int64_t file_id = 0;
  bool has_validity = false;
  const StoredBlockRef* blocks = nullptr;
  size_t block_count = 0;
  const int64_t* key_offsets = nullptr;
  const uint8_t* key_data = nullptr;
};

// Opens block `b` of `table` from `data[0, size)`, the file's bytes from offset `base`:
// bounds, XXH64, LZ4, payload structure and the last key against the footer's. Null and the
// reason in *why for a bad block. Thread-safe.
BlockRef open_table_block(const RunBlockTable& table, int64_t b, const uint8_t* data, size_t size,
                          uint64_t base, std::string* why);

// One read of a round: `length` bytes at file offset `offset` of the round's file `file` (its
// index in add() order), holding the round's missing blocks [first, first + count) of
// LookupStep::missing().
struct ReadRange {
  size_t file = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  size_t first = 0;
  size_t count = 0;
};

// Rounds live in one of two slots (0 and 1), so that a caller can read and open the next
// round's blocks (in slot 1 - s) on other threads while it searches the current round's keys
// (slot s): every call below names its slot, 0 by default. Planning a round (next_round) is
// the caller's thread's alone; the blocks a slot pins stay valid until that slot is planned
// again.
class LookupStep {
 public:
  // `open_bytes` >= 1: the most decoded bytes one round holds (a larger block alone);
  // `gap_bytes`, `max_read_bytes`: missing blocks of one file at most `gap_bytes` apart are
  // read together, up to `max_read_bytes` a read (or one block).
  LookupStep(BlockCache* cache, uint64_t open_bytes, uint64_t gap_bytes, uint64_t max_read_bytes);

  // Keys keys[i] (caller's key indices) routed to blocks[i] of `table` (each < block_count:
  // the caller checks). Each file once per step, before the first round.
  void add(const RunBlockTable* table, const int64_t* keys, const int64_t* blocks, size_t n);

  // The keys (key index k is `key_data[key_offsets[k], key_offsets[k + 1])`, every index
  // add() got among them; the arrays outlive the step) that open_range searches each block it
  // opens for, on the thread that opened it: the block is still in that core's cache there,
  // and the searches of a round's missing blocks run in parallel instead of on the caller's
  // thread. search() must then get the same keys. Before the first round.
  void set_keys(const int32_t* key_offsets, const uint8_t* key_data);

  // Unpins the round `slot` held and plans the step's next round into it: false when none is
  // left. Probes the cache for each of the round's blocks (pinning the hits; one lock for
  // all) and plans the missing ones as reads. Not thread-safe: no read of `slot` may be in
  // flight.
  bool next_round(size_t slot = 0);
  const std::vector<ReadRange>& ranges(size_t slot = 0) const { return rounds_[slot].ranges; }
  // The round's missing blocks: (file index, block number).
  const std::vector<std::pair<size_t, int64_t>>& missing(size_t slot = 0) const {
    return rounds_[slot].missing;
  }
  uint64_t round_bytes(size_t slot = 0) const { return rounds_[slot].bytes; }
  size_t round_hits(size_t slot = 0) const { return rounds_[slot].hits; }
  // The round's blocks whose keys open_range searched (set_keys), for tests and statistics.
  size_t round_searched_on_open(size_t slot = 0) const;

  // Opens the blocks of ranges(slot)[r] from `data[0, size)` (read at its offset), pins them
  // and offers them to the cache (one lock for the range's blocks). -1, or the index (in the
  // range) of the first bad block (the reason in *why): it and the blocks after it are
  // neither pinned nor cached. Thread-safe for distinct ranges.
  int64_t open_range(size_t r, const uint8_t* data, size_t size, std::string* why, size_t slot = 0);

  // Results of read_open_ranges beyond open_range's.
  static constexpr int64_t kReadFailed = -2;  // the read failed (errno's text in *why)
  static constexpr int64_t kReadShort = -3;   // the file ended inside the range
  // Local files: for every range r of `slot` with r % workers == worker, reads it from
  // fds[its file] (pread into a buffer the calling thread keeps for its later calls) and opens
  // it (open_range), so that one call per worker and round replaces a read and a call per
  // range. -1 when all went well; else the failing range in *range and open_range's index of
  // its bad block, kReadFailed or kReadShort (the reason in *why), the ranges after it left
  // unopened. Thread-safe for distinct workers.
  int64_t read_open_ranges(const int* fds, size_t worker, size_t workers, size_t* range,
                           std::string* why, size_t slot = 0);

  // read_open_ranges(fds, w, workers) of `slot` for each w in [0, workers) on the threads of
  // `pool` (each with a buffer of its thread), returning at once; finish_reads waits for them.
  // `fds` (one per file, add() order) is copied. Not thread-safe; no read of `slot` may be in
  // flight.
  void start_reads(FetchPool* pool, const int* fds, size_t nfds, size_t workers, size_t slot = 0);
  // Waits for the reads start_reads began in `slot` (none: returns at once): -1, or the result
  // of the failing call of the lowest range (as read_open_ranges returns it, with *range and
  // *why).
  int64_t finish_reads(size_t* range, std::string* why, size_t slot = 0);
  // Waits for reads in flight.
  ~LookupStep();
  LookupStep(const LookupStep&) = delete;
  LookupStep& operator=(const LookupStep&) = delete;

  // The round's keys, in block order: their count, their key indices, their file indices.
  size_t round_key_count(size_t slot = 0) const {
    return rounds_[slot].key_end - rounds_[slot].key_begin;
  }
  int64_t round_key(size_t i, size_t slot = 0) const {
    return entries_[rounds_[slot].key_begin + i].key;
  }
  size_t round_key_file(size_t i, size_t slot = 0) const {
    return entries_[rounds_[slot].key_begin + i].file;
  }
  // Searches each round key (key index k is `key_data[key_offsets[k], key_offsets[k + 1])`) in
  // its block, unless open_range did (set_keys): rows[i] its row or -1; returns the bytes of
  // the values found (tombstones hold none). Every block of the round must be pinned (each
  // range opened without error).
  uint64_t search(const int32_t* key_offsets, const uint8_t* key_data, int64_t* rows,
                  size_t slot = 0);
  // The value search() found for round key i appended at out_data + offsets (out_data holds
  // the bytes search() returned), its validity bit set (bitmap of round_key_count() bits,
  // zeroed by the caller); out_offsets has round_key_count() + 1 entries. Returns the NULLs
  // written (misses and tombstones).
  int64_t gather(int32_t* out_offsets, uint8_t* out_data, uint8_t* out_validity,
                 size_t slot = 0) const;

 private:
  struct Entry {
    size_t file;
    int64_t block;
    int64_t key;
  };
  struct Unique {  // one distinct block of the step and its keys entries_[begin, end)
    size_t file;
    int64_t block;
    size_t begin;
    size_t end;
  };
  struct Found {  // a round key's row in its block (-1: absent) and its value there
    int64_t row = -1;
    const uint8_t* value = nullptr;  // null: no value (absent or a tombstone)
    uint32_t size = 0;
  };
  struct Round {
    size_t begin = 0, end = 0;          // its unique_ range
    size_t key_begin = 0, key_end = 0;  // its entries_ range
    std::vector<BlockRef> pins;         // per block (index - begin)
    // Per block whether its keys' found entries are set; one byte each, as open_range calls
    // on several threads set distinct ones.
    std::vector<uint8_t> searched;
    std::vector<Found> found;  // per round key (index - key_begin)
    // start_reads: the descriptors, each worker's outcome, the workers still running.
    struct Outcome {
      int64_t bad = -1;
      size_t range = 0;
      std::string why;
    };
    std::vector<int> fds;
    std::vector<Outcome> outcomes;
    Countdown reads;
    std::vector<size_t> missing_slot;  // per missing block its pins index
    std::vector<std::pair<size_t, int64_t>> missing;
    std::vector<ReadRange> ranges;
    uint64_t bytes = 0;
    size_t hits = 0;
  };
  void plan();
  // Fills found[] for the keys of the round's block `u` (a unique_ index), pinned.
  void search_block(Round& rd, size_t u, const int32_t* key_offsets, const uint8_t* key_data) const;
  BlockCache* cache_;
  const int32_t* key_offsets_ = nullptr;  // set_keys
  const uint8_t* key_data_ = nullptr;
  uint64_t open_bytes_, gap_bytes_, max_read_bytes_;
  std::vector<const RunBlockTable*> files_;
  std::vector<Entry> entries_;
  std::vector<Unique> unique_;
  bool planned_ = false;
  size_t next_unique_ = 0;
  Round rounds_[2];
  std::vector<int64_t> probe_files_, probe_blocks_;  // a round's cache keys, reused
};

}  // namespace statecore
