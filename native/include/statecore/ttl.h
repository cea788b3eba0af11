// State TTL in the native core: the timestamp suffix, the expiry rule and the filter over one
// serialized value (Flink TtlUtils + frocksdb FlinkCompactionFilter, on statecore's layout).
//
// Layout: docs/formats.md "TTL suffix" (an 8-byte big-endian ms timestamp after every value,
// list element and map user value; a suffix, unlike Flink's prefix, so a fixed-width value keeps
// offset 0 and a list element's timestamp is found by stride).
//
// Expiry (Flink TtlUtils.expired): an entry with timestamp ts is expired at `now` when
// ts + ttl_ms <= now, unless ts + ttl_ms overflows int64 (then it never expires).
//
// filter_value() is the one filter used wherever stored bytes are filtered without decoding them:
// full-snapshot cleanup in the snapshot serializer, incremental and background cleanup, store
// compaction. It must agree byte for byte with statecore.ttl.filter_expired (Python), which the
// differential tests check.
#pragma once
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "statecore/key_codec.h"
#include "statecore/sorted_run.h"
#include "statecore/state_map.h"
#include "statecore/state_table.h"

namespace statecore {
class CollectionIndex;
class ListIndex;
namespace ttl {

constexpr size_t kTimestampBytes = 8;

inline int64_t load_timestamp(const uint8_t* p) {
  uint64_t v = 0;
  for (size_t i = 0; i < kTimestampBytes; ++i) v = (v << 8) | p[i];
  return static_cast<int64_t>(v);
}

inline void store_timestamp(uint8_t* p, int64_t ts) {
  uint64_t v = static_cast<uint64_t>(ts);
  for (size_t i = kTimestampBytes; i-- > 0;) {
    p[i] = static_cast<uint8_t>(v);
    v >>= 8;
  }
}

// ts + ttl_ms <= now without overflow; ttl_ms > 0. When ts + ttl_ms would exceed INT64_MAX the
// entry never expires (Flink's overflow guard).
inline bool expired(int64_t ts, int64_t ttl_ms, int64_t now) {
  if (ts > INT64_MAX - ttl_ms) return false;
  return ts + ttl_ms <= now;
}

// How a state's serialized value is laid out (Python: statecore.ttl.filter_expired's `kind`).
//  Value: value, reducing and aggregating state: user bytes | ts. Values shorter than 8 bytes are
//         kept (frocksdb keeps values too short to hold a timestamp).
//  List:  elements in append order; fixed width w > 0: each element is w bytes | ts (stride w+8);
//         fixed width 0: varlen(len) | bytes | ts. A list state's entry is a chunk of its
//         list in this layout (docs/formats.md "List state", list_chunks.h).
// A map state's entry holds one user value (docs/formats.md "Map state"): Value layout.
enum class Layout : uint8_t { Value, List };

struct FilterSpec {
  Layout layout = Layout::Value;
  uint32_t fixed_width = 0;  // List only: element width in bytes, 0 = variable length
  int64_t ttl_ms = 1;        // > 0
};

enum class FilterResult : uint8_t {
  Keep,  // nothing expired: keep the value as it is
  Drop,  // everything expired: remove the entry
  Trim,  // some list elements expired: *out holds the bytes to keep (non-empty)
};

// Filters one serialized value at time `now`. List: when the first element is unexpired the list
// is kept whole (elements are appended in timestamp order), otherwise only the suffix from the
// first unexpired element on (Drop when none). `out` is cleared and
// filled only for Trim (it may be null for Layout::Value). `expired`, when given, is increased by
// the number of expired things removed: 1 for a dropped value, the leading expired list
// elements. Throws std::invalid_argument naming the problem when a list
// value is truncated or its varlen is broken (bytes not written by a TTL state).
FilterResult filter_value(const FilterSpec& spec, int64_t now, ByteView value,
                          std::vector<uint8_t>* out, size_t* expired = nullptr);

// filter_value over every entry of a run without tombstones (a full snapshot listing), in order:
// `out` receives the kept and trimmed entries (same keys, same order), `in` is not modified.
// Returns the number of expired things removed (as filter_value counts). Throws what
// filter_value throws, and std::invalid_argument for a run with tombstones.
size_t filter_run(const FilterSpec& spec, int64_t now, const SortedRun& in, SortedRun& out);

// filter_value over a contiguous block of n values in Arrow binary (int32 offsets) or
// large_binary (int64 offsets) layout -- value i is data[offsets[i], offsets[i+1]) -- at one time
// `now`: the native path of the checkpoint store's compaction filter
// (statecore.ttl.compaction_filter), which hands over one chunk of a key group's values per
// clock reading, straight from the Arrow buffers, so no value becomes a Python object.
//
// keep[i] becomes 1 when value i stays (whole or trimmed), 0 when filter_value dropped it --
// except an empty list value (dropped by filter_value with nothing expired) before the first
// value in which something expired, which stays as statecore.ttl.filter_entries keeps it (that
// function returns the block unchanged while nothing expired). The values that stay, trimmed
// where filter_value trims, are written back to back to out_data with their offsets in
// out_offsets[0..kept] (out_offsets[0] = 0, same width as the input offsets).
// Capacities the caller provides: keep n, out_offsets n + 1, out_data offsets[n] - offsets[0]
// bytes (filtering never makes a value longer). Throws std::invalid_argument when the offsets
// are negative, decreasing or point past data_size, or, prefixed with the value's index, what
// filter_value throws for a broken list layout; the outputs are then partly written.
struct ValuesFiltered {
  size_t kept = 0;        // values that stay (ones in keep)
  size_t data_bytes = 0;  // bytes written to out_data (= out_offsets[kept])
  size_t expired = 0;     // expired things removed, as filter_value counts them
};
ValuesFiltered filter_values(const FilterSpec& spec, int64_t now, const uint8_t* data,
                             size_t data_size, const int32_t* offsets, size_t n, uint8_t* keep,
                             int32_t* out_offsets, uint8_t* out_data);
ValuesFiltered filter_values(const FilterSpec& spec, int64_t now, const uint8_t* data,
                             size_t data_size, const int64_t* offsets, size_t n, uint8_t* keep,
                             int64_t* out_offsets, uint8_t* out_data);

// One step of incremental (or, with a large min_entries, background) cleanup of one map:
// visits whole buckets from `*cursor` on (StateMap::collect_buckets) until at least min_entries
// entries were visited or the table ended, and removes or trims what filter_value says through
// the map's normal, copy-on-write aware operations (so live snapshots are unaffected and the
// changes are tracked like any write). `scratch` is reused between calls. `removed` (when given)
// receives the key of every entry removed (a map state's index unlists them).
struct CleanupStep {
  size_t visited = 0;    // entries looked at
  size_t expired = 0;    // expired things removed (filter_value's count)
  bool wrapped = false;  // the walk reached the end of the table; *cursor is 0 again
  size_t written = 0;    // entries removed or rewritten (trimmed)
  // The table step (below): the first and last key group whose map it wrote (-1: none); the
  // key groups of one step are visited in ascending order.
  int32_t first_written_kg = -1;
  int32_t last_written_kg = -1;
};
CleanupStep cleanup_step(StateMap& map, uint64_t* cursor, size_t min_entries,
                         const FilterSpec& spec, int64_t now, SortedRun* scratch,
                         std::vector<std::string>* removed = nullptr);

// Rewrites every timestamp equal to `from` (values, list elements) to `to`, in every
// entry of the map, through put() (copy-on-write aware, tracked as a write). Used once per
// event-time TTL state when the first watermark arrives: writes made before any watermark carry
// INT64_MIN and are re-stamped with it. Returns the timestamps rewritten. Throws what
// filter_value throws for a broken layout (entries before it stay rewritten).
size_t restamp(StateMap& map, const FilterSpec& spec, int64_t from, int64_t to);

// ---- Migration: restoring with TTL switched on or off (explicitly requested) ---------------
// Flink refuses such a restore (StateMigrationException); statecore converts the state when the
// descriptor asks for it (StateDescriptor.enable_ttl_migration, statecore.ttl "Migration"). The
// layout without TTL is the one above without the suffix -- Value: the user bytes; List: w-byte
// elements (w = fixed_width) or varlen(len) | bytes -- so the conversion needs no value decoding, only the layout walk.
struct MigrationSpec {
  Layout layout = Layout::Value;
  uint32_t fixed_width = 0;    // List only: element width WITHOUT the timestamp, 0 = varlen
  bool add_timestamps = true;  // true: off -> on; false: on -> off (strip them)
  int64_t ts = 0;              // add: the timestamp (ms) every value/element/entry gets
  int64_t ttl_ms = 1;          // strip: the TTL (ms, > 0) the state was written with, and
  int64_t now = 0;             //   the time (ms) at which what is expired under it is dropped
};

// Converts one serialized value into *out (cleared first). Add: every value and list element
// gets `ts` as its suffix. Strip: every one expired under (ttl_ms, now) is dropped -- each list
// element on its own, not only a leading run as filter_value does -- and the rest lose their suffix; *expired (when
// given) is increased by the number dropped. Returns false when nothing remains (strip only;
// also a list value without elements): the entry is to be removed. Throws
// std::invalid_argument naming the problem for a broken layout, and when stripping, for a value
// shorter than its 8-byte timestamp.
bool migrate_value(const MigrationSpec& spec, ByteView value, std::vector<uint8_t>* out,
                   size_t* expired = nullptr);

struct MigrationResult {
  size_t rewritten = 0;  // entries rewritten in the new format
  size_t removed = 0;    // entries removed (strip: everything in them expired)
  size_t expired = 0;    // expired values and list elements dropped (strip)
};

// Converts every entry of every key group of `table`, all or nothing: a first pass converts each
// value into a scratch buffer without writing (for_each over the live entries), so a broken
// layout throws std::invalid_argument (prefixed with the key group) before anything changed; the
// second pass copies one key group's entries at a time (collect_buckets) and writes the
// conversions through put()/remove(), copy-on-write aware (live snapshots keep the old bytes)
// and tracked as writes. Cost: two conversions per value, plus one key group's entries copied.
// std::invalid_argument also for a strip spec with ttl_ms <= 0.
MigrationResult migrate(StateTable& table, const MigrationSpec& spec);

// The lazy global iterator of incremental cleanup over all key groups of a table (Flink keeps one
// per state over all its key-group maps): a key group and a bucket cursor inside its map.
struct TableCursor {
  int32_t key_group = 0;  // outside the table's range: restarts at kg_start
  uint64_t bucket = 0;
};

// cleanup_step over the table from `*cursor`, moving to the next key group whenever a map ends,
// until at least min_entries entries were visited or the last key group ended; `wrapped` then
// says the pass is complete and the cursor is back at the first key group (the next step starts a
// new pass, as Flink recreates its iterator). Empty key groups cost one bucket visit each.
CleanupStep cleanup_step(StateTable& table, TableCursor* cursor, size_t min_entries,
                         const FilterSpec& spec, int64_t now, SortedRun* scratch,
                         std::vector<std::string>* removed = nullptr);

// The per-row hook of incremental cleanup in the batch kernels (batch.h TtlBatchSpec::cleanup,
// batch_reads.h, batch_collections.h): Flink's TtlIncrementalCleanup runs its step before each
// state access, and a batch row is one, so a kernel calls cleanup_row() at the top of every row
// when the hook is set: `steps_per_row` table steps (cleanup_step above) of at least
// `cleanup_size` entries each from `cursor` on, one after the other, exactly what as many single
// accesses run (a step ends at the end of a pass, the next starts a new one; on an empty table
// the row's remaining steps are skipped, as they would visit nothing). The cursor is the one of
// the per-record path (the caller passes it in and takes it back), so batch and per-record calls
// continue each other's pass. Removals and trims go through the map's copy-on-write operations,
// as any write; a removed map entry leaves `index` (when set) as well.
struct IncrementalCleanup {
  StateTable* table = nullptr;
  TableCursor cursor;
  size_t cleanup_size = 1;   // Flink cleanupSize: entries a step visits at least
  size_t steps_per_row = 1;  // the state's access, and one more with runCleanupForEveryRecord
  FilterSpec spec;
  int64_t now = 0;  // ms, the batch's clock reading
  // A map state's index (collection_index.h) and the key layout that splits its entry keys.
  CollectionIndex* index = nullptr;
  KeySchema index_key;
  NamespaceType index_namespace = NamespaceType::Void;
  int32_t index_max_parallelism = 0;
  // A list state's index (list_index.h) and the key-group prefix width of its entry keys.
  ListIndex* list_index = nullptr;
  int list_prefix_width = 0;
  // Out, summed over the rows: expired things removed (filter_value's count), entries visited.
  size_t expired = 0;
  size_t visited = 0;
  // Out, of the last cleanup_row(): the key groups whose maps it wrote (see CleanupStep).
  int32_t first_written_kg = -1;
  int32_t last_written_kg = -1;
  SortedRun scratch;
  std::vector<std::string> removed;
};

// One row's steps (see IncrementalCleanup). Returns whether they removed or rewrote an entry:
// a kernel then treats key groups [first_written_kg, last_written_kg] as written outside its
// lanes. Throws std::invalid_argument for a value whose TTL layout is broken (the entries handled
// before it stay handled, the cursor where the step stopped).
bool cleanup_row(IncrementalCleanup& c);

}  // namespace ttl
}  // namespace statecore
