// PUBLIC API CONTRACT of the native state map (implementation: native/src/state_map.cpp,
// internals in detail/). The class comment is the design document and is completed by the
// implementation: trade-offs, invariants, every field.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "statecore/sorted_run.h"

namespace statecore {

// Hash of an encoded key. Injectable so tests can run over a deliberately colliding hash.
using KeyHashFunction = uint32_t (*)(const uint8_t* data, size_t size);

class MapSnapshot;

// Which engine a StateMap runs (see "Flat engine" in the class comment). Default: the process
// default, Flat unless set_default_map_engine() or the environment variable
// STATECORE_MAP_ENGINE=chained (read once, at the first map) says Chained -- so whole test suites
// can run over either engine.
enum class MapEngine : uint8_t { Default, Flat, Chained };
void set_default_map_engine(MapEngine engine);  // Default resets to the environment's choice
MapEngine default_map_engine();

namespace detail {
struct Entry;
}

// Copy-on-write, incrementally rehashing chained hash map from byte keys to byte values
// (after Flink's CopyOnWriteStateMap). One instance per key group of a state.
//
// ===================================== Design =====================================
// Purpose. Hold the keyed state of one key group in process memory so that (a) every state access
// is a hash lookup, (b) a checkpoint can take a consistent snapshot in O(1) on the processing
// thread and serialize it on another thread while processing continues, and (c) no single-row
// operation ever stalls on O(entries) work (no stop-the-world rehash, no stop-the-world copy);
// batch kernels trade that for throughput, see "Batch exception" below.
//
// Table. Chained hashing over a power-of-two number of buckets (bucket = hash & (capacity-1)),
// minimum capacity 4, maximum 2^30, new entries pushed at the chain head, load factor 3/4.
// Tables only grow: removals never shrink them, clear() keeps the capacity. The bucket array is
// paged: a table is a Directory of Pages of min(capacity, 512) bucket heads (detail/pages.h), both
// reference counted, pages allocated on first write (a missing page = empty buckets).
// Trade-off: one extra indirection per lookup (directory -> page -> head) buys O(1) snapshots.
//
// Entries (detail/entry.h). One allocation per key: header {next, version, value_capacity, hash,
// key_size, value_size, modified}, key bytes padded to 8, then the value bytes. Values are inline
// (an int64/float64 value is 8 aligned bytes in the entry); put() with a different value size
// allocates a new entry and relinks it in place of the old one. resize() (the list append / map
// put kernels) instead grows an entry no snapshot reaches in its own allocation, which it
// reallocates with 1.5x slack (value_capacity) when the value outgrows it. `version` is the map version at which the
// allocation was made (Flink entryVersion; there is no separate stateVersion because the value
// lives in the entry, so copying the entry copies the value).
//
// Incremental rehash (as Flink). When an insert finds size() > threshold and no rehash is in
// flight, a table of twice the capacity is allocated (only its directory: O(capacity/512)) and
// `rehash_index` starts at 0. Every get/put/get_for_update/remove first migrates whole bucket
// chains of the old table, from rehash_index upward, into the new table until at least 4 entries
// moved (MIN_TRANSFERRED_PER_INCREMENTAL_REHASH) -- additionally capped at 64 buckets visited (a
// missing page counts as one) so a sparse old table cannot make one step O(capacity). A lookup
// uses the old table when (hash & (old_capacity-1)) >= rehash_index, else the new table. When
// rehash_index reaches the old capacity the new table becomes the only one. One rehash at a time:
// if size passes the new threshold before the migration ends (the caps make this impossible for
// capacities >= 8: at most ~capacity/3 inserts can happen during a migration), doubling waits for
// the running one to finish. Migrated old buckets are not cleared (that would copy shared pages);
// nothing ever reads old buckets below rehash_index, neither the map nor snapshots.
//
// Batch exception. upsert() -- called only by the batch kernels (batch.h) -- first completes a
// rehash in flight, in one pass (the flat engine prefetches each destination a few entries
// ahead). A batch is one call whose latency the caller sees as a whole; with both tables live
// every row of it took the general path (probe both tables, one migration step), ~40% of a growing
// batch's instructions. The work is the same entries moved once, so amortised O(1) per insert; the
// longest stall is one key group's map, O(size of that map), once per doubling.
//
// Snapshots are versions (O(1)). snapshot() increments `version` to s, records s as the highest
// required snapshot version (`required`) and in the live-snapshot set, and takes one reference
// to each directory (both during a rehash) plus rehash_index and size(). It copies no bucket
// (Flink copies the bucket array: O(capacity)). The snapshot sees exactly the entries reachable
// from its directories, and all of them have version < s.
//
// Copy-on-write, bucket level. Before writing a bucket slot the map makes it exclusive: a
// directory with refs > 1 is copied (page pointers, O(capacity/512), at most once per table per
// snapshot), then a page with refs > 1 is copied (O(512) pointers, at most once per page per
// snapshot). Snapshots keep the originals.
//
// Copy-on-write, entry level (as Flink). An entry with version < required may be reachable from a
// live snapshot and is never modified. Writing its value, or its `next` link (to unlink or
// relink a successor), first copies the chain from the bucket head down to it, copying only the
// entries with version < required (Flink handleChainedEntryCopyOnWrite); the copies get the
// current version. Migration copies moved entries with version < required. Entries with
// version >= required were created after every live snapshot and are written in place.
// So a write after a snapshot copies only what it touches: at most one directory, one page and
// the chain prefix down to the written entry.
//
// Reclamation without GC. An entry created at version e and unlinked from the live table (removed,
// superseded by its copy, or reallocated) when the map version is u is reachable from snapshot s
// iff e < s <= u. Every live snapshot has s <= u, so it is needed iff e < required: then it goes
// to the retire list with u, else it is freed at once. A release (any thread) removes its version
// from the live set under `mu` and lowers `required`; the freeing of retired entries happens on
// the owning thread at its next operation (flag `sweep_pending`), or in reclaim(). If the map is
// already destroyed (`orphaned`), the releasing thread sweeps itself under `mu`. Directories and
// pages are freed by whoever drops their last reference (atomic counts). Snapshots hold a
// shared_ptr to the engine state, so the map may be destroyed while snapshots live; its
// destructor frees every live entry no snapshot needs.
//
// Fields (StateMap::Impl in detail/map_impl.h; StateMap itself holds only impl_, a shared_ptr
// that snapshots share so the engine state outlives the map while they need it).
//  Owner thread only:
//   hash_fn        injected hash or nullptr (default hash)
//   primary        the table's Directory; during a rehash the OLD table (Flink primaryTable)
//   rehash_table   the NEW, twice as large table during a rehash, else nullptr
//   rehash_index   old buckets below it have been migrated (their slots are stale, never read)
//   primary_size / rehash_size   live entries in each table; size() is their sum
//   threshold      3/4 of the newest table's capacity: an insert when size() > threshold (and
//                  no rehash in flight) starts a rehash
//   live_bytes     bytes(): key + value bytes of live entries
//   version        map version, +1 per snapshot() and rebase(); stamped on every new or copied
//                  entry (`version`) and on every value write (`modified`)
//   req            `required` as read at the start of the current operation
//   retired        retire list: {entry, map version when unlinked}
//   stats          Stats counters
//   base           change-tracking base version (see "Change tracking")
//   removals       removal log (owner side; snapshots hold views)
//  Shared with releasing threads:
//   required       highest live snapshot version, 0 when none (atomic; only the owner raises it)
//   sweep_pending  a release happened since the last sweep (atomic flag)
//   mu             guards live_versions and orphaned (and `retired` once orphaned)
//   live_versions  versions of unreleased snapshots, ascending
//   orphaned       the StateMap was destroyed: releasing threads sweep `retired` themselves
//  MapSnapshot::State: shared_ptr to the engine state, one reference to each directory as of
//  snapshot time, rehash_index, size, version, the base and a view of the removal log as of
//  snapshot time, released flag.
//
// Invariants.
//  I1 version >= every live snapshot version; required = max live snapshot version or 0.
//  I2 no entry with version < required (as last raised by the owner) is written.
//  I3 every directory/page reachable from a live snapshot is unchanged since the snapshot.
//  I4 every entry reachable from a live snapshot is either in the live table or retired.
//  I5 size() = live entries; bytes() = sum of their key and value sizes.
//  I6 during a rehash, live entries with bucket (old) < rehash_index are in the new table only.
//
// Work per operation (n = chain length of the touched bucket, C = capacity):
//  get: one rehash step [<= 64 bucket visits + moved chains (>= 4 entries, whole chains)] + O(n).
//  put/get_for_update/remove: the same + at most one directory copy O(C/512) + one page copy
//  O(512) + O(n) entry copies + (new rehash only) one directory allocation O(C/512)
//  + when a snapshot was released since the last operation, one sweep O(retired * log snapshots).
//  snapshot(): O(1) (+ amortized O(1) for the live-snapshot list).  clear(): O(size + C/512).
//  MapSnapshot::sorted_entries(): O(m log m) over the m entries of the snapshot (O(m) radix passes
//  for short keys), C/512 page visits, one touch of each entry.
//
// Change tracking (incremental snapshots, after Flink's versioned entries; docs/architecture.md
// "Incremental snapshots and checkpoints"). Every entry carries besides `version` (allocation,
// for copy-on-write) `modified`: the map version of the last write of its value (put,
// get_for_update; a new key, a reallocated value). Copies made by copy-on-write or by a rehash
// migration keep `modified`, so only real writes count as changes (stricter than the contract's
// allowance for migrated entries, which lets both backends list byte-identical changes). Every
// removal of a present key (remove(), clear()) appends {map version, hash, key bytes} to the
// removal log (detail/key_log.h), a chunked append-only list that snapshots share. The first write
// of a key in each epoch (the writes between two snapshots: an entry whose `modified` is older
// than the map version, or a new key) appends {version, hash, key bytes} to the write log, the same
// kind of list, so a listing costs what changed rather than what is stored (the issue's "checkpoint
// time scales with the change set"). The write log is bounded: past max(write_log_min, size/16)
// records an epoch stops logging and `writes_complete_from` moves past it; listings whose range
// includes such an epoch walk the table instead (when more than 1/16 of the keys changed, a walk
// costs about what the lookups would). Bulk loads (load_entries) log nothing: they give the
// epoch up first (give_up_write_log), since rebase() follows them.
// An epoch that had more first writes than that limit makes the next one start without a log
// (Impl::start_epoch, at snapshot()): a stream that changes a large share of its keys every
// micro-batch keeps doing so, and logging records only to drop them cost add_batch a third of
// its time. The epoch after a light one logs again.
// A fresh map's first epoch (version 0) logs nothing: every write in it is a change against the
// empty map, so its listings walk (writes_complete_from starts at 1).
// The map's `base` is a version: everything written at a version >= base is "changed".
//   - mark_base(v) (a checkpoint of the snapshot of version v completed) raises base to v and
//     drops the log chunks holding only records older than v; older or equal v are no-ops.
//   - rebase() (after a bulk load such as a restore) bumps the version and sets base to it and
//     empties both logs: what was loaded is the base, not a change. After a catch-up's change
//     set (rebase(true)) that wrote more keys than the log may hold, the new epoch starts
//     without a log, as after such an epoch: the standby copy of a Spark partition that a task
//     takes next had logged ~1,024 records per map only to drop them (malloc'd log chunks in
//     freshly faulted memory: ~70% of a native bench run's remaining worker page faults).
//   - A fresh map has base 0 = version 0: everything written is a change against the empty map.
// A snapshot of version s records the base b0 as of snapshot time and the log as of snapshot
// time. sorted_changes(b) for b0 <= b <= s lists, sorted by key: every present entry with
// b <= modified < s (a put, with its value), and every key with a removal logged in [b, s) that is
// absent from the snapshot (a tombstone; logged twice = one tombstone). Applying these to the
// contents of the snapshot of version b (newest wins, tombstones delete) gives exactly the contents
// of snapshot s. A tombstone may name a key absent at b too (created and removed after b): harmless
// for the merge, and the reference backend reports the same.
// Invariants (besides I1-I6 below):
//  C1 base <= version; base never decreases except by rebase() (which raises it too).
//  C2 `modified` is stamped from the map version at the time of the write, so an entry reachable
//     from a snapshot of version s has modified < s.
//  C3 the log holds every removal at a version >= base, in version order; the memory it holds is
//     those records plus at most one partially older chunk (KeyLogChunk::kChunkRecords), i.e.
//     bounded by the removals since the last completed checkpoint (or the last rebase).
//  C4 a snapshot's listing never changes after it was taken: its directories are immutable (I3),
//     `modified` of an entry reachable from it is never rewritten (I2: writing the value first
//     copies the entry), and its view of the log covers only records appended before it, which
//     the owner never rewrites; trimming drops the map's reference to chunks, not the snapshot's.
//  C5 every live entry with modified = m >= writes_complete_from has a write-log record at a
//     version in [e, m], e = the epoch start (snapshot version) that m belongs to: the first write
//     of the epoch logs (or gives the epoch up, which raises writes_complete_from past it), later
//     writes of the epoch find modified = version. Bases are snapshot versions, so trimming to a
//     base b never drops the record of an entry with modified >= b. The removal log's bound (C3)
//     holds for it likewise.
// Versions are limited to 2^32 - 1 (Entry::modified is 32 bits, as Flink limits its int version):
// snapshot() and rebase() throw std::overflow_error beyond.
//
// Flat engine (detail/flat_table.h, native/src/flat_map.cpp). Everything above describes the
// chained engine, which holds any keys and values. Most states hold keys and values of one width
// (an int64 key and an int64/float64 value, with or without the TTL suffix), and there a chained
// entry costs a 32-byte header, an allocation and a pointer chase per lookup: 84 bytes per
// int64 -> int64 entry and two dependent cache misses per access. So a map starts FLAT:
//  - Table: open addressing with linear probing over a paged slot array (pages of up to 16 KiB,
//    power-of-two capacity, minimum 4, load factor 3/4 checked with >= so a slot stays free).
//    A slot is {meta, key, value} inline: meta = the entry's `modified` version, or
//    empty / deleted. The first insert fixes the layout: the key width, the value width and, for
//    keys of 5+ bytes, their first byte (the key-group prefix, kept once per table). An int64 ->
//    int64 entry is a 20-byte slot: ~34 bytes per entry at the load of a 10M-entry state.
//  - Var layouts (string and binary keys): an insert of another key width or first byte
//    rewrites the table (same capacity, same homes, same `modified`: flat_relayout) into a var
//    layout, whose slots hold a size byte, the whole key and zero padding up to a key capacity
//    of 15, 23, 31, 39, 47 or 63 bytes (the smallest that holds the longest key so far; a longer
//    key moves the table up a class the same way). A key is then compared as whole words with
//    no length test. At most seven rewrites per map, so O(1) amortised per insert. Trade-off:
//    short keys in a class sized for long ones pay for the padding (a string state of 8-32
//    character keys: 52-byte slots) -- still no allocation, header or pointer per entry, and one
//    cache line per probe instead of the chained engine's head and chain of heap nodes.
//  - Conversion: an insert that does not fit any layout (another value width, a key over 63
//    bytes once keys vary, a key over 64 or a value over 256 bytes, a version past 2^32 - 3)
//    converts the map to the chained engine, once and for good: O(size) then, every entry
//    re-created with its `modified` (so change listings do not see a conversion). Snapshots keep
//    their flat tables. clear() forgets the layout (the next insert picks one again).
//  - Copy-on-write at page granularity: the same reference-counted directory and pages as the
//    chained bucket array, but a page holds the entries themselves, so the first write after a
//    snapshot to a page copies the page (up to 16 KiB) and nothing else; there is no entry-level
//    copy-on-write and no retire list (a snapshot's pages are immutable, I2-I4 hold by
//    construction). Trade-off: a write after a snapshot copies up to 16 KiB rather than one
//    entry and a 4 KiB bucket page: more bytes, no allocation per entry.
//  - Removal: backward-shift deletion (no tombstones) in a table that is not rehashing.
//  - Incremental rehash: as the chained engine, by slot position: rehash_index walks the OLD
//    table's slots; each operation first moves the live slots of up to 64 positions (at least 4
//    entries moved unless it ran out of positions) into the NEW table, and leaves the old slots
//    as they are (shared pages stay shared). A lookup probes the new table, then the old one, where
//    slots below rehash_index are stale: part of the probe sequence, never a match. Inserts go to
//    the new table; a write of a key still in the old table writes it there; a removal there leaves
//    a tombstone (kFlatDeleted), so the old table's probe sequences stay intact until it is freed.
//    Invariant F1: a live key is in exactly one place (new table, or old table at a slot >=
//    rehash_index). F2: every table keeps a free slot (load <= 3/4; during a rehash the new
//    table stays under 1/2: the old one holds <= 3/4 of its capacity and at most capacity/4
//    inserts happen before the migration ends).
//  - collect_buckets walks home slots (an entry's bucket is its home slot in the newest table),
//    with the chained engine's guarantees.
//  - stats: page_copies, directory_copies and rehashes as above; entry_copies counts entries a
//    rehash moved; retired_entries() is 0.
//  - Page memory (detail/page_pool.h): full pages (4 KiB and more) come from 2 MiB chunks
//    advised for transparent huge pages, so a state that outgrows the cache does not also miss
//    the TLB on nearly every probe (add_batch over 10M int64 keys: 1.75-2.19 -> 2.86-3.04 M
//    rows/s on the bench VM; no change in cache). STATECORE_PAGE_POOL=0 turns it off.
//    The chained engine's full pages and its entries (up to 512 bytes; 16-byte size classes)
//    come from the same chunks (add_batch over 10M string keys: 570-900 -> 505-520 ns a row).
//  - Batch lanes (detail/flat_lane.h): the fixed-value batch kernels check once per key group and
//    batch, not per row, what the inline fast path needs (flat, no rehash in flight, the layout
//    fits, an exclusive directory for writes) and keep the directory's geometry and the version.
//    Nothing but the lane's own slot writes and below-threshold inserts may touch the map while
//    a lane is open (a kernel closes it after any other call on the map); other threads only
//    lower reference counts. A lane ignores a pending sweep: a flat map has no retired entries.
//    A lane of a directory of up to 8 pages keeps its own copy of the page pointers and owned
//    bytes, so neither many small maps (high max parallelism) nor the 8-page maps of a 200k-key
//    state at max parallelism 128 cost a directory load a row. add_batch's hot rows
//    (batch.cpp, FoldHotRows) write through lanes too: in-place updates, and inserts and first
//    writes of an epoch that logs no writes (stamped, never logged; see log_write). Var
//    layouts open lanes too: a string row's key words are built in registers and compared
//    against its home slot's without the general path's calls (FlatLane::upsert_var).
//  - Owned pages (FlatDirectory::owned, detail/flat_table.h): a flat directory keeps one byte per
//    page, set when the owner made, copied or found the page exclusive, cleared for every page
//    when the directory is copied. Writers test that byte, beside the page pointer they load
//    anyway, not the page's reference count on the page's first cache line: over 10M int64
//    keys that count was a cache miss a row (add_batch 2.6-2.8 -> 4.0-4.6 M rows/s).
//
// Thread contract: all mutating calls and snapshot() come from one owning thread; a MapSnapshot
// may be read (sorted_entries) from any one other thread while the owner keeps mutating, and may
// be released (explicitly or by destruction) from any thread. A single MapSnapshot object must not
// be used by two threads at once. stats()/retired_entries() are owner-thread calls.
class StateMap {
 public:
  // nullptr: detail::default_key_hash (64-bit multiply/rotate + fmix64, folded to 32 bits).
  // An injected hash is passed through MurmurHash3 fmix32 before selecting the bucket.
  explicit StateMap(KeyHashFunction hash = nullptr, MapEngine engine = MapEngine::Default);
  ~StateMap();
  StateMap(const StateMap&) = delete;
  StateMap& operator=(const StateMap&) = delete;

  size_t size() const;
  // Bytes of keys + values held by live entries (not counting snapshot-only copies).
  size_t bytes() const;

  // Lookup; false when absent. *out stays valid until the next mutating call.
  // Keys and values are limited to 2^32-1 bytes each (std::length_error); a null pointer with a
  // nonzero size is std::invalid_argument.
  bool get(const uint8_t* key, size_t key_size, ByteView* out);
  // Insert or overwrite: returns `value_size` writable bytes owned by the map (copy-on-write
  // already applied); the caller fills them. Valid until the next mutating call (snapshot()
  // counts as one: writing through the pointer after a snapshot would change the snapshot).
  // A new entry's value bytes are zero; an overwrite of the same size keeps the old bytes.
  uint8_t* put(const uint8_t* key, size_t key_size, size_t value_size);
  // Writable access to an existing value (copy-on-write applied); nullptr when absent.
  uint8_t* get_for_update(const uint8_t* key, size_t key_size, size_t* value_size);
  // Cache hints for batch kernels (no effect on contents, versions or counters): a kernel hashes
  // a group of rows ahead, calls prefetch_bucket(h) for each, then prefetch_entry(h) for each,
  // then performs the rows' operations in order. hash() is the map's key hash (the injected one,
  // mixed, or the default); prefetch_entry also touches the first chained entry's header and key.
  uint32_t hash(const uint8_t* key, size_t key_size) const;
  // Read-modify-write in one lookup, for batch kernels that hashed the key already (`hash` must
  // be hash(key, key_size) of this map). Present: as get_for_update (*value_size = its size,
  // *inserted = false). Absent: as put(key, key_size, new_value_size) (zeroed bytes,
  // *value_size = new_value_size, *inserted = true). Errors as put().
  // A rehash in flight is completed first (O(size) once per doubling, amortised O(1) a row): a
  // batch is charged for its latency as a whole, and with both tables live every row took the
  // general path (probe both tables, one migration step), ~40% of a growing batch's work.
  // Single-row operations keep Flink's incremental steps.
  uint8_t* upsert(uint32_t hash, const uint8_t* key, size_t key_size, size_t new_value_size,
                  size_t* value_size, bool* inserted);
  // Read-modify-write that changes the value's size, for the list append / map put kernels
  // (`hash` = hash(key, key_size) of this map). Present: the value resized to new_value_size
  // bytes, its first min(old, new) bytes kept, bytes past the old size zero, *old_value_size =
  // the old size, marked written as put(). Absent: as put(key, key_size, new_value_size),
  // *old_value_size = 0. resize_by: new size = old size + `added` (a list append; absent: `added`).
  // Copy-on-write as put(): an entry a live snapshot may reach is copied (the snapshot keeps the
  // old bytes); one no snapshot reaches is realloc'd in place of itself, so growing a blob costs
  // no scratch copy and, when the allocator can extend it, no copy at all. A rehash in flight is
  // completed first (as upsert). The flat engine: a size other than the layout's converts the map
  // (as put()). Errors as put(); the result is valid until the next mutating call.
  uint8_t* resize(uint32_t hash, const uint8_t* key, size_t key_size, size_t new_value_size,
                  size_t* old_value_size);
  uint8_t* resize_by(uint32_t hash, const uint8_t* key, size_t key_size, size_t added,
                     size_t* old_value_size);
  // The general form (a map put's splice, in one lookup): the new size is plan(ctx, old bytes,
  // old size) -- old bytes nullptr and size 0 for an absent key -- called once the key is found
  // and before anything is written, so a plan that throws changes nothing (the old bytes are
  // read-only to it and die with the call). Otherwise as resize().
  using ResizePlan = size_t (*)(void* ctx, const uint8_t* old_value, size_t old_size);
  uint8_t* update_resized(uint32_t hash, const uint8_t* key, size_t key_size, ResizePlan plan,
                          void* ctx, size_t* old_value_size);
  // get() with the key's hash computed by the caller (hash(key, key_size) of this map).
  bool get_hashed(uint32_t hash, const uint8_t* key, size_t key_size, ByteView* out);
  void prefetch_bucket(uint32_t hash) const;
  void prefetch_entry(uint32_t hash) const;

  // True when the key was present.
  bool remove(const uint8_t* key, size_t key_size);
  void clear();
  // Pre-size an EMPTY map (size() == 0, no rehash in flight) for `entries` inserts: the table
  // gets the smallest power-of-two capacity whose 3/4 load holds `entries` (at most the
  // maximum; what the flat engine's growth reaches, the chained engine's or one doubling
  // less), so a bulk load (restore) runs no incremental rehash. Allocates only the directory (pages on first write), keeps the flat engine's
  // layout; snapshots of the empty map keep their tables. A no-op on a non-empty map, during a
  // rehash, or when the table is already that large. Contents, versions and change tracking
  // are unaffected.
  void reserve(size_t entries);

  // O(1) (independent of the number of entries). Several snapshots may be alive.
  std::shared_ptr<MapSnapshot> snapshot();

  // ---- change tracking (see "Change tracking" above); owner thread ----
  uint64_t base_version() const;
  // A checkpoint of the snapshot of this version completed: changes before it stop being tracked.
  // No-op when version <= base_version(); std::invalid_argument when version > version().
  void mark_base(uint64_t version);
  // After a bulk load: the current contents become the base. Returns the new base (= version()).
  // `applied_changes`: the load applied a change set (a catch-up to a later version), which,
  // like a closed epoch, predicts the next one: when it wrote more keys than the write log may
  // hold, the epoch that starts now logs nothing (Impl::start_epoch). A restore into an empty
  // map predicts nothing, as a fresh map's first epoch does not.
  uint64_t rebase(bool applied_changes = false);
  // Stops logging first writes for the rest of this epoch, as the log does past its limit: its
  // records are dropped and listings over the epoch walk. For a bulk load that rebase() follows
  // (load_entries), whose writes no listing reads. Sound at any time (C5).
  void give_up_write_log();
  // Records in the removal log / the write log (for memory accounting and tests).
  size_t removal_log_size() const;
  size_t write_log_size() const;
  // The write log may always hold this many records (default 1024), more only up to size / 16
  // (see "Change tracking"). Tuning and tests.
  void set_write_log_min(size_t records);

  // Visit live entries (unordered). fn(ByteView key, ByteView value).
  template <class Fn> void for_each(Fn&& fn);

  // Resumable walk (incremental TTL cleanup; Flink's StateIncrementalVisitor): copies the live
  // entries of whole buckets of the NEWEST table -- bucket b = hash & (newest capacity - 1) --
  // from bucket `*cursor` upward into `out` (cleared first; unsorted, no tombstones) until at least
  // `min_entries` entries were copied, the table ended, or max(64, 4 * min_entries) buckets were
  // looked at (a missing page counts as one), and advances *cursor. Returns true when the end of
  // the table was reached (*cursor is 0 again). The copies stay valid whatever the map does next,
  // so the caller may remove or rewrite the visited keys. During an incremental rehash bucket b of
  // the new table is read from the old table's chain b & (old capacity - 1) while that one is not
  // migrated. A cursor survives snapshots and rehashes: tables only double, so after a doubling
  // the walk goes on at the same index and at most revisits entries (of buckets split off below
  // it), never skips one; a cursor past the capacity (a value from elsewhere) restarts at 0.
  // O(buckets looked at + entries copied); never triggers a rehash step. Owner thread.
  bool collect_buckets(uint64_t* cursor, size_t min_entries, SortedRun* out) const;

  // Introspection for tests and stats.
  bool is_rehashing() const;
  size_t capacity() const;
  // True while the flat engine runs (a Flat map until its first conversion; see "Flat engine").
  bool is_flat() const;
  uint64_t version() const;
  size_t retired_entries() const;  // entries kept alive only for snapshots

  // Cumulative counters (owner thread).
  struct Stats {
    uint64_t entry_copies = 0;      // entries copied for copy-on-write (writes and migration)
    uint64_t page_copies = 0;       // bucket pages copied because a snapshot shared them
    uint64_t directory_copies = 0;  // directories copied because a snapshot shared them
    uint64_t entries_retired = 0;   // entries put on the retire list
    uint64_t retired_freed = 0;     // retired entries freed after their snapshots were released
    uint64_t rehashes = 0;          // incremental rehashes started
    uint64_t relayouts = 0;         // flat tables rewritten in a wider layout (flat engine)
    uint64_t snapshots = 0;         // snapshots taken
  };
  Stats stats() const;
  // Frees now the retired entries of released snapshots (otherwise done at the next operation).
  void reclaim();

  struct Impl;
  // The engine state, for the engine's own batch kernels (native/src/batch.cpp), which inline
  // the common case through detail/map_impl.h. Not an API.
  Impl& engine() { return *impl_; }
 private:
  std::shared_ptr<Impl> impl_;
  friend class MapSnapshot;
  void for_each_impl(void (*cb)(void*, ByteView, ByteView), void* ctx);
};

class MapSnapshot {
 public:
  ~MapSnapshot();  // releases
  void release();  // idempotent; after the last release the map stops copying
  size_t size() const;
  // Entries as of snapshot time, sorted ascending by key bytes (key_less), copied into a flat
  // run (sorted_run.h: one pass over the entries in bucket order, then sorting compact memory).
  // std::logic_error after release().
  SortedRun sorted_entries() const;
  // The same into `out`, reusing the buffers of `builder` and `out` (a writer listing many key
  // groups allocates once).
  void sorted_entries(SortedRunBuilder& builder, SortedRun& out) const;
  uint64_t version() const;
  // The map's base at snapshot time: the oldest base sorted_changes accepts.
  uint64_t base_version() const;
  // Changes since `base` (see "Change tracking" in StateMap's comment), sorted ascending by key
  // bytes like sorted_entries: a key present at snapshot time whose value was written since the
  // base (its value at snapshot time), or a key removed since the base and absent at snapshot
  // time (a tombstone: removed(i), empty value). O(w + r + c log c) over the w logged writes,
  // the r logged removals and the c changes when changes_from_log(base), else O(m + r + c log c)
  // over the m entries of the snapshot (a walk).
  // std::invalid_argument unless base_version() <= base <= version(); std::logic_error after
  // release(). Readable from another thread while the owner writes (thread contract below).
  SortedRun sorted_changes(uint64_t base) const;
  void sorted_changes(uint64_t base, SortedRunBuilder& builder, SortedRun& out) const;
  // True when the write log covers every epoch in [base, version()), so sorted_changes(base)
  // looks up the logged keys instead of walking the table.
  bool changes_from_log(uint64_t base) const;

  struct State;
  explicit MapSnapshot(std::unique_ptr<State> s);
 private:
  // The entry of `key` at snapshot time: its value and `modified`; false when absent.
  bool find_hashed(uint32_t hash, const uint8_t* key, size_t key_size, ByteView* value,
                   uint32_t* modified) const;
  // Requests the cache line(s) find_hashed(hash, ...) reads first: the home slot (flat) or
  // the bucket head (chained) in every table a lookup may probe. A hint only.
  void prefetch(uint32_t hash) const;
  std::unique_ptr<State> s_;
};

template <class Fn> void StateMap::for_each(Fn&& fn) {
  for_each_impl([](void* ctx, ByteView k, ByteView v) { (*static_cast<Fn*>(ctx))(k, v); }, &fn);
}

}  // namespace statecore
