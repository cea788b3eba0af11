// Batch kernels' cached view of one flat map (engine internal; design: docs/state-map.md
// "Batch lanes").
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "statecore/detail/bytes.h"
#include "statecore/detail/map_impl.h"

namespace statecore {
namespace detail {

// The flat fast path's per-map facts, derived once when a kernel first touches the map in a batch
// rather than once per row (per row they would be a large share of an int64 row's map work):
// the map is flat with no rehash in flight and a version a slot can record, its layout fits the
// batch's keys (and values), and, for writes, its directory is exclusive; plus the directory's
// geometry and the map version. Sound while only lanes touch the map: a write of a slot or an
// insert below the load threshold changes none of these, and other threads only release
// snapshots, which lowers reference counts (an exclusive directory stays exclusive). Any other
// call on the map (the general upsert, put, get_for_update, remove) may rehash, convert, copy the
// directory or allocate a page, so a kernel closes the lane after one and reopens it at the
// map's next row. A release pending on another thread (sweep_pending) is not looked at: a flat
// map retires no entries, so the sweep has nothing to free; it runs at the map's next general
// operation, which also refreshes `req` (read by the chained engine only).
//
// The row-path members are always inlined: they run once a row, and GCC outlined them from the
// kernels' larger loops (a call and register spills a row).
//
// Fixed layouts open with a 1-byte prefix and a 4-16 byte key suffix (an int64 key with the void
// namespace or an int32 one, an int32 key with the void namespace, under either key-group
// prefix size): a key is then two overlapping words (8 bytes each for 8-16 byte suffixes, 4
// below), compared with two loads and no length test. Var layouts (string and binary keys)
// open too, on little-endian hosts: a key is the words of its key area (flat_var_words),
// built in registers a row and compared a word at a time.
struct alignas(64) FlatLane {
  // The first cache line holds what every row reads but its page pointer, the second the page
  // pointers of a map of up to kCopiedPages pages: a row touches two lines of its lane.
  // Capacities are below 2^31 (kMaxCapacity), so 32-bit masks.
  //
  // The directory's page array and owned[] (flat_table.h, for writes) -- or, for a directory of
  // at most kCopiedPages pages, page_copies and owned_copies, copies kept in the lane: loading a
  // row's page pointer from its directory is a cache miss that stalls the key hasher's slot
  // prefetch, both with many small maps (a high max parallelism) and with a few maps of several
  // pages each. Sound for
  // as long as the lane is open: neither changes then (a write that would change them, to a
  // missing or shared page, goes through the general path, which closes the lane).
  FlatPage* const* pages = nullptr;
  const uint8_t* owned = nullptr;
  StateMap::Impl* map = nullptr;
  uint32_t mask = 0;       // capacity - 1
  uint32_t page_mask = 0;  // slots per page - 1
  uint32_t page_last = 0;  // page_count - 1 (page_count is a power of two)
  uint32_t stride = 0;
  uint32_t version = 0;     // the map version, stamped on every write
  uint32_t epoch = 0;       // the owner's bookkeeping (open in the batch of this epoch)
  uint16_t value_size = 0;  // <= kFlatMaxValue
  uint8_t key_size = 0;     // 5..17 (open); var: the most a key may have, a kFlatVarKeyClasses
  uint8_t suffix = 0;       // key suffix bytes, 4..16; var: the key area's, 16..64
  uint8_t page_shift = 0;
  bool var = false;  // the table's layout is var (flat_table.h)
  // 8: the pages of a 4096-slot table of int64 keys and values (21-byte slots, 512 a page),
  // which the 128 key groups of a 200k-key state have; past 3,072 keys a map has 16.
  static constexpr size_t kCopiedPages = 8;
  uint8_t owned_copies[kCopiedPages] = {};
  FlatPage* page_copies[kCopiedPages] = {};

  // Takes the map's facts for keys of `ks` bytes starting with key[0] (the key-group prefix,
  // shared by the map's keys) and, vs != 0, values of vs bytes. False: the general path.
  bool open(StateMap::Impl& m, const uint8_t* key, size_t ks, size_t vs, bool write) {
    if (!m.flat || m.frehash || m.version > kFlatMaxVersion) return false;
    const FlatDirectory* d = m.fprimary;
    const FlatLayout& l = d->layout;
    const uint32_t n = l.suffix_size();
    const bool words = l.var ? !kBigEndianHost : l.prefix_size == 1 && n >= 4 && n <= 16;
    if (!l.fixed || !words || !l.fits_key(key, ks) || (vs != 0 && vs != l.value_size) ||
        (write && d->refs.load(std::memory_order_acquire) != 1))
      return false;
    var = l.var;
    map = &m;
    if (d->page_count <= kCopiedPages) {
      std::memcpy(page_copies, d->pages(), d->page_count * sizeof(FlatPage*));
      std::memcpy(owned_copies, d->owned(), d->page_count);
      pages = page_copies;
      owned = owned_copies;
    } else {
      pages = d->pages();
      owned = d->owned();
    }
    mask = static_cast<uint32_t>(d->mask());
    page_mask = static_cast<uint32_t>(d->page_mask());
    page_last = static_cast<uint32_t>(d->page_count - 1);
    page_shift = static_cast<uint8_t>(d->page_shift);
    stride = l.stride();
    suffix = static_cast<uint8_t>(n);
    key_size = static_cast<uint8_t>(l.key_size);
    value_size = static_cast<uint16_t>(l.value_size);
    version = static_cast<uint32_t>(m.version);
    // A state whose reader finished (or whose snapshot was released unread) is dropped: its
    // pages are the owner's again, written like any other.
    if (write && m.through) {
      if (m.through->done.load(std::memory_order_acquire)) m.through.reset();
      else m.through->begin_call();
    }
    return true;
  }

  // A write of slot `s` on page pi, whose owned[] byte is not 1: true when the lane may write
  // it in place now. An exclusive page (its snapshots released) becomes owned; a page shared
  // with the unread snapshot of the map's write-through state is written through
  // (WriteThrough::owner_write: the slot saved first unless it was written since the snapshot
  // or its page was copied already). False: the general path (which copies a shared page), also
  // when the snapshot's reader copies that page right now.
  [[gnu::noinline]] bool write_through(size_t pi, const uint8_t* s) {
    StateMap::Impl& m = *map;
    FlatPage* p = pages[pi];
    uint8_t o = owned[pi];
    WriteThrough* w = m.through.get();
    if (o == 0 || w == nullptr) {
      if (p->refs.load(std::memory_order_acquire) == 1) o = 1;
      else if (w == nullptr) return false;
      else o = 2;
      m.fprimary->owned()[pi] = o;
      if (owned == owned_copies) owned_copies[pi] = o;
    }
    return o != 2 || w->owner_write(static_cast<uint32_t>(pi),
                                    static_cast<uint32_t>(s - p->bytes()), s, version);
  }

  // Prefetches the home slot of hash h and the next one (a short probe) from the lane's
  // geometry; nothing when the home page was never written. A kernel's key hasher calls it a
  // group of rows ahead; going through the map instead (StateMap::Impl::prefetch: map, engine,
  // directory, page) would add those loads to every row.
  [[gnu::always_inline]] void prefetch(uint32_t h) const { prefetch_slot(home_slot(h)); }
  // The prefetch of a home slot as home_slot returned it (nullptr: nothing).
  [[gnu::always_inline]] void prefetch_slot(const uint8_t* s) const {
    if (s) {
      __builtin_prefetch(s, 1, 3);
      __builtin_prefetch(s + 2 * stride - 1, 1, 3);
    }
  }

  // Linear probe for the key whose suffix words (W: uint64_t for 8-16 byte suffixes, uint32_t
  // for 4-7 byte ones) are k0 (bytes [0, w)) and k1 (bytes [n - w, n)) from the home of h:
  // 1 found, 0 absent (*slot = the empty slot ending the probe), -1 a missing page on the way
  // or no empty slot at all (F2 broken; the general path copes). *page_index is the directory
  // index of the page holding *slot.
  // The probe steps a slot pointer within a page and looks the directory up only when crossing
  // one (flat_probe recomputed page and offset at every step).
  // kStride, kSuffix: the slots' stride and key suffix bytes when the caller knows them at
  // compile time (0: the lane's).
  template <class W, uint32_t kStride = 0, uint32_t kSuffix = 0>
  [[gnu::always_inline]] int find(uint32_t h, W k0, W k1, uint8_t** slot,
                                  size_t* page_index) const {
    uint8_t* s = home_slot<kStride>(h);
    if (!s) return -1;
    return find_from<W, kStride, kSuffix>(s, h, k0, k1, slot, page_index);
  }

  // The home slot of hash h, or nullptr when its page was never written. kStride as find's.
  template <uint32_t kStride = 0>
  [[gnu::always_inline]] uint8_t* home_slot(uint32_t h) const {
    const size_t home = h & mask;
    FlatPage* p = pages[home >> page_shift];
    return p ? p->bytes() + (home & page_mask) * (kStride ? kStride : stride) : nullptr;
  }

  // find() from `s`, the home slot of h as home_slot returned it while the lane was open: a
  // kernel's key hasher computes it a group of rows ahead (RowKeys::Group::slots), so that the
  // row's first load of its slot does not wait on the chain key group, lane, page array, page
  // (Lanes::generation says when a slot so computed is still sound).
  template <class W, uint32_t kStride = 0, uint32_t kSuffix = 0>
  [[gnu::always_inline]] int find_from(uint8_t* s, uint32_t h, W k0, W k1, uint8_t** slot,
                                       size_t* page_index) const {
    const size_t suffix = kSuffix ? kSuffix : this->suffix;
    return find_with<kStride>(
        s, h,
        [&](const uint8_t* key) {
          return word<W>(key) == k0 && word<W>(key + suffix - sizeof(W)) == k1;
        },
        slot, page_index);
  }

  // find_from() with the key test `eq(slot + 4)` (the slot's key area).
  template <uint32_t kStride, class Eq>
  [[gnu::always_inline]] int find_with(uint8_t* s, uint32_t h, Eq&& eq, uint8_t** slot,
                                       size_t* page_index) const {
    const size_t stride = kStride ? kStride : this->stride;
    const size_t home = h & mask;
    size_t pi = home >> page_shift;
    size_t k = home & page_mask;  // slot index within the page
    for (size_t crossings = 0;;) {
      const uint32_t meta = load_u32(s);
      if (meta == kFlatEmpty) {
        *slot = s;
        *page_index = pi;
        return 0;
      }
      // No kFlatDeleted test: tombstones exist only in the old table of a rehash, and a lane
      // never opens while one is in flight (open), so its table has none.
      if (eq(s + 4)) {
        *slot = s;
        *page_index = pi;
        return 1;
      }
      if (k++ != page_mask) {
        s += stride;
        continue;
      }
      if (crossings++ > page_last) return -1;  // every slot seen
      pi = (pi + 1) & page_last;
      FlatPage* p = pages[pi];
      if (!p) return -1;
      s = p->bytes();
      k = 0;
    }
  }

  // StateMap::upsert for a key of key_size bytes (first byte as at open), with the flat engine's
  // fast path's limits: nullptr, having changed nothing, when a page on the way is missing or
  // the slot's page is not known to be owned (owned[]: the page's own reference count is another
  // cache line, a miss a row in a large state), or an insert would reach the load threshold (the
  // caller then makes the general call, which marks the page owned). New values are value_size
  // zero bytes. `ks`: the key's size (key_size); a caller whose size is a constant (the int64
  // word rows) has the word width chosen at compile time.
  // Var lanes: any key of up to key_size bytes.
  [[gnu::always_inline]] uint8_t* upsert(uint32_t h, const uint8_t* key, size_t ks,
                                         bool* inserted) {
    if (var) return upsert_var(h, key, ks, inserted);
    return ks >= 9 ? upsert_words<uint64_t>(h, key, inserted)
                   : upsert_words<uint32_t>(h, key, inserted);
  }

  // upsert() of a key the map does not hold (a bulk load of unique keys into an empty map,
  // bulk_load.h load_blocks): the probe stops at the first free slot without comparing keys,
  // the key is stored and counted, its value bytes (returned) left for the caller to write.
  // nullptr, having changed nothing, as upsert. Var lanes upsert (their keys compare a word at a
  // time; a restore of string keys is not held up by the comparison).
  [[gnu::always_inline]] uint8_t* insert_new(uint32_t h, const uint8_t* key, size_t ks) {
    if (var) {
      bool inserted = false;
      return upsert_var(h, key, ks, &inserted);
    }
    return ks >= 9 ? insert_words<uint64_t>(h, key) : insert_words<uint32_t>(h, key);
  }

  // get_hashed: the value bytes (value_size of them) or nullptr when absent.
  [[gnu::always_inline]] const uint8_t* get(uint32_t h, const uint8_t* key, size_t ks) const {
    if (var) return get_var(h, key, ks);
    return ks >= 9 ? get_words<uint64_t>(h, key) : get_words<uint32_t>(h, key);
  }

  // A key of ks bytes fits the lane: its size for a fixed layout, at most key_size for a var one.
  [[gnu::always_inline]] bool fits(size_t ks) const {
    return ks == key_size || (var && ks < key_size);
  }

  // find() of a key of key_size bytes (first byte as at open) by its suffix words.
  template <class W, uint32_t kStride = 0, uint32_t kSuffix = 0>
  [[gnu::always_inline]] int find_key(uint32_t h, const uint8_t* key, uint8_t** slot,
                                      size_t* page_index) const {
    const size_t suffix = kSuffix ? kSuffix : this->suffix;
    return find<W, kStride, kSuffix>(h, word<W>(key + 1), word<W>(key + 1 + suffix - sizeof(W)),
                                     slot, page_index);
  }
  // find_from() of a key of key_size bytes (first byte as at open) by its suffix words.
  template <class W, uint32_t kStride = 0, uint32_t kSuffix = 0>
  [[gnu::always_inline]] int find_key_from(uint8_t* s, uint32_t h, const uint8_t* key,
                                           uint8_t** slot, size_t* page_index) const {
    const size_t suffix = kSuffix ? kSuffix : this->suffix;
    return find_from<W, kStride, kSuffix>(s, h, word<W>(key + 1),
                                          word<W>(key + 1 + suffix - sizeof(W)), slot, page_index);
  }
  // A new key in the free slot `s` that find_key returned, on an owned page, below the load
  // threshold: stamped with the version, its suffix stored, counted. Not logged (the caller
  // logs it when the epoch logs writes), its value bytes not written (the caller writes them;
  // a memset call here would put a call into FoldHotRows' loop). Its value bytes.
  template <class W>
  [[gnu::always_inline]] uint8_t* fill_new(uint8_t* s, const uint8_t* key) const {
    store_u32(s, version);
    set_word<W>(s + 4, word<W>(key + 1));
    set_word<W>(s + 4 + suffix - sizeof(W), word<W>(key + 1 + suffix - sizeof(W)));
    ++map->primary_size;
    map->live_bytes += key_size + value_size;
    return s + 4 + suffix;
  }

 private:
  template <class W>
  [[gnu::always_inline]] static W word(const uint8_t* p) {
    W w;
    std::memcpy(&w, p, sizeof(W));
    return w;
  }
  template <class W>
  [[gnu::always_inline]] static void set_word(uint8_t* p, W w) {
    std::memcpy(p, &w, sizeof(W));
  }

  template <class W>
  [[gnu::always_inline]] uint8_t* upsert_words(uint32_t h, const uint8_t* key, bool* inserted) {
    uint8_t* s;
    size_t pi;
    const int r = find_key<W>(h, key, &s, &pi);
    if (r < 0 || (owned[pi] != 1 && !write_through(pi, s))) return nullptr;
    StateMap::Impl& m = *map;
    if (r == 0) {
      if (m.size() >= m.threshold) return nullptr;
      *inserted = true;
      m.log_write(h, key, key_size);
      uint8_t* v = fill_new<W>(s, key);
      if (value_size == 8) store_u64(v, 0);
      else std::memset(v, 0, value_size);
      return v;
    }
    *inserted = false;
    if (load_u32(s) != version) m.log_write(h, key, key_size);
    store_u32(s, version);
    return s + 4 + suffix;
  }

  template <class W>
  [[gnu::always_inline]] uint8_t* insert_words(uint32_t h, const uint8_t* key) {
    uint8_t* s = home_slot(h);
    if (!s) return nullptr;
    size_t pi;
    const int r = find_with<0>(s, h, [](const uint8_t*) { return false; }, &s, &pi);
    if (r < 0 || (owned[pi] != 1 && !write_through(pi, s))) return nullptr;
    StateMap::Impl& m = *map;
    if (m.size() >= m.threshold) return nullptr;
    m.log_write(h, key, key_size);
    return fill_new<W>(s, key);
  }

  template <class W>
  [[gnu::always_inline]] const uint8_t* get_words(uint32_t h, const uint8_t* key) const {
    uint8_t* s;
    size_t pi;
    return find_key<W>(h, key, &s, &pi) == 1 ? s + 4 + suffix : nullptr;
  }

  // find() over a var lane, for a key whose area words (flat_var_words) are w[0, nw). The first
  // word alone first: it holds the size and the first 7 bytes, where keys almost always differ.
  [[gnu::always_inline]] int find_var(uint32_t h, const uint64_t* w, uint32_t nw, uint8_t** slot,
                                      size_t* page_index) const {
    uint8_t* s = home_slot(h);
    if (!s) return -1;
    const uint64_t w0 = w[0];
    return find_with<0>(
        s, h,
        [&](const uint8_t* area) {
          if (load_u64(area) != w0) return false;
          for (uint32_t i = 1; i < nw; ++i)
            if (load_u64(area + 8 * i) != w[i]) return false;
          return true;
        },
        slot, page_index);
  }

  // upsert() of a var lane: as upsert_words; a new key's area is its words, then zero words.
  // Out of line, unlike the fixed rows' members: a string row costs far more than a call anyway,
  // and inlined its word loops would enlarge the row loops that int64 keys share.
  [[gnu::noinline]] uint8_t* upsert_var(uint32_t h, const uint8_t* key, size_t ks, bool* inserted) {
    uint64_t w[kFlatMaxKey / 8];
    const uint32_t nw = flat_var_words(key, ks, w);
    uint8_t* s;
    size_t pi;
    const int r = find_var(h, w, nw, &s, &pi);
    if (r < 0 || (owned[pi] != 1 && !write_through(pi, s))) return nullptr;
    StateMap::Impl& m = *map;
    if (r == 0) {
      if (m.size() >= m.threshold) return nullptr;
      *inserted = true;
      m.log_write(h, key, ks);
      store_u32(s, version);
      uint8_t* area = s + 4;
      for (uint32_t i = 0; i < suffix / 8u; ++i) store_u64(area + 8 * i, i < nw ? w[i] : 0);
      ++m.primary_size;
      m.live_bytes += ks + value_size;
      uint8_t* v = area + suffix;
      std::memset(v, 0, value_size);
      return v;
    }
    *inserted = false;
    if (load_u32(s) != version) m.log_write(h, key, ks);
    store_u32(s, version);
    return s + 4 + suffix;
  }

  [[gnu::noinline]] const uint8_t* get_var(uint32_t h, const uint8_t* key, size_t ks) const {
    uint64_t w[kFlatMaxKey / 8];
    const uint32_t nw = flat_var_words(key, ks, w);
    uint8_t* s;
    size_t pi;
    return find_var(h, w, nw, &s, &pi) == 1 ? s + 4 + suffix : nullptr;
  }
};
static_assert(offsetof(FlatLane, page_copies) == 64 && sizeof(FlatLane) == 128,
              "a row reads the lane's first line and the line of its page pointer");

}  // namespace detail
}  // namespace statecore
