// PUBLIC API CONTRACT of the native state map (implementation: native/src/state_map.cpp and
// native/src/flat_map.cpp, internals in detail/; design: docs/state-map.md). The class comment
// states the invariants and trade-offs; detail/map_impl.h documents every field.
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

// Which engine a StateMap runs (docs/state-map.md "Two engines"). Default: the process
// default, Flat unless set_default_map_engine() or the environment variable
// STATECORE_MAP_ENGINE=chained (read once, at the first map) says Chained -- so whole test suites
// can run over either engine.
enum class MapEngine : uint8_t { Default, Flat, Chained };
void set_default_map_engine(MapEngine engine);  // Default resets to the environment's choice
MapEngine default_map_engine();

namespace detail {
struct Entry;
}

// Copy-on-write hash map from encoded key bytes to value bytes, one per (state, key group), after
// Flink's CopyOnWriteStateMap. Design, numbers of every structure and the reasons behind them:
// docs/state-map.md.
//
// Engines. A map starts flat (open addressing, entries inline in paged slot arrays; fixed-width
// keys, or var layouts of a size byte + key + zero padding for string/binary keys) and converts
// to chained (Flink's layout: paged bucket heads, one allocation per entry) once, on the first
// entry that fits no flat layout. Conversion keeps every entry's `modified`. Trade-off: the flat
// engine saves the header, allocation and pointer chase per entry but has no entry to copy: while
// its only snapshot is unread, batch kernels write shared pages through, saving each slot before
// its first write, and the snapshot's first reader copies the table page by page while the owner
// writes on (write-through copy-on-write, detail/write_through.h); otherwise a write copies a
// whole page (up to 16 KiB). The chained engine holds any key and value.
//
// Snapshots are versions. snapshot() bumps the map version to s and shares the table's
// directories (reference counted, as are their pages): O(1), no bucket copied (Flink copies the
// bucket array). A writer makes a shared directory or page exclusive before writing it, and in
// the chained engine copies an entry with version < required (the highest live snapshot version)
// instead of writing it, together with the chain prefix above it (Flink
// handleChainedEntryCopyOnWrite). Unlinked entries a live snapshot may reach go to a retire list
// and are freed on the owner thread once their snapshots are released (no GC).
//
// Incremental rehash (as Flink): doubling migrates a few buckets per operation (>= 4 entries,
// <= 64 buckets visited), lookups consult both tables meanwhile. Batch exception: upsert(),
// resize() and update_resized() complete a rehash in flight in one pass, trading a bounded stall
// (one key group's map, once per doubling) for throughput over a whole batch.
//
// Change tracking. Each entry records `modified`, the map version of its value's last write;
// copies keep it. Removals and each key's first write per epoch go to chunked logs shared with
// snapshots, so sorted_changes(base) costs what changed; an epoch past the write log's bound walks
// the table instead. mark_base() moves the base to a completed checkpoint; rebase() after loads.
//
// Invariants (the code relies on them; docs/state-map.md gives the reasoning):
//  I1 version >= every live snapshot version; required = max live snapshot version or 0.
//  I2 no entry with version < required (as last raised by the owner) is written.
//  I3 every directory/page reachable from a live snapshot is unchanged since the snapshot, but
//     flat pages written through for an unread snapshot (W1-W3 below).
//  I4 every entry reachable from a live snapshot is either in the live table or retired.
//  I5 size() = live entries; bytes() = sum of their key and value sizes.
//  I6 during a rehash, live entries with bucket (old) < rehash_index are in the new table only.
//  F1 (flat) a live key is in exactly one place: the new table, or the old at a slot
//     >= rehash_index.
//  F2 (flat) every table keeps a free slot (load <= 3/4; the new table of a rehash stays
//     under 1/2).
//  W1 (flat) a page marked written-through (owned 2) is shared only with the unread snapshot of
//     the map's write-through state and is written in place only by a kernel call holding the
//     map's gate, or the page (while the reader does not copy it), or after the reader copied
//     it; each slot written while its page was not copied was saved, with its bytes at snapshot
//     time, before.
//  W2 (flat) the snapshot's reader copies shared pages only holding the gate and, each, while
//     the owner does not hold it; it reads the saved slots only after its last page, then only
//     its own copy of the table.
//  W3 (flat) a map has a write-through state only while its snapshot is the only live one and
//     unread.
//  C1 base <= version; the base never decreases.
//  C2 an entry reachable from a snapshot of version s has modified < s.
//  C3 the removal log holds every removal at a version >= base, in version order.
//  C4 a snapshot's listing never changes after it was taken.
//  C5 every live entry with modified = m >= max(writes_complete_from, base) has a write-log
//     record at a version in [start of m's epoch, m] (a clean entry, insert_clean, has
//     m < base and no record).
// Versions are limited to 2^32 - 1 (32-bit `modified`, as Flink's int version):
// snapshot() and rebase() throw std::overflow_error beyond.
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
  // batch is charged for its latency as a whole, and with both tables live every row would take
  // the general path (probe both tables, one migration step).
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
  // less), so a bulk load (restore) runs no incremental rehash. Allocates only the directory
  // (pages on first write), keeps the flat engine's layout; snapshots of the empty map keep
  // their tables. A no-op on a non-empty map, during a
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
  // ---- tiered mode (docs/tiered.md): entries the committed checkpoint holds ----
  // Inserts `key` -> `value` as a CLEAN entry: stamped modified = base_version() - 1 (older than
  // the base, so no listing reports it: C2 holds, the entry is part of the base) and recorded
  // in neither log (a load is not a change). Returns false, changing nothing, when the key is
  // present (the map's entry is newer than the checkpoint's). std::logic_error while the base
  // is 0 (nothing is committed, so nothing can be clean). Errors as put(). Snapshots are
  // unaffected (copy-on-write as put()). Owner thread.
  bool insert_clean(const uint8_t* key, size_t key_size, const uint8_t* value, size_t value_size);
  // Removes clean entries (modified < base_version()) without logging them, until bytes() <=
  // target_bytes or no clean entry is left. Victims come in bucket order from the clock hand
  // `*cursor` (collect_buckets' cursor: it survives rehashes and snapshots), which advances past
  // them, so successive calls go round the table. Dirty entries (written since the base) stay:
  // the next incremental checkpoint needs them. With `spare_recent`, clean entries touched in
  // the last epoch (written in the epoch before the base, or loaded since it: stamped
  // base_version() - 1) stay too, a second chance as in CLOCK (Corbato 1968) with the write
  // epoch as the reference bit; once a round of the hand found no older one, such calls return
  // 0 at once until the base moves. Returns the entries removed. Owner thread.
  size_t evict_clean(size_t target_bytes, uint64_t* cursor, bool spare_recent = false);
  // Whether `key` is present with modified < base_version() (false when absent).
  bool is_clean(const uint8_t* key, size_t key_size);
  // Removes `key` without logging it when it is clean (is_clean); returns whether it did. The
  // tiered mode evicts a list's or a map's entries together with it (never part of one).
  // Owner thread.
  bool evict(const uint8_t* key, size_t key_size);

  // Records in the removal log / the write log (for memory accounting and tests).
  size_t removal_log_size() const;
  size_t write_log_size() const;
  // The write log may always hold this many records (default 1024), more only up to size / 16
  // (see "Change tracking"). Tuning and tests.
  void set_write_log_min(size_t records);

  // Visit live entries (unordered). fn(ByteView key, ByteView value).
  template <class Fn>
  void for_each(Fn&& fn);

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
  // O(buckets looked at + entries copied); never triggers a rehash step. Owner thread. With
  // `stamps`: also each copied entry's stamp (the epoch of its last write, "Change tracking"),
  // in the same order, so that a caller choosing victims by age needs no lookup per entry.
  bool collect_buckets(uint64_t* cursor, size_t min_entries, SortedRun* out,
                       std::vector<uint64_t>* stamps = nullptr) const;

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
  // Makes the snapshot's own copy of a table whose pages the owner writes through (see
  // "Write-through copy-on-write" in docs/state-map.md); a no-op otherwise. The first read.
  void capture() const;
  std::unique_ptr<State> s_;
};

template <class Fn>
void StateMap::for_each(Fn&& fn) {
  for_each_impl([](void* ctx, ByteView k, ByteView v) { (*static_cast<Fn*>(ctx))(k, v); }, &fn);
}

}  // namespace statecore
