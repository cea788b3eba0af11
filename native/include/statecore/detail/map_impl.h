// Engine state of StateMap and MapSnapshot (internal; invariants and thread contract: the class
// comment of StateMap in state_map.h; design: docs/state-map.md).
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "statecore/detail/entry.h"
#include "statecore/detail/flat_table.h"
#include "statecore/detail/key_hash.h"
#include "statecore/detail/key_log.h"
#include "statecore/detail/pages.h"
#include "statecore/detail/write_through.h"
#include "statecore/state_map.h"

namespace statecore {
namespace detail {
// The map hash of a key under the map's hash_fn. Always inlined: the batch kernels hash every
// row with it, and out of line (GCC's choice once the kernels grew) it cost a call and a
// prologue a row.
[[gnu::always_inline]] inline uint32_t map_key_hash(KeyHashFunction fn, const uint8_t* key,
                                                    size_t ks) {
  if (fn) return fmix32(fn(key, ks));
  return ks > 8 && ks <= 16 ? short_key_hash(key, ks) : default_key_hash(key, ks);
}
}  // namespace detail

struct StateMap::Impl {
  // An entry unlinked from the live table (removed, replaced by a copy, or reallocated) while a
  // live snapshot may still reach it. It was created at entry->version and unlinked at map
  // version `unlinked_at`; a snapshot of version s reaches it iff
  // entry->version < s <= unlinked_at.
  struct Retired {
    detail::Entry* entry;
    uint64_t unlinked_at;
  };

  Impl(KeyHashFunction h, bool start_flat);
  ~Impl();

  // ---- owner-thread state (only the owning thread reads or writes these) ----
  KeyHashFunction hash_fn;  // injected hash, or nullptr for detail::default_key_hash
  // Flat engine (docs/state-map.md "Flat engine"): while `flat`, the tables are
  // fprimary/frehash and the chained ones are null; rehash_index, the sizes, threshold and
  // live_bytes mean the same.
  bool flat;
  detail::FlatDirectory* fprimary = nullptr;  // the flat table; during a rehash the OLD one
  detail::FlatDirectory* frehash = nullptr;   // the NEW, twice as large flat table during a rehash
  detail::Directory* primary =
      nullptr;  // the table; during a rehash the OLD table (Flink primaryTable)
  detail::Directory* rehash_table = nullptr;  // the NEW table (2x) during a rehash, else nullptr
  size_t rehash_index = 0;       // old buckets [0, rehash_index) are migrated (and stale)
  size_t primary_size = 0;       // live entries reachable from `primary` buckets >= rehash_index
  size_t rehash_size = 0;        // live entries in `rehash_table`
  size_t threshold;              // 3/4 of the newest table's capacity; passing it starts a rehash
  size_t live_bytes = 0;         // key + value bytes of live entries
  uint64_t version = 0;          // map version: bumped by every snapshot(); new entries carry it
  uint64_t req = 0;              // `required` as read at the start of the current operation
  std::vector<Retired> retired;  // owner-only unless `orphaned` (then guarded by `mu`)
  Stats stats;
  // Change tracking: entries with modified >= base are changed; removals logged since `base`.
  uint64_t base = 0;        // only raised (mark_base, rebase)
  detail::KeyLog removals;  // removals of present keys, version order
  detail::KeyLog writes;    // first write of a key in each epoch, version order
  // Every epoch (version) >= it has all its first writes logged. 1 for a fresh map: its first
  // epoch (version 0, base 0) is not logged at all. Changes against the empty map are the whole
  // contents, which a listing gets by walking the table for about what reading the log would
  // cost, and a fresh map's first epoch is mostly inserts (every key of a new state is a first
  // write, and logging each would slow the inserts for nothing).
  uint64_t writes_complete_from = 1;
  size_t write_log_min = 1024;  // the write log may always hold this many records (log_write)
  // First writes of keys in the current epoch, logged or not (log_write counts them, FoldHotRows
  // where it stamps without a call). An epoch that had more than the log's limit makes the next
  // one start without a log (start_epoch): a Spark micro-batch that touches a large share of its
  // keys does so every micro-batch, and logging records only to drop them would take those rows
  // off the batch kernel's hot path.
  size_t epoch_writes = 0;
  // Set only inside StateMap::insert_clean / evict_clean (the tiered mode's loads and
  // evictions of entries the committed checkpoint holds): their inserts and removals are not
  // changes, so neither log records them.
  bool quiet = false;
  // The base at which evict_clean(spare_recent) last went round without finding a clean entry
  // older than base - 1 (0: none): until the base moves, none can appear.
  uint64_t evict_no_old_at = 0;
  // Write-through copy-on-write (detail/write_through.h): the state of the one live snapshot
  // while it has not been read, when it was taken of a flat map with no rehash in flight and no
  // other live snapshot; nullptr otherwise. Shared with the snapshot.
  std::shared_ptr<detail::WriteThrough> through;

  // ---- shared with threads that release snapshots ----
  // Highest version of a live snapshot, 0 when none (Flink highestRequiredSnapshotVersion).
  // Raised only by the owner (snapshot()); lowered by releases. The owner may read a stale,
  // higher value: that only causes a superfluous copy, never a missed one.
  std::atomic<uint64_t> required{0};
  std::atomic<bool> sweep_pending{false};  // a release happened: sweep `retired` at the next op
  std::mutex mu;                           // guards live_versions, orphaned
  std::vector<uint64_t> live_versions;     // versions of unreleased snapshots, ascending
  bool orphaned = false;                   // the StateMap is destroyed; releases sweep themselves

  uint32_t hash_of(const uint8_t* key, size_t ks) const {
    return detail::map_key_hash(hash_fn, key, ks);
  }
  // prefetch_bucket() inlined for batch kernels (flat engine; the chained one makes the call).
  // Always inlined: GCC's IPA pure-const pass counts __builtin_prefetch as no side effect, so an
  // outlined copy of this function (fnsplit made one) was "const", and every call to it, whose
  // result is void, was deleted as dead -- no flat prefetch was in the binary at all.
  [[gnu::always_inline]] void prefetch(uint32_t h) const {
    if (!flat) return;
    const detail::FlatDirectory* d = frehash ? frehash : fprimary;
    if (const uint8_t* s = d->slot(h & d->mask())) {
      __builtin_prefetch(s, 1, 3);
      __builtin_prefetch(s + 2 * d->stride() - 1, 1, 3);
    }
  }
  size_t size() const { return primary_size + rehash_size; }

  // Called first by every operation: deferred sweep, cache `required`, one incremental rehash step.
  void begin_op(bool rehash_step_allowed);
  // Called first by the batch writes (StateMap::upsert, update_resized): the "Batch exception"
  // of the class comment -- a flat map past its version limit is unflattened, and a rehash in
  // flight is completed at once (flat: one pass; chained: every remaining step).
  void begin_batch_write();
  void rehash_step();
  void start_rehash();

  // Table (as a pointer to the field, because copy-on-write may replace the directory) and bucket
  // for a hash: the old table when its bucket is not migrated yet, else the new one.
  detail::Directory** table_for(uint32_t h, size_t* bucket);
  size_t& size_of(detail::Directory** table) {
    return table == &primary ? primary_size : rehash_size;
  }
  detail::Entry* find(const detail::Directory* d, size_t bucket, uint32_t h, const uint8_t* key,
                      size_t ks) const;

  // Where a key is: hash, table, bucket and entry (nullptr when absent).
  struct Location {
    uint32_t h;
    detail::Directory** table;
    size_t bucket;
    detail::Entry* entry;
  };
  // The start of every keyed operation: begin_op(true), then hash, table_for and find.
  Location locate(const uint8_t* key, size_t ks) {
    return locate_hashed(hash_of(key, ks), key, ks);
  }
  Location locate_hashed(uint32_t h, const uint8_t* key, size_t ks);
  // Chained engine: a new entry for a key `at` found absent (nothing changed since); may start a
  // rehash. Returns its zeroed value bytes.
  uint8_t* chained_insert(const Location& at, const uint8_t* key, size_t ks, size_t vs);

  // Chained engine: the present entry at `at` (already logged as written) with its value resized
  // to vs (see StateMap::resize), stamped and relinked in place of the old one. Its value bytes.
  uint8_t* chained_resize(const Location& at, size_t vs);
  // Writable bucket slot: copies the directory and/or the page first when shared.
  detail::Entry** slot_for_write(detail::Directory** table, size_t bucket);
  // Writable link (bucket slot or predecessor's `next`) that points at `target`, copying the
  // chain entries above `target` that snapshots may reach (Flink handleChainedEntryCopyOnWrite).
  detail::Entry** writable_link(detail::Directory** table, size_t bucket, detail::Entry* target);
  detail::Entry* copy_entry(const detail::Entry* e);
  // The entry at `at`, made safe to write in place: an entry older than the required snapshot
  // version is replaced in its chain by a copy first (the old one goes to dispose()).
  detail::Entry* own_for_write(const Location& at);
  // Next map version (snapshot(), rebase()); std::overflow_error past UINT32_MAX (Entry::modified).
  uint64_t advance_version();
  // A present key is being removed: log it for change tracking.
  void log_removal(const detail::Entry* e) {
    if (quiet) return;
    removals.append(version, e->hash, e->key(), e->key_size);
  }
  // Whether this epoch logs first writes: false in a fresh map's first epoch (writes_complete_from
  // starts at 1) and once the epoch has given its log up (log_write), when a first write is
  // only stamped with the version.
  bool logs_writes() const { return writes_complete_from <= version; }
  // The first write of a key in this epoch (a new key, or log_rewrite: an entry whose previous
  // write is older than the epoch): log it. Past the log's limit (max(write_log_min, size / 16)
  // records) the epoch is given up instead: its records are dropped, it stops logging, and
  // listings over it walk the table (a change set that large costs a walk's order anyway).
  size_t write_log_limit() const {
    return size() / 16 > write_log_min ? size() / 16 : write_log_min;
  }
  void log_write(uint32_t h, const uint8_t* key, size_t ks) {
    if (quiet) return;
    ++epoch_writes;
    if (!logs_writes()) return;
    if (writes.size() >= write_log_limit()) {
      give_up_epoch_log();
      return;
    }
    writes.append(version, h, key, ks);
  }
  // The current epoch stops logging: its records are useless now (listings over it walk), so
  // they are freed and do not count against the next epoch's limit.
  void give_up_epoch_log() {
    writes.drop_from(version);
    writes_complete_from = version + 1;
  }
  // Called by snapshot() once the snapshot recorded writes_complete_from (its listings depend on
  // how the closed epochs were logged, not on this one): the epoch that starts now logs nothing
  // when the one just closed had more first writes than the log may hold -- it predicts a change
  // set that large again. A wrong guess costs one listing a walk instead of lookups, and the
  // epoch after a light one logs again. A fresh map's first epoch (version 0) predicts nothing:
  // filling an empty state says little about how much of it the next epochs change.
  void start_epoch() {
    if (version >= 2 && epoch_writes > write_log_limit() && writes_complete_from <= version)
      writes_complete_from = version + 1;
    epoch_writes = 0;
  }
  void log_rewrite(const detail::Entry* e) {
    if (e->modified != static_cast<uint32_t>(version)) log_write(e->hash, e->key(), e->key_size);
  }
  // The entry left the live table: free now, or retire while a live snapshot may reach it.
  void dispose(detail::Entry* e);
  // Frees retired entries no live snapshot reaches. Caller holds `mu`.
  void sweep_locked();

  template <class Fn>
  void visit_live(Fn&& fn);  // fn(Entry*); may free the visited entry

  // ---- flat engine (native/src/flat_map.cpp) ----
  // A write of the existing, writable flat slot `s` of a table of layout `l`: the key's first
  // write in this epoch is logged, the slot is stamped with the map version. Its value bytes.
  uint8_t* flat_mark_written(uint8_t* s, const detail::FlatLayout& l, uint32_t h,
                             const uint8_t* key, size_t ks) {
    if (detail::load_u32(s) != static_cast<uint32_t>(version)) log_write(h, key, ks);
    detail::store_u32(s, static_cast<uint32_t>(version));
    return s + 4 + l.suffix_size();
  }
  // A new key (fitting `l`) in the free, writable slot `s`: logged, stamped, its value zeroed,
  // counted in `table_size` and live_bytes. Its value bytes.
  uint8_t* flat_fill_new(uint8_t* s, const detail::FlatLayout& l, uint32_t h, const uint8_t* key,
                         size_t ks, size_t& table_size) {
    log_write(h, key, ks);
    detail::store_u32(s, static_cast<uint32_t>(version));
    l.store_key(s + 4, key, ks);
    std::memset(s + 4 + l.suffix_size(), 0, l.value_size);
    ++table_size;
    live_bytes += ks + l.value_size;
    return s + 4 + l.suffix_size();
  }

  // Batch kernels' inline upsert()/get_hashed() for the common case: the flat engine, no rehash
  // in flight (no migration step due), no snapshot release pending (no sweep due), the touched
  // page exclusive, and for an insert a free slot on an existing page below the load threshold.
  // Then they do exactly what upsert()/get_hashed() do, without the calls; otherwise they return
  // nullptr / -1 having changed nothing, and the caller makes the full call.
  uint8_t* flat_fast_upsert(uint32_t h, const uint8_t* key, size_t ks, size_t new_vs, size_t* vs,
                            bool* inserted) {
    if (!flat || frehash || sweep_pending.load(std::memory_order_relaxed) ||
        version > detail::kFlatMaxVersion)
      return nullptr;
    detail::FlatDirectory* d = fprimary;
    const detail::FlatLayout& l = d->layout;
    if (!l.fixed || !l.fits_key(key, ks) || d->refs.load(std::memory_order_acquire) != 1)
      return nullptr;
    const size_t mask = d->mask();
    const size_t stride = l.stride();
    const size_t n = l.suffix_size();
    uint64_t buf[detail::kFlatMaxKey / 8];
    const uint8_t* suffix = l.probe_key(key, ks, buf);
    size_t i = h & mask;
    for (size_t step = 0; step <= mask; ++step, i = (i + 1) & mask) {
      detail::FlatPage* p = d->pages()[i >> d->page_shift];
      if (!p) return nullptr;  // an insert would need a new page
      uint8_t* s = p->bytes() + (i & d->page_mask()) * stride;
      const uint32_t meta = detail::load_u32(s);
      if (meta == detail::kFlatEmpty) {
        if (new_vs != l.value_size || size() >= threshold || d->owned()[i >> d->page_shift] != 1)
          return nullptr;
        *vs = new_vs;
        *inserted = true;
        return flat_fill_new(s, l, h, key, ks, primary_size);
      }
      if (meta != detail::kFlatDeleted && detail::flat_key_equal(s + 4, suffix, n)) {
        if (d->owned()[i >> d->page_shift] != 1) return nullptr;
        *vs = l.value_size;
        *inserted = false;
        return flat_mark_written(s, l, h, key, ks);
      }
    }
    return nullptr;
  }
  // 1 found (*out set), 0 absent, -1 not the common case (see flat_fast_upsert).
  int flat_fast_get(uint32_t h, const uint8_t* key, size_t ks, ByteView* out) const {
    if (!flat || frehash || sweep_pending.load(std::memory_order_relaxed)) return -1;
    const detail::FlatDirectory* d = fprimary;
    const detail::FlatLayout& l = d->layout;
    if (!l.fixed || !l.fits_key(key, ks)) return l.fixed ? 0 : -1;
    size_t i;
    uint64_t buf[detail::kFlatMaxKey / 8];
    if (!detail::flat_probe(d, h, l.probe_key(key, ks, buf), 0, &i)) return 0;
    *out = ByteView{d->slot(i) + 4 + l.suffix_size(), l.value_size};
    return 1;
  }
  struct FlatLocation {
    uint32_t h;
    detail::FlatDirectory** table;  // where the key is; nullptr when absent
    size_t slot;
  };
  // begin_op(true), hash, then the probe (new table first during a rehash).
  FlatLocation flat_locate(uint32_t h, const uint8_t* key, size_t ks);
  // Value bytes for put() of a located key; false when the map had to convert to the chained
  // engine first (the caller then runs the chained put).
  bool flat_put(const FlatLocation& at, const uint8_t* key, size_t ks, size_t vs, uint8_t** value);
  // An existing entry's value made writable and marked written (get_for_update).
  uint8_t* flat_update(const FlatLocation& at, const uint8_t* key, size_t ks, size_t* vs);
  bool flat_remove(const uint8_t* key, size_t ks);
  void flat_clear();
  void flat_rehash_step();
  void flat_finish_rehash();  // every remaining step of the rehash in flight, in one pass
  void flat_start_rehash();
  // Rewrites every live slot in layout `nl` (same capacity, same homes, same `modified`):
  // a var table for keys of several sizes, or a larger var class. A rehash in flight is
  // completed first. O(size), at most once per class of kFlatVarKeyClasses plus once from the
  // fixed form, so amortised O(1) per insert. Snapshots keep their tables.
  void flat_relayout(const detail::FlatLayout& nl);
  // Slot i of *table made writable (directory and page copied if shared, page allocated if
  // missing; the page is then marked owned). The common case -- both owned alone -- inline: a
  // rehash calls it per moved entry.
  uint8_t* flat_slot_for_write(detail::FlatDirectory** table, size_t i) {
    detail::FlatDirectory* d = *table;
    if (d->refs.load(std::memory_order_acquire) == 1 && d->owned()[i >> d->page_shift] == 1)
      return d->pages()[i >> d->page_shift]->bytes() + (i & d->page_mask()) * d->stride();
    return flat_slot_for_write_slow(table, i);
  }
  uint8_t* flat_slot_for_write_slow(detail::FlatDirectory** table, size_t i);
  // The rehash's end: the old table is released and the new one becomes the only one.
  void flat_rehash_done();
  // Hash of the full key of a slot of `d` (prefix + suffix).
  uint32_t flat_hash_of(const detail::FlatDirectory* d, const uint8_t* slot) const;
  // The flat engine stops: every live entry becomes a chained entry with the same `modified`.
  // O(size); snapshots keep their flat tables.
  void unflatten();
  // fn(const FlatDirectory*, const uint8_t* slot) for every live slot.
  template <class Fn>
  void flat_visit_live(Fn&& fn) const;
  bool flat_collect(uint64_t* cursor, size_t min_entries, SortedRun* out,
                    std::vector<uint64_t>* stamps) const;
  size_t& flat_size_of(detail::FlatDirectory** t) {
    return t == &fprimary ? primary_size : rehash_size;
  }
  void release_snapshot(uint64_t v);  // any thread
  void teardown();                    // ~StateMap
  void reset_tables(size_t capacity);
};

namespace detail {
// Batch kernel calls in flight on this thread (Lanes: nested calls count once each) and the
// write-through states in which they hold a page (WriteThrough::hold), all given back when the
// outermost call ends.
extern thread_local uint32_t kernel_depth;
extern thread_local uint32_t through_claims_held;
void release_through_claims();
inline void enter_kernel() { ++kernel_depth; }
inline void leave_kernel() {
  if (--kernel_depth == 0 && through_claims_held != 0) release_through_claims();
}
}  // namespace detail

struct MapSnapshot::State {
  std::shared_ptr<StateMap::Impl> impl;  // keeps retired entries (and the mutex) alive
  bool flat = false;                     // taken from the flat engine: fprimary/frehash
  detail::FlatDirectory* fprimary = nullptr;
  detail::FlatDirectory* frehash = nullptr;
  detail::Directory* primary = nullptr;  // referenced directories as of snapshot time
  detail::Directory* rehash_table = nullptr;
  size_t rehash_index = 0;  // primary buckets below it were migrated: read them from rehash_table
  size_t size = 0;
  uint64_t version = 0;
  uint64_t base = 0;            // the map's base at snapshot time: changes are tracked from it
  detail::KeyLogView removals;  // the removal log as of snapshot time
  detail::KeyLogView writes;    // the write log as of snapshot time
  uint64_t writes_complete_from = 0;
  bool released = false;
  // Set while the owner may write the shared pages in place (detail/write_through.h): the first
  // read copies the table (MapSnapshot::capture).
  std::shared_ptr<detail::WriteThrough> through;
};

template <class Fn>
void StateMap::Impl::visit_live(Fn&& fn) {
  auto visit_table = [&](detail::Directory* d, size_t from) {
    if (!d) return;
    for (size_t b = from; b < d->capacity;) {
      detail::Page* p = d->pages()[b >> d->page_shift];
      if (!p) {
        b = (b | d->page_mask()) + 1;
        continue;
      }
      for (detail::Entry* e = p->slots()[b & d->page_mask()]; e;) {
        detail::Entry* n = e->next;
        fn(e);
        e = n;
      }
      ++b;
    }
  };
  visit_table(primary, rehash_table ? rehash_index : 0);
  visit_table(rehash_table, 0);
}

template <class Fn>
void StateMap::Impl::flat_visit_live(Fn&& fn) const {
  detail::flat_for_each_live(fprimary, frehash ? rehash_index : 0,
                             [&](const uint8_t* s, uint32_t) { fn(fprimary, s); });
  detail::flat_for_each_live(frehash, 0, [&](const uint8_t* s, uint32_t) { fn(frehash, s); });
}

}  // namespace statecore
