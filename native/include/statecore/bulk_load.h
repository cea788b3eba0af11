// Bulk load of encoded entries into a StateTable: what a restore and a catch-up (a change set
// applied in process, Flink's incremental restore) do with the entries a checkpoint reader
// decoded, without a Python object or a per-key-group call per entry.
#pragma once
#include <cstdint>
#include <string>

#include "statecore/block_codec.h"
#include "statecore/sorted_run.h"
#include "statecore/state_table.h"

namespace statecore {

// The rules load_entries needs, and a restore checks before it loads anything: `run`'s offsets
// sound (first_bad_offset), every key longer than its big-endian `prefix_bytes`-byte (1 or 2)
// key-group prefix, the prefixes non-decreasing and inside [kg_lo, kg_hi], a NULL value only with
// `tombstones` (a change set's removal), every other value `value_width` bytes unless
// value_width < 0. Returns "" or the first problem, naming the entry ("entry 3: ...").
// std::invalid_argument for a prefix_bytes other than 1 or 2.
std::string check_entries(const ArrowBinaryRun& run, int32_t kg_lo, int32_t kg_hi, int prefix_bytes,
                          int64_t value_width, bool tombstones);

// Upserts the entries of `run` (Arrow binary layout, keys = encoded keys) into the maps of their
// key groups; a NULL value (validity bit 0) removes its key (a change set's tombstone). The run
// must be sorted by key group: the big-endian `prefix_bytes`-byte key-group prefix (1 or 2) of
// every key, non-decreasing, all inside the table's range, every key longer than its prefix:
// check_entries with the table's range, any value width and tombstones allowed, whose message
// std::invalid_argument carries before anything is written.
// The values' sizes are not checked (the caller knows the state's width: _native.pyx
// check_entry_range); an entry whose value size differs from the stored one replaces it.
//
// The maps' write logs are given up for the epoch (StateMap::give_up_write_log): a restore and a
// catch-up rebase() right after, so no listing reads those records, and logging them would only
// take the rows off the lanes' path to drop the records again. Removals are still logged (only
// rebase() may forget them).
//
// Per run of one key group: an empty map is pre-sized for the run (no rehash while loading),
// keys are hashed and their slots prefetched 16 entries ahead (a catch-up upserts into a state
// that is out of cache next to Spark's JVM), and each entry is written through the batch kernels'
// lane of the map (FlatLane::upsert: the geometry read once per key group, not per entry) when
// the map is flat and the entry's key and value fit its layout, else StateMap::upsert / put.
void load_entries(StateTable& table, const ArrowBinaryRun& run, int prefix_bytes);

// What load_blocks checks the entries against.
struct BlockLoadSpec {
  int prefix_bytes = 1;       // the key-group prefix: 1 or 2 big-endian bytes
  int64_t key_width = -1;     // every encoded key this many bytes; -1: any
  int64_t value_width = -1;   // every non-tombstone value this many bytes; -1: any
  bool has_validity = false;  // incremental run: its payloads end in a validity bitmap
  bool into_empty = false;    // the oldest run of the key groups (see load_blocks)
  // Open (verify, decompress, check) the blocks on a worker thread, a few ahead of the
  // inserts: the load's wall time about that of the larger step, not of their sum.
  bool open_ahead = false;
};

struct BlockLoadResult {
  int64_t failed_block = -1;  // index into the blocks of the first bad one; -1: all loaded
  // The failed block's problem: `corrupt` when the stored bytes are damaged (bounds, XXH64,
  // LZ4, payload structure, keys not strictly ascending within their key group), else an
  // entry breaks the state's rules (a key width, prefix or value width) or the blocks' key
  // groups do not fit the table.
  bool corrupt = false;
  std::string error;     // decode_blocks' wording, entries named "entry i: ..."
  uint64_t entries = 0;  // entries of the loaded blocks, tombstones included
};

// Restores `blocks` (consecutive stored blocks of one run's state, in file order: sorted by key
// group, `key_groups[i]` the key group block i belongs to, as the file's key-group index says)
// of `data[0, size)` into `table`, with no intermediate arrays. Per key group: each of its blocks
// is verified, decompressed and its payload checked (block_codec.h open_block; with
// `open_ahead` on a worker thread a few blocks ahead, block_source.h), and its entries checked
// -- every key longer than the prefix, of key_width bytes, carrying the block's key-group
// prefix, keys strictly ascending (bytewise) across the key group's blocks, every non-tombstone
// value value_width bytes; a tombstone (validity bit 0) exists only with has_validity -- and
// once every block of the key group passed, inserted from those buffers as load_entries inserts
// (the map pre-sized for the key group's entries, slots prefetched ahead, flat lanes, the write
// log given up, tombstones removing their keys). With `into_empty`, a key group whose map is
// empty gets its keys inserted without looking for an equal one (they are unique, checked
// above: a linear probe stops at the first free slot), its tombstones skipped. With key_width
// and value_width given too and no validity bitmaps (a full run), its flat map is first
// pre-sized for the entries the block table announces, laid out for those widths and given
// every page of its table (which the load fills anyway), and each block is inserted right after
// its checks, while its payload is in cache (a bad block empties the map again): the checks in
// one pass without a branch per entry, the lane's per-row checks and counts done once a
// payload, the next 16 keys hashed and their home slots prefetched while the 16 before them
// are stored.
//
// Stops at the first bad block (reported in the result): nothing of its key group is loaded, the
// key groups before it stay loaded, so a caller that must leave its state unchanged loads into a
// table it discards on error. Never reads outside `data`. std::invalid_argument for a
// prefix_bytes other than 1 or 2. Owner thread of `table`.
BlockLoadResult load_blocks(StateTable& table, const uint8_t* data, size_t size,
                            const StoredBlockRef* blocks, const int32_t* key_groups, size_t count,
                            const BlockLoadSpec& spec);

// load_blocks on up to `threads` threads: `blocks` cut at key-group boundaries into that many
// slices of about equal stored bytes, each slice loaded by load_blocks on a thread of its own
// (the first on the calling thread). Slices hold disjoint key groups, so the threads write
// disjoint maps of `table` (its maps share no mutable state; the page pool locks, and the
// kernels' lanes are per thread). Cuts only where every key group is inside the table's range
// and not below the one before it, and only into slices of at least `min_slice_bytes` stored
// bytes; otherwise one load_blocks call (which then names the bad block). The result is the
// first failed slice's (block indexes into `blocks`), `entries` summed over all slices. On a
// failure other slices, key groups after the failed block included, may be loaded: as with
// load_blocks, a caller that must leave its state unchanged loads into a table it discards on
// error. An exception of a slice (std::invalid_argument as load_blocks, std::bad_alloc) is
// rethrown once every thread ended; a thread that cannot be started leaves its slice to the
// calling thread. Owner thread of `table` (no other call on it until this returns).
BlockLoadResult load_blocks_parallel(StateTable& table, const uint8_t* data, size_t size,
                                     const StoredBlockRef* blocks, const int32_t* key_groups,
                                     size_t count, const BlockLoadSpec& spec, int threads,
                                     uint64_t min_slice_bytes);

}  // namespace statecore
