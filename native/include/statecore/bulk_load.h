// Bulk load of encoded entries into a StateTable: what a restore and a catch-up (a change set
// applied in process, Flink's incremental restore) do with the entries a checkpoint reader
// decoded, without a Python object or a per-key-group call per entry.
#pragma once
#include "statecore/sorted_run.h"
#include "statecore/state_table.h"

namespace statecore {

// Upserts the entries of `run` (Arrow binary layout, keys = encoded keys) into the maps of their
// key groups; a NULL value (validity bit 0) removes its key (a change set's tombstone). The run
// must be sorted by key group: the big-endian `prefix_bytes`-byte key-group prefix (1 or 2) of
// every key, non-decreasing, all inside the table's range, every key longer than its prefix.
// std::invalid_argument names the first entry that breaks this, or offsets that are negative,
// decreasing or past key_data_size / value_data_size, before anything is written.
// The values' sizes are not checked (the caller knows the state's width: _native.pyx
// check_entry_range); an entry whose value size differs from the stored one replaces it.
//
// Per run of one key group: an empty map is pre-sized for the run (no rehash while loading),
// keys are hashed and their slots prefetched 16 entries ahead (a catch-up upserts into a state
// that is out of cache next to Spark's JVM), and each entry is written through the batch kernels'
// lane of the map (FlatLane::upsert: the geometry read once per key group, not per entry) when
// the map is flat and the entry's key and value fit its layout, else StateMap::upsert / put.
void load_entries(StateTable& table, const ArrowBinaryRun& run, int prefix_bytes);

}  // namespace statecore
