// The flat engine of StateMap: open addressing over paged, copy-on-write slot arrays. Design and
// the conversion rule: docs/state-map.md "Flat engine"; invariants: StateMap's class comment
// (F1, F2); the slot layout: statecore/detail/flat_table.h.
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <utility>
#include <vector>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "statecore/detail/map_impl.h"

namespace statecore {

using detail::FlatDirectory;
using detail::FlatLayout;
using detail::FlatPage;
using detail::kFlatDeleted;
using detail::kFlatEmpty;
using detail::load_u32;
using detail::store_u32;
using detail::WriteThrough;

namespace {

constexpr size_t kMinTransferredPerStep = 4;  // as the chained engine (Flink's minimum)
constexpr size_t kMaxSlotVisitsPerStep = 64;

size_t threshold_for(size_t capacity) { return (capacity >> 1) + (capacity >> 2); }

// A growing state frees each old table after its migration, and the maps of one state (one per
// key group) grow in step, so the last wave of doublings leaves about half the state's size as
// free heap chunks between live pages, which glibc keeps in the process's resident memory.
// Every 32 MiB of tables freed by
// completed rehashes, the free pages go back to the system (glibc only; one trim per 32 MiB of
// growth, about 1.5M int64 entries).
constexpr size_t kTrimEveryBytes = size_t(32) << 20;
std::atomic<size_t> g_freed_by_rehash{0};

// Bytes that unref(d) is about to free (0 when a snapshot shares the directory).
size_t bytes_freed_by_unref(const FlatDirectory* d) {
  if (d->refs.load(std::memory_order_acquire) != 1) return 0;
  size_t bytes = 0;
  for (size_t i = 0; i < d->page_count; ++i) {
    const FlatPage* p = d->pages()[i];
    if (p && p->refs.load(std::memory_order_acquire) == 1)
      bytes += sizeof(FlatPage) + size_t(p->slot_count) * d->stride();
  }
  return bytes;
}

void note_freed(size_t bytes) {
  if (bytes && g_freed_by_rehash.fetch_add(bytes) + bytes >= kTrimEveryBytes) {
    g_freed_by_rehash.store(0);
#if defined(__GLIBC__)
    malloc_trim(0);
#endif
  }
}

bool live(uint32_t meta) { return meta != kFlatEmpty && meta != kFlatDeleted; }

// First empty slot from the home of `h` (the key is known to be absent from `d`).
size_t free_slot(const FlatDirectory* d, uint32_t h) {
  const size_t mask = d->mask();
  size_t i = h & mask;
  while (d->meta(i) != kFlatEmpty) i = (i + 1) & mask;
  return i;
}

// The map hash of a flat slot's key computed from the slot's own words, for the layouts where
// that is short_key_hash of prefix | suffix (default hash, 1-byte prefix, 9-16 byte keys, a
// little-endian host). Rebuilding the key in a buffer and hashing that read 8-byte words just
// written by narrower stores, which the CPU cannot forward: a stall per entry a rehash moves.
// Built once per table rather than tested per slot: the rehash
// loop runs it for every entry it moves.
struct SlotWordHash {
  uint64_t prefix;
  uint32_t key_size;

  static bool applies(KeyHashFunction hash_fn, const FlatLayout& l) {
    return !hash_fn && !l.var && l.prefix_size == 1 && l.key_size > 8 && l.key_size <= 16 &&
           !detail::kBigEndianHost;
  }
  explicit SlotWordHash(const FlatLayout& l) : prefix(l.prefix[0]), key_size(l.key_size) {}
  uint32_t operator()(const uint8_t* slot) const {
    const uint64_t a = prefix | (detail::load_u64(slot + 4) << 8);       // key bytes 0-7
    const uint64_t b = detail::load_u64(slot + 4 + (key_size - 1) - 8);  // the last 8
    return detail::short_key_hash_words(a, b, key_size);
  }
};

// How long the reader tries to take a map between two of the owner's kernel calls before it
// asks the owner to leave the map to it (WriteThrough::copy_pages).
constexpr std::chrono::microseconds kReaderPatience{200};

// The write-through states in which this thread holds a page (WriteThrough::hold), given back
// when the outermost kernel call ends (release_through_claims).
thread_local std::vector<std::shared_ptr<WriteThrough>> t_claims;

}  // namespace

namespace detail {
thread_local uint32_t kernel_depth = 0;
thread_local uint32_t through_claims_held = 0;

void release_through_claims() {
  for (auto& c : t_claims) c->end_call();
  t_claims.clear();
  through_claims_held = 0;
}

void WriteThrough::begin_call() {
  if (claimed_) return;
  claimed_ = true;
  t_claims.push_back(shared_from_this());
  ++through_claims_held;
  uint32_t g = kOpen;
  if (!reader_waiting_.load(std::memory_order_relaxed) &&
      gate_.compare_exchange_strong(g, kOwner, std::memory_order_acquire,
                                    std::memory_order_relaxed))
    whole_ = true;
}

int WriteThrough::hold(uint32_t page) {
  if (!claimed_) {
    claimed_ = true;
    t_claims.push_back(shared_from_this());
    ++through_claims_held;
  }
  // Dekker: publish the page, then look at the reader's; the reader does the same the other way
  // round, and sequential consistency lets at most one of the two miss the other's page.
  owner_page_.exchange(page, std::memory_order_seq_cst);
  held_ = page;
  if (reader_page_.load(std::memory_order_seq_cst) == page ||
      copied_[page].load(std::memory_order_acquire)) {
    const bool copied = copied_[page].load(std::memory_order_acquire);
    release_held();
    return copied ? 0 : -1;
  }
  return 1;
}

void WriteThrough::copy_pages(const uint8_t* const* src, uint8_t* const* dst, size_t n,
                              size_t bytes) {
  // The map first: taken in a gap between two of the owner's kernel calls, which then write
  // it page by page (hold) until the copy ends. A reader that found no gap for a while says it
  // waits, and the owner's next calls leave the map to it: it waits for one call at most, the
  // owner never.
  const auto t0 = std::chrono::steady_clock::now();
  for (unsigned spins = 0;; ++spins) {
    uint32_t g = kOpen;
    if (gate_.compare_exchange_weak(g, kReader, std::memory_order_acquire,
                                    std::memory_order_relaxed))
      break;
    if ((spins & 63) == 63 && !reader_waiting_.load(std::memory_order_relaxed) &&
        std::chrono::steady_clock::now() - t0 > kReaderPatience)
      reader_waiting_.store(true, std::memory_order_relaxed);
    through_backoff(spins);
  }
  std::vector<size_t> later;
  auto try_copy = [&](size_t i) {
    reader_page_.exchange(static_cast<uint32_t>(i), std::memory_order_seq_cst);
    if (owner_page_.load(std::memory_order_seq_cst) == i) return false;
    std::memcpy(dst[i], src[i], bytes);
    copied_[i].store(1, std::memory_order_release);
    return true;
  };
  for (size_t i = 0; i < n; ++i)
    if (src[i] && !try_copy(i)) later.push_back(i);
  // The owner gives a page back at its next write of another page of the map or at the end of
  // its kernel call: a page it held is free soon, unless the scheduler keeps the owner off the
  // CPU, which the yields leave it to.
  for (unsigned spins = 0; !later.empty(); ++spins) {
    size_t kept = 0;
    for (size_t i : later)
      if (!try_copy(i)) later[kept++] = i;
    later.resize(kept);
    if (kept == 0) break;
    // Not copying while it waits: the owner may write the page it marked.
    reader_page_.store(kNoPage, std::memory_order_release);
    through_backoff(spins);
  }
  reader_page_.store(kNoPage, std::memory_order_release);
}

void through_backoff(unsigned spins) {
  if (spins < 64) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  } else {
    std::this_thread::yield();
  }
}
}  // namespace detail

uint32_t StateMap::Impl::flat_hash_of(const FlatDirectory* d, const uint8_t* slot) const {
  const FlatLayout& l = d->layout;
  if (SlotWordHash::applies(hash_fn, l)) return SlotWordHash(l)(slot);
  uint8_t buf[detail::kFlatMaxKey];
  return hash_of(buf, detail::flat_full_key(l, slot, buf));
}

StateMap::Impl::FlatLocation StateMap::Impl::flat_locate(uint32_t h, const uint8_t* key,
                                                         size_t ks) {
  begin_op(true);
  FlatLocation at{h, nullptr, 0};
  const FlatLayout& l = fprimary->layout;
  if (!l.fixed || !l.fits_key(key, ks)) return at;  // cannot be stored here
  uint64_t buf[detail::kFlatMaxKey / 8];
  const uint8_t* suffix = l.probe_key(key, ks, buf);
  if (frehash && detail::flat_probe(frehash, at.h, suffix, 0, &at.slot)) {
    at.table = &frehash;
  } else if (detail::flat_probe(fprimary, at.h, suffix, frehash ? rehash_index : 0, &at.slot)) {
    at.table = &fprimary;
  }
  return at;
}

uint8_t* StateMap::Impl::flat_slot_for_write_slow(FlatDirectory** table, size_t i) {
  FlatDirectory* d = *table;
  if (d->refs.load(std::memory_order_acquire) != 1) {
    FlatDirectory* c = FlatDirectory::make_copy(d);
    FlatDirectory::unref(d);
    *table = d = c;
    ++stats.directory_copies;
  }
  FlatPage*& p = d->pages()[i >> d->page_shift];
  if (!p) {
    p = FlatPage::make_empty(static_cast<uint32_t>(d->page_mask() + 1), d->stride());
  } else if (p->refs.load(std::memory_order_acquire) != 1) {
    FlatPage* c = FlatPage::make_copy(p, d->stride());
    FlatPage::unref(p);
    p = c;
    ++stats.page_copies;
  }
  d->owned()[i >> d->page_shift] = 1;
  return p->bytes() + (i & d->page_mask()) * d->stride();
}

void StateMap::Impl::flat_start_rehash() {
  const size_t cap = fprimary->capacity;
  frehash = FlatDirectory::make(cap * 2, fprimary->layout);
  rehash_index = 0;
  threshold = threshold_for(cap * 2);
  ++stats.rehashes;
}

void StateMap::Impl::flat_rehash_step() {
  const FlatDirectory* old = fprimary;
  const size_t old_cap = old->capacity;
  const size_t stride = old->stride();
  size_t r = rehash_index;
  size_t moved = 0;
  size_t visits = 0;
  while (moved < kMinTransferredPerStep && visits < kMaxSlotVisitsPerStep && r < old_cap) {
    ++visits;
    const FlatPage* p = old->pages()[r >> old->page_shift];
    if (!p) {
      r = (r | old->page_mask()) + 1;
      continue;
    }
    const uint8_t* s = p->bytes() + (r & old->page_mask()) * stride;
    if (live(load_u32(s))) {
      // Moved as is: the same `modified`, so a migration is not a change. The old slot is left
      // alone (a snapshot may share its page); slots below rehash_index are never read again.
      const uint32_t h = flat_hash_of(old, s);
      detail::flat_copy_slot(flat_slot_for_write(&frehash, free_slot(frehash, h)), s, stride);
      ++moved;
    }
    ++r;
  }
  stats.entry_copies += moved;
  primary_size -= moved;
  rehash_size += moved;
  rehash_index = r;
  if (r == old_cap) flat_rehash_done();
}

void StateMap::Impl::flat_rehash_done() {
  const size_t freed = bytes_freed_by_unref(fprimary);
  FlatDirectory::unref(fprimary);
  note_freed(freed);
  fprimary = frehash;
  frehash = nullptr;
  primary_size += rehash_size;
  rehash_size = 0;
  rehash_index = 0;
}

void StateMap::Impl::flat_finish_rehash() {
  // flat_rehash_step's moves in one pass, without its per-step bookkeeping, and with each
  // destination's home slot prefetched kAhead entries before the move: the new table is twice
  // the old one and, in a large state, mostly not in cache, so each move was a miss. Entries are
  // moved in the same order as step by step, so the new table is laid out identically.
  //
  // Every page of the new table is made writable first (allocated, or copied if a snapshot
  // shares it): after the rehash the table is at least 3/8 full, so all of its pages but those
  // of a table smaller than two pages get entries anyway, and the moves then probe and write
  // through the page array alone instead of free_slot and flat_slot_for_write per move, each
  // looking the page up and testing it.
  constexpr size_t kAhead = 8;
  struct Move {
    const uint8_t* slot;
    uint32_t h;
  };
  const FlatDirectory* old = fprimary;
  const size_t old_cap = old->capacity;
  const size_t stride = old->stride();
  for (size_t pi = 0; pi < frehash->page_count; ++pi)
    flat_slot_for_write(&frehash, pi << frehash->page_shift);
  FlatPage* const* pages = frehash->pages();
  const size_t mask = frehash->mask();
  const uint32_t shift = frehash->page_shift;
  const size_t page_mask = frehash->page_mask();
  auto slot_at = [&](size_t i) { return pages[i >> shift]->bytes() + (i & page_mask) * stride; };
  Move ring[kAhead];
  size_t queued = 0;
  size_t moved = 0;
  auto place = [&](const Move& m) {
    size_t i = m.h & mask;
    uint8_t* dst = slot_at(i);
    while (load_u32(dst) != kFlatEmpty) dst = slot_at(i = (i + 1) & mask);
    detail::flat_copy_slot(dst, m.slot, stride);
  };
  const size_t per_page = old->page_mask() + 1;
  // Instantiated for SlotWordHash and for flat_hash_of, so the layouts SlotWordHash covers do
  // not pay flat_hash_of's layout tests for every entry moved.
  auto moves = [&](auto hash_slot) {
    for (size_t r = rehash_index; r < old_cap;) {
      const FlatPage* p = old->pages()[r >> old->page_shift];
      const size_t page_end = (r | old->page_mask()) + 1;
      if (!p) {
        r = page_end;
        continue;
      }
      const uint8_t* s = p->bytes() + (r & old->page_mask()) * stride;
      const uint8_t* const end = p->bytes() + per_page * stride;
      for (r = page_end; s != end; s += stride) {
        if (!live(load_u32(s))) continue;
        const Move m{s, hash_slot(s)};
        __builtin_prefetch(slot_at(m.h & mask), 1, 3);
        if (queued == kAhead) place(ring[moved % kAhead]);
        else ++queued;
        ring[moved % kAhead] = m;
        ++moved;
      }
    }
  };
  if (SlotWordHash::applies(hash_fn, old->layout)) moves(SlotWordHash(old->layout));
  else moves([&](const uint8_t* s) { return flat_hash_of(old, s); });
  for (size_t k = moved - queued; k < moved; ++k) place(ring[k % kAhead]);
  stats.entry_copies += moved;
  primary_size -= moved;
  rehash_size += moved;
  flat_rehash_done();
}

void StateMap::Impl::flat_relayout(const FlatLayout& nl) {
  if (frehash) flat_finish_rehash();
  const FlatDirectory* old = fprimary;
  const FlatLayout& ol = old->layout;
  FlatDirectory* nd = FlatDirectory::make(old->capacity, nl);
  const size_t mask = nd->mask();
  const size_t vs = nl.value_size;
  uint8_t buf[detail::kFlatMaxKey];
  detail::flat_for_each_live(old, 0, [&](const uint8_t* s, uint32_t meta) {
    const size_t ks = detail::flat_full_key(ol, s, buf);
    size_t i = hash_of(buf, ks) & mask;  // the hash of the key, so its home, does not change
    uint8_t* dst = flat_slot_for_write(&nd, i);
    while (load_u32(dst) != kFlatEmpty) dst = flat_slot_for_write(&nd, i = (i + 1) & mask);
    store_u32(dst, meta);  // the same `modified`: a relayout is not a change
    nl.store_key(dst + 4, buf, ks);
    if (vs) std::memcpy(dst + 4 + nl.suffix_size(), s + 4 + ol.suffix_size(), vs);
  });
  const size_t freed = bytes_freed_by_unref(fprimary);
  FlatDirectory::unref(fprimary);
  note_freed(freed);
  fprimary = nd;
  ++stats.relayouts;
}

bool StateMap::Impl::flat_put(const FlatLocation& at, const uint8_t* key, size_t ks, size_t vs,
                              uint8_t** value) {
  FlatLayout& l = fprimary->layout;
  if (at.table) {
    if (vs != l.value_size) {
      unflatten();
      return false;
    }
    uint8_t* s = flat_slot_for_write(at.table, at.slot);
    // The layout again, not `l`: the write may have replaced the directory by a copy, and a
    // snapshot released meanwhile on another thread leaves this map the last owner of the one
    // `l` is in, which the replacement then freed.
    *value = flat_mark_written(s, fprimary->layout, at.h, key, ks);
    return true;
  }
  if (!l.fixed) {
    // An empty table without a layout (new or cleared; never rehashing): the first insert picks
    // it. A fresh directory, because a snapshot of the empty map may share the current one.
    FlatLayout nl;
    if (!FlatLayout::make(key, ks, vs, &nl)) {
      unflatten();
      return false;
    }
    const size_t cap = fprimary->capacity;
    FlatDirectory::unref(fprimary);
    fprimary = FlatDirectory::make(cap, nl);
  } else if (!l.fits_key(key, ks) || vs != l.value_size) {
    // Another key size or first byte: the var form (or a larger var class) holds both, unless
    // the value size differs too or a key is too long for any var class.
    FlatLayout nl;
    if (vs != l.value_size || !FlatLayout::make_var(ks > l.key_size ? ks : l.key_size, vs, &nl)) {
      unflatten();
      return false;
    }
    flat_relayout(nl);
  }
  // >= rather than the chained engine's >: open addressing needs a free slot in every table.
  if (size() >= threshold && !frehash) {
    if (fprimary->capacity >= detail::kMaxCapacity) {
      unflatten();
      return false;
    }
    flat_start_rehash();
  }
  FlatDirectory** t = frehash ? &frehash : &fprimary;
  uint8_t* s = flat_slot_for_write(t, free_slot(*t, at.h));
  *value = flat_fill_new(s, (*t)->layout, at.h, key, ks, flat_size_of(t));
  return true;
}

uint8_t* StateMap::Impl::flat_update(const FlatLocation& at, const uint8_t* key, size_t ks,
                                     size_t* vs) {
  uint8_t* s = flat_slot_for_write(at.table, at.slot);
  const FlatLayout& l = (*at.table)->layout;
  if (vs) *vs = l.value_size;
  return flat_mark_written(s, l, at.h, key, ks);
}

bool StateMap::Impl::flat_remove(const uint8_t* key, size_t ks) {
  const FlatLocation at = flat_locate(hash_of(key, ks), key, ks);
  if (!at.table) return false;
  FlatDirectory** t = at.table;
  if (!quiet) removals.append(version, at.h, key, ks);
  --flat_size_of(t);
  live_bytes -= ks + (*t)->layout.value_size;
  if (frehash && t == &fprimary) {
    // The old table of a rehash keeps its clusters intact for probes over migrated slots: a
    // tombstone, which the migration skips and which dies with the table.
    store_u32(flat_slot_for_write(t, at.slot), kFlatDeleted);
    return true;
  }
  // Backward-shift deletion (no tombstones): every later entry of the cluster whose home is not
  // cyclically in (hole, j] moves into the hole, so probes never need tombstones.
  const size_t mask = (*t)->mask();
  const size_t stride = (*t)->stride();
  size_t hole = at.slot;
  for (size_t j = (hole + 1) & mask;; j = (j + 1) & mask) {
    const uint8_t* sj = (*t)->slot(j);
    if (!sj || load_u32(sj) == kFlatEmpty) break;
    const size_t home = flat_hash_of(*t, sj) & mask;
    const bool stays = hole <= j ? (hole < home && home <= j) : (hole < home || home <= j);
    if (stays) continue;
    uint8_t* dst = flat_slot_for_write(t, hole);
    std::memcpy(dst, (*t)->slot(j), stride);  // re-read: the write may have copied pages
    hole = j;
  }
  store_u32(flat_slot_for_write(t, hole), kFlatEmpty);
  return true;
}

void StateMap::Impl::flat_clear() {
  begin_op(false);
  flat_visit_live([this](const FlatDirectory* d, const uint8_t* s) {
    uint8_t buf[detail::kFlatMaxKey];
    const size_t ks = detail::flat_full_key(d->layout, s, buf);
    removals.append(version, hash_of(buf, ks), buf, ks);
  });
  const size_t cap = frehash ? frehash->capacity : fprimary->capacity;
  FlatDirectory::unref(fprimary);
  FlatDirectory::unref(frehash);
  fprimary = FlatDirectory::make(cap, FlatLayout{});
  frehash = nullptr;
  rehash_index = 0;
  primary_size = rehash_size = 0;
  live_bytes = 0;
  threshold = threshold_for(cap);
}

void StateMap::Impl::unflatten() {
  const size_t cap = frehash ? frehash->capacity : fprimary->capacity;
  const size_t n = size();
  primary = detail::Directory::make(cap);
  rehash_table = nullptr;
  flat_visit_live([this, cap](const FlatDirectory* d, const uint8_t* s) {
    uint8_t buf[detail::kFlatMaxKey];
    const size_t ks = detail::flat_full_key(d->layout, s, buf);
    const uint32_t h = hash_of(buf, ks);
    const size_t vs = d->layout.value_size;
    detail::Entry* e = detail::Entry::make(h, buf, ks, vs, version);
    e->modified = load_u32(s);
    if (vs) std::memcpy(e->value(), s + 4 + d->layout.suffix_size(), vs);
    detail::Entry** slot = slot_for_write(&primary, h & (cap - 1));
    e->next = *slot;
    *slot = e;
  });
  FlatDirectory::unref(fprimary);
  FlatDirectory::unref(frehash);
  fprimary = frehash = nullptr;
  primary_size = n;
  rehash_size = 0;
  rehash_index = 0;
  threshold = threshold_for(cap);
  flat = false;
}

bool StateMap::Impl::flat_collect(uint64_t* cursor, size_t min_entries, SortedRun* out,
                                  std::vector<uint64_t>* stamps) const {
  // Walks home slots (not slot positions): bucket b = the entries whose home in the newest table
  // is b, wherever probing placed them (always in the cluster that starts at or before b and
  // runs past it). An entry keeps its home until the table doubles and backward shifts never
  // move an entry before its home, so removals of visited keys cannot hide unvisited ones, and
  // the guarantees are the chained engine's (each entry once per pass; after a doubling at most
  // revisits).
  const FlatDirectory* newest = frehash ? frehash : fprimary;
  const size_t cap = newest->capacity;
  const size_t max_visits = min_entries <= 16            ? 64
                            : min_entries > SIZE_MAX / 4 ? SIZE_MAX
                                                         : 4 * min_entries;
  size_t b = *cursor < cap ? static_cast<size_t>(*cursor) : 0;
  if (!newest->layout.fixed) b = cap;
  uint8_t buf[detail::kFlatMaxKey];
  auto add = [&](const FlatDirectory* d, const uint8_t* s) {
    if (stamps != nullptr) stamps->push_back(load_u32(s));
    const size_t ks = detail::flat_full_key(d->layout, s, buf);
    out->key_data.insert(out->key_data.end(), buf, buf + ks);
    out->key_offsets.push_back(out->key_data.size());
    const uint8_t* v = s + 4 + d->layout.suffix_size();
    out->value_data.insert(out->value_data.end(), v, v + d->layout.value_size);
    out->value_offsets.push_back(out->value_data.size());
  };
  // Entries of `d` with home `home` in `d` and (newest) bucket b; slots below `migrated_below`
  // are stale copies: part of the cluster, never collected.
  auto scan = [&](const FlatDirectory* d, size_t home, size_t migrated_below) {
    const size_t mask = d->mask();
    for (size_t i = home, step = 0; step <= mask; ++step, i = (i + 1) & mask) {
      const uint8_t* s = d->slot(i);
      if (!s) return;
      const uint32_t meta = load_u32(s);
      if (meta == kFlatEmpty) return;
      if (!live(meta) || i < migrated_below) continue;
      const uint32_t h = flat_hash_of(d, s);
      if ((h & mask) == home && (h & (cap - 1)) == b) add(d, s);
    }
  };
  for (size_t visits = 0; b < cap && out->size() < min_entries && visits < max_visits; ++visits) {
    if (!frehash && newest->pages()[b >> newest->page_shift] == nullptr) {
      b = (b | newest->page_mask()) + 1;  // no slot there, so no entry has its home there
      continue;
    }
    scan(newest, b, 0);
    if (frehash) scan(fprimary, b & fprimary->mask(), rehash_index);
    ++b;
  }
  if (b >= cap) {
    *cursor = 0;
    return true;
  }
  *cursor = b;
  return false;
}

}  // namespace statecore
