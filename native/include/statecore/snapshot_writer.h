// Asynchronous snapshot materialization: a background std::thread that turns the table snapshots
// of one backend snapshot into the block payloads of a checkpoint data file, while the owning
// thread keeps reading and writing the tables (block and payload layout: docs/formats.md "Data
// file"; the Python writer, statecore.checkpoint.format, cuts and encodes the same bytes).
//
// Design. The serializer walks the file's order -- key group ascending, then the states in the
// order given (the footer's `states` list), then encoded key ascending -- and for each (state,
// key group) lists the map snapshot's entries (sorted_entries) or changes (sorted_changes(base),
// incremental runs), cuts them into blocks exactly as format.cut_points does (12 bytes of count
// and leading offsets, then 8 bytes of offsets + key + value bytes per entry, at most
// `block_target_bytes` per block unless a single entry is larger), and encodes each block's
// payload (docs/formats.md). Compression and checksums happen on the consumer's thread: next()
// hands over payloads (the consumer compresses them), next_chunk() compresses and checksums
// several into one chunk without returning (block_codec.h: the same bytes as the Python writer's).
// Finished payloads go to a bounded queue (`queue_blocks`): the producer waits while it is full,
// so memory is bounded by queue_blocks payloads + the key group being cut. Either side that
// has to wait sleeps until the other has drained (filled) the queue to half, not for one
// payload: a thread switch per block would cost more than the block. With
// `release_as_written`, each map snapshot is released as soon as its key group was encoded, so
// the owner stops copying (and retired entries get reclaimed) progressively during the write.
//
// TTL. A table source with `ttl_filter` has each listed key group filtered (ttl::filter_run)
// before it is cut, so full snapshots with TTL cleanup need no pass on the owning thread.
//
// Errors. A source that breaks the snapshot contract (a key without the key group's prefix,
// keys not strictly ascending, more than 2 GiB of key or value bytes in one (state, key group))
// makes the producer stop; next() rethrows it as std::invalid_argument naming the state and key
// group. cancel() (any thread, idempotent) stops the producer at its next entry batch and makes
// next() throw SerializerCancelled.
//
// Thread contract. Construct, start(), next() from one consumer thread; cancel() from any thread;
// the destructor cancels and joins. The table snapshots must not be released by anyone else
// while the serializer runs (MapSnapshot: one reading thread at a time); the serializer holds
// copies of the TableSnapshots, so the map snapshots stay alive as long as it does.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "statecore/block_codec.h"
#include "statecore/state_table.h"
#include "statecore/ttl.h"

namespace statecore {

// Entries of one (state, key group) materialized outside the engine (e.g. the timers), sorted by
// key bytes; tombstones (valid[i] == 0) must have empty values.
using StaticEntries = SortedRun;

// One state of the snapshot, in file order: either a table snapshot (entries, or changes since
// `base` when `changes`) or static entries per key group (key groups absent from `fixed` hold
// nothing).
// With `ttl_filter` (TTL full-snapshot cleanup of a table source listed in full), every listed
// key group goes through ttl::filter_run at `ttl_now` first: expired entries are left out,
// expired list elements / map entries trimmed (Flink's cleanupFullSnapshot), on this thread.
struct SerializerSource {
  std::string name;
  std::shared_ptr<TableSnapshot> table;  // nullptr: static source
  bool changes = false;
  uint64_t base = 0;
  std::map<int32_t, StaticEntries> fixed;
  bool ttl_filter = false;
  ttl::FilterSpec ttl_spec;
  int64_t ttl_now = 0;
};

struct SerializerOptions {
  int32_t kg_start = 0;
  int32_t kg_end = -1;   // kg_end < kg_start: empty range, no blocks
  int prefix_bytes = 1;  // key-group prefix width of encoded keys (1 or 2)
  size_t block_target_bytes = 64 * 1024;
  bool incremental = false;         // append the validity bitmap to every payload
  size_t queue_blocks = 4;          // bounded queue capacity (>= 1)
  bool release_as_written = false;  // release each map snapshot once its key group is encoded
  // Bloom filter bits per key of each (state, key group) (block_codec.h bloom_*, 1 to 64).
  uint32_t bloom_bits_per_key = 10;
  // How next_chunk stores each block (block_codec.h kCodecLz4 or kCodecNone).
  uint32_t codec = kCodecLz4;
  // Added to the producer thread's nice value (Linux; 0 = unchanged, capped at 19): a checkpoint
  // is background work and should yield the CPU to the owning (processing) thread.
  int nice = 0;
};

// One finished block payload and where it belongs.
struct BlockPayload {
  int32_t key_group = 0;
  uint32_t state = 0;    // index into the sources
  uint32_t entries = 0;  // n (incl. tombstones)
  uint32_t tombstones = 0;
  bool last_of_group = false;  // the last block of its (state, key group)
  std::vector<uint8_t> bytes;
  std::vector<uint8_t> last_key;  // the block's last encoded key (format 6 block keys)
  std::vector<uint8_t> filter;    // last_of_group: the (state, key group)'s Bloom filter
};

// One block of a BlockChunk in its stored form (block_codec.h): `stored_length` bytes at
// `offset` in the chunk's bytes, encoded with the options' codec from `raw_length` payload
// bytes, `xxh64` (seed 0) of the stored bytes. The other fields are the BlockPayload's.
struct StoredBlock {
  int32_t key_group = 0;
  uint32_t state = 0;
  uint32_t entries = 0;
  uint32_t tombstones = 0;
  bool last_of_group = false;
  uint64_t offset = 0;
  uint64_t stored_length = 0;
  uint64_t raw_length = 0;
  uint64_t xxh64 = 0;
  std::vector<uint8_t> last_key;
  std::vector<uint8_t> filter;
};

// Consecutive stored blocks in file order, concatenated.
struct BlockChunk {
  std::vector<uint8_t> bytes;
  std::vector<StoredBlock> blocks;
};

class SerializerCancelled : public std::runtime_error {
 public:
  SerializerCancelled() : std::runtime_error("snapshot serialization was cancelled") {}
};

class SnapshotSerializer {
 public:
  // std::invalid_argument for bad options (prefix not 1/2, block target 0, queue 0, a table
  // source whose key-group range does not cover [kg_start, kg_end]).
  SnapshotSerializer(std::vector<SerializerSource> sources, SerializerOptions options);
  ~SnapshotSerializer();
  SnapshotSerializer(const SnapshotSerializer&) = delete;
  SnapshotSerializer& operator=(const SnapshotSerializer&) = delete;

  // Launches the producer thread (once; std::logic_error when called twice).
  void start();
  // Waits for the next payload in file order; false after the last one. Rethrows the producer's
  // error; throws SerializerCancelled after cancel().
  bool next(BlockPayload* out);
  // Waits for the next payloads, encodes them with the options' codec and checksums them on the
  // calling thread (block_codec.h) and puts them into `out` (cleared first) until it holds at least
  // `target_bytes` stored bytes or the last block; false when no block was left. The consumer
  // thus returns to its caller once per chunk instead of once per block: a Python consumer
  // releases and retakes the GIL once per chunk, and each retake can wait a whole switch
  // interval while the owning thread runs Python. Errors as next(); after an error `out` holds
  // nothing.
  bool next_chunk(BlockChunk* out, size_t target_bytes);
  // Stops the producer and joins it (unless called from the producer itself). Idempotent.
  void cancel();

  struct Stats {
    uint64_t blocks = 0;          // payloads produced
    uint64_t payload_bytes = 0;   // their total size
    uint64_t max_queued = 0;      // highest queue length observed (<= queue_blocks)
    uint64_t producer_waits = 0;  // times the producer waited on a full queue (backpressure)
    uint64_t ttl_expired = 0;     // expired things left out by TTL filters (ttl::filter_run)
  };
  Stats stats() const;

 private:
  void run();
  void produce();
  void emit(BlockPayload&& p);  // blocks while the queue is full; throws SerializerCancelled
  size_t low_water() const;
  void serialize_group(size_t si, int32_t kg);

  std::vector<SerializerSource> sources_;
  SerializerOptions opt_;
  // Producer-thread scratch reused from key group to key group (sorted_run.h: fresh memory is
  // the dominant cost of listing a key group).
  SortedRunBuilder builder_;
  SortedRun listed_;
  SortedRun filtered_;  // listed_ after a TTL filter
  std::thread thread_;
  bool started_ = false;
  std::mutex join_mu_;

  mutable std::mutex mu_;
  std::condition_variable not_full_;
  std::condition_variable not_empty_;
  std::deque<BlockPayload> queue_;
  bool done_ = false;              // producer finished (ok or error)
  bool producer_waiting_ = false;  // emit() sleeps on a full queue
  bool consumer_waiting_ = false;  // next() sleeps on an empty queue
  std::atomic<bool> cancelled_{false};
  std::exception_ptr error_;
  Stats stats_;
};

}  // namespace statecore
