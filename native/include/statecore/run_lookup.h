// One step of a batch of point lookups in the runs of a checkpoint version (the tiered mode's
// statecore.checkpoint.lookup), with per-block work all native: the keys a step routed to
// candidate blocks (run_route.h) are grouped by block; the blocks in the BlockCache are
// pinned, the missing ones planned as coalesced read ranges (one positional read each, after
// RocksDB's and ForSt's coalesced MultiGet reads), each range's bytes opened (XXH64, LZ4,
// payload and last key checked: payload_lookup.h) into the cache, and the keys searched in
// place. Two ways to drive it: run() does the whole step for local files on native threads
// and the caller's (chunks, no barrier); rounds (next_round, open_range, search) leave the
// reads to the caller, for files whose reads need the interpreter (pyarrow.fs).
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
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
// open_table_block into `out` (at least max(raw_length, 1) bytes): false for a bad block.
bool open_table_block_into(const RunBlockTable& table, int64_t b, const uint8_t* data, size_t size,
                           uint64_t base, uint8_t* out, std::string* why);

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

// What LookupStep::run met when it failed: `bad` is LookupStep::kReadFailed (errno's text in
// `why`), kReadShort (the file ends inside the read) or the number of the read's first bad
// block; the read: its file (index in add() order), file bytes and first block's number.
struct StepFailure {
  int64_t bad = -1;
  size_t file = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  int64_t first_block = 0;
  std::string why;
};

// LookupStep::run's reads: blocks read, bytes of their reads (the gaps a read coalesces
// included), and the most decoded bytes of blocks its threads held open at once.
struct StepCounts {
  uint64_t blocks_read = 0;
  uint64_t bytes_read = 0;
  uint64_t peak_open_bytes = 0;
};

// Rounds take the blocks in groups of at most `open_bytes` decoded bytes and live in one of
// two slots (0 and 1), so that a caller can read and open the next round's blocks (in slot
// 1 - s) on other threads while it searches the current round's keys (slot s): every round
// call below names its slot, 0 by default. Planning a round (next_round) is the caller's
// thread's alone; the blocks a slot pins stay valid until that slot is planned again.
class LookupStep {
 public:
  // `open_bytes` >= 1: the most decoded bytes one round holds, or run() holds open at once
  // (a larger block alone: see run());
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

  // What run() met beyond open_range's bad blocks (StepFailure::bad).
  static constexpr int64_t kReadFailed = -2;  // the read failed (errno's text)
  static constexpr int64_t kReadShort = -3;   // the file ended inside the read

  // Local files, the whole step in one call:
  // the step's distinct blocks cut into chunks of at most open_bytes / (workers + 1) decoded
  // bytes (a larger block alone), which `workers` threads of `pool` and the calling thread
  // take in turn, each chunk on one thread from start to end -- the cache probed (one lock),
  // the missing blocks read from fds[file] as coalesced preads (planned as next_round plans
  // them), opened into the cache, every key searched and its value copied out, the blocks
  // unpinned. Why not rounds: a round ends at a barrier where the caller plans the next one
  // and searches the last, so on a machine with few cores the fetch threads and the caller
  // wait on each other every round; chunks have no barrier, and the caller's thread works as
  // one more fetch thread. At most workers + 1 chunks are open at once. One chunk, or no
  // pool, runs on the calling thread alone. Needs set_keys; not with next_round on the same
  // step. False when a read or a block failed (the first failure met, in *failure; the other
  // threads stop taking chunks, so some keys stay unanswered). Once per step.
  bool run(FetchPool* pool, const int* fds, size_t nfds, size_t workers, StepFailure* failure);
  const StepCounts& counts() const { return counts_; }
  // After run() succeeded: the step's keys in block order (key index i of key_count()), with
  // the bytes of the values found (tombstones hold none).
  size_t key_count() const { return entries_.size(); }
  int64_t key(size_t i) const { return entries_[i].key; }
  uint64_t value_bytes() const;
  // Per key i of key_count(): keys[i] its key index, rows[i] its row in its block or -1, its
  // value appended at out_data + out_offsets[i] (key_count() + 1 offsets, out_data of
  // value_bytes()) with its validity bit set (bitmap zeroed by the caller). Returns the
  // NULLs written (misses and tombstones).
  int64_t gather_step(int64_t* keys, int64_t* rows, int32_t* out_offsets, uint8_t* out_data,
                      uint8_t* out_validity) const;
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
    std::vector<Found> found;          // per round key (index - key_begin)
    std::vector<size_t> missing_slot;  // per missing block its pins index
    std::vector<std::pair<size_t, int64_t>> missing;
    std::vector<ReadRange> ranges;
    uint64_t bytes = 0;
    size_t hits = 0;
  };
  struct Chunk {  // run(): unique_[begin, end), its decoded bytes, its keys' values
    size_t begin = 0, end = 0;
    uint64_t bytes = 0;
    std::vector<uint8_t> values;
  };
  void plan();
  void take_chunks();
  bool run_chunk(Chunk& ch, std::vector<uint8_t>* buffer, StepFailure* failure);
  // Searches the keys of block `u` (a unique_ index; its payload `bytes[0, size)`) and copies
  // their values into the chunk's.
  void search_into(Chunk& ch, size_t u, const uint8_t* bytes, size_t size);
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
  // run(): the chunks, the next one to take, per key its row, value size (-1: none) and
  // offset in its chunk's values; threads write distinct chunks' keys.
  std::vector<Chunk> chunks_;
  std::vector<int> fds_;
  std::vector<int64_t> rows_;
  std::vector<int32_t> sizes_;
  std::vector<uint32_t> at_;
  std::atomic<size_t> next_chunk_{0};
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> open_now_{0}, peak_open_{0}, blocks_read_{0}, bytes_read_{0};
  std::mutex failure_mu_;
  bool failed_ = false;
  StepFailure failure_;
  Countdown run_done_;
  StepCounts counts_;
};

}  // namespace statecore
