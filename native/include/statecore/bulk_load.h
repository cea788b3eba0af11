// Bulk load of encoded entries into a StateTable: what a restore and a catch-up (a change set
// applied in process, Flink's incremental restore) do with the entries a checkpoint reader
// decoded, without a Python object or a per-key-group call per entry.
#pragma once
#include <cstdint>
#include <string>

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

}  // namespace statecore
