// Paged open-addressing slot arrays of the state map's flat engine (engine internal; design:
// docs/state-map.md "Flat engine").
//
// A flat table is a FlatDirectory of FlatPages of fixed-stride slots, both reference counted
// exactly like the chained engine's Directory/Page (detail/pages.h): the live map and every
// snapshot hold one reference to a directory, a directory one to each of its pages, the owner
// copies a directory or a page only when it is about to write into a shared one, and a null page
// is a page of empty slots. The difference is what a page holds: not bucket heads pointing at
// separately allocated entries, but the entries themselves, so a lookup touches one cache line
// (usually) instead of a head and a chain of heap nodes, and an entry costs its own bytes and
// nothing else (no header, no allocator overhead, no pointer).
//
// Slot (stride = 4 + suffix_size + value_size bytes, no padding, read with memcpy):
//   meta (uint32, native endian): kEmpty, kDeleted, or the map version of the last write of the
//        value (StateMap's `modified`, Flink stateVersion)
//   key area (suffix_size bytes), one of two forms:
//     fixed: the encoded key without its first prefix_size bytes, which every key of the table
//        shares (the key-group prefix: one StateMap per key group) and the layout keeps once;
//     var (keys of different sizes, up to key_size bytes: string and binary keys): the key's
//        size in one byte, the whole key, zeros to the end of the area. A key is then compared
//        as the area's words, with no length test and no call: the size byte makes keys of
//        different sizes differ, the zero padding makes the rest of equal keys equal.
//   value bytes
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>

#include "statecore/detail/bytes.h"
#include "statecore/detail/page_pool.h"

namespace statecore {
namespace detail {

constexpr uint32_t kFlatEmpty = 0xFFFFFFFFu;
constexpr uint32_t kFlatDeleted = 0xFFFFFFFEu;  // only in the old table of a rehash
// Highest map version a flat slot can record; a map past it converts to the chained engine.
constexpr uint64_t kFlatMaxVersion = 0xFFFFFFFDu;
constexpr size_t kFlatMaxKey = 64;  // larger keys or values: the chained engine
constexpr size_t kFlatMaxValue = 256;
constexpr size_t kFlatPageBytes = 16384;  // slots per page: the power of two that fits
// The key capacities of var layouts: each makes a key area (size byte + key) of a whole number
// of 8-byte words, compared word by word. A table takes the smallest that holds its longest key
// and moves up a class when a longer key arrives (StateMap::Impl::flat_relayout), so a state of
// short strings does not pay for the longest a var table can hold.
constexpr uint32_t kFlatVarKeyClasses[] = {15, 23, 31, 39, 47, 63};
constexpr size_t kFlatMaxVarKey =
    kFlatVarKeyClasses[sizeof(kFlatVarKeyClasses) / sizeof(kFlatVarKeyClasses[0]) - 1];

// What every slot of a table holds. A table without a layout (`key_size == 0 && !fixed`) is
// empty and takes the layout of its first insert.
struct FlatLayout {
  bool fixed = false;        // the table has a layout (either form, see the file comment)
  bool var = false;          // the var form: keys of any size up to key_size
  uint32_t key_size = 0;     // bytes of every encoded key (var: the most a key may have)
  uint32_t prefix_size = 0;  // leading key bytes shared by every key, kept in `prefix`
  uint32_t value_size = 0;
  // 4 + suffix_size() + value_size, kept rather than summed: the batch kernels' slot prefetch
  // computes a slot address a row.
  uint32_t slot_stride = 4;
  uint8_t prefix[1] = {0};

  // Bytes of a slot's key area: the value starts 4 + suffix_size() bytes into a slot.
  uint32_t suffix_size() const { return var ? key_size + 1 : key_size - prefix_size; }
  uint32_t stride() const { return slot_stride; }
  // True when a key of `ks` bytes starting with `key` can live in a table of this layout.
  bool fits_key(const uint8_t* key, size_t ks) const {
    if (var) return ks <= key_size;
    return ks == key_size && (prefix_size == 0 || key[0] == prefix[0]);
  }
  // Writes the key area of a key that fits (suffix_size() bytes at `area`).
  void store_key(uint8_t* area, const uint8_t* key, size_t ks) const {
    if (!var) {
      std::memcpy(area, key + prefix_size, suffix_size());
      return;
    }
    // Zeroed a word at a time (the area is whole words), then the size byte and the key.
    for (uint32_t i = 0; i < suffix_size(); i += 8) std::memset(area + i, 0, 8);
    area[0] = static_cast<uint8_t>(ks);
    if (ks) std::memcpy(area + 1, key, ks);
  }
  // What a probe compares slots' key areas with: the key's own bytes after the prefix (fixed),
  // or its key area written into `buf` (var; kFlatMaxKey bytes aligned to 8, flat_var_words).
  // The key must fit.
  const uint8_t* probe_key(const uint8_t* key, size_t ks, uint64_t* buf) const;
  // The layout a table takes from its first key and value: the first byte of keys of 5 or more
  // bytes is the key-group prefix (the first byte of a 2-byte prefix), shared by the map's keys
  // (5: the shortest whose suffix a flat lane takes, an int32 key's with its namespace byte).
  static bool make(const uint8_t* key, size_t ks, size_t vs, FlatLayout* out) {
    if (ks > kFlatMaxKey || vs > kFlatMaxValue) return false;
    FlatLayout l;
    l.fixed = true;
    l.key_size = static_cast<uint32_t>(ks);
    l.prefix_size = ks >= 5 ? 1 : 0;
    if (l.prefix_size) l.prefix[0] = key[0];
    l.value_size = static_cast<uint32_t>(vs);
    l.slot_stride = 4 + l.suffix_size() + l.value_size;
    *out = l;
    return true;
  }
  // The var layout for keys of up to `max_ks` bytes and values of `vs` bytes: the smallest
  // class of kFlatVarKeyClasses that holds max_ks. False when none does or vs is too large.
  static bool make_var(size_t max_ks, size_t vs, FlatLayout* out) {
    if (max_ks > kFlatMaxVarKey || vs > kFlatMaxValue) return false;
    FlatLayout l;
    l.fixed = true;
    l.var = true;
    for (uint32_t c : kFlatVarKeyClasses) {
      if (c >= max_ks) {
        l.key_size = c;
        break;
      }
    }
    l.value_size = static_cast<uint32_t>(vs);
    l.slot_stride = 4 + l.suffix_size() + l.value_size;
    *out = l;
    return true;
  }
};
static_assert(kFlatMaxVarKey + 1 <= kFlatMaxKey, "a var key area fits a kFlatMaxKey buffer");

// The first ceil((ks + 1) / 8) words of the var key area of a key of ks <= kFlatMaxVarKey bytes
// (little-endian hosts): what a slot holding that key has there, and every later word of its
// area is zero. So a probe compares those words alone: a slot whose first word matches holds a
// key of the same size, whose area has the same number of words before its zeros.
//
// Built in registers from loads of the key (area byte j >= 1 is key byte j - 1): word 0 = size |
// key[0, 7) << 8, word w >= 1 = key[8w - 1, 8w + 7) while that is within the key, then the key's
// last bytes shifted down from its last 8 (no byte past the key is read).
inline uint32_t flat_var_words(const uint8_t* key, size_t ks, uint64_t* w) {
  if (ks < 8) {
    uint64_t x = ks;
    for (size_t i = 0; i < ks; ++i) x |= uint64_t(key[i]) << (8 * (i + 1));
    w[0] = x;
    return 1;
  }
  w[0] = ks | (load_u64(key) << 8);
  uint32_t n = 1;
  for (; 8 * n + 7 <= ks; ++n) w[n] = load_u64(key + 8 * n - 1);
  const size_t rest = ks + 1 - 8 * size_t(n);  // area bytes left: 0..7
  if (rest) w[n++] = load_u64(key + ks - 8) >> (8 * (8 - rest));
  return n;
}

// The probe's words are stored as aligned 8-byte words, so that the probe reads each back from
// exactly one store. Written by store_key (a size byte, a memcpy, zero words), every word the
// probe compared would be read across narrower or misaligned stores, which the CPU cannot
// forward: a stall each.
inline const uint8_t* FlatLayout::probe_key(const uint8_t* key, size_t ks, uint64_t* buf) const {
  if (!var) return key + prefix_size;
  uint8_t* const area = reinterpret_cast<uint8_t*>(buf);
  if (kBigEndianHost) {  // flat_var_words is little-endian
    store_key(area, key, ks);
    return area;
  }
  for (uint32_t w = flat_var_words(key, ks, buf); w < suffix_size() / 8; ++w) buf[w] = 0;
  return area;
}

struct FlatPage {
  std::atomic<uint32_t> refs;
  uint32_t slot_count;

  uint8_t* bytes() { return reinterpret_cast<uint8_t*>(this + 1); }
  const uint8_t* bytes() const { return reinterpret_cast<const uint8_t*>(this + 1); }

  // `pooled`: from the huge-page pool (page_pool.h), for pages probed at random; else from the
  // C++ heap, for a snapshot's own copy of a table (MapSnapshot::capture), which is read once in
  // order and whose first use would fault in a huge page a chunk.
  static FlatPage* make_empty(uint32_t n, uint32_t stride, bool pooled = true) {
    const size_t bytes = sizeof(FlatPage) + size_t(n) * stride;
    void* mem = pooled ? page_alloc(bytes) : ::operator new(bytes);
    FlatPage* p = new (mem) FlatPage{{1}, n};
    uint8_t* b = p->bytes();
    for (uint32_t i = 0; i < n; ++i) store_u32(b + size_t(i) * stride, kFlatEmpty);
    return p;
  }
  static FlatPage* make_copy(const FlatPage* src, uint32_t stride) {
    const size_t n = size_t(src->slot_count) * stride;
    void* mem = page_alloc(sizeof(FlatPage) + n);
    FlatPage* p = new (mem) FlatPage{{1}, src->slot_count};
    std::memcpy(p->bytes(), src->bytes(), n);
    return p;
  }
  void ref() { refs.fetch_add(1, std::memory_order_relaxed); }
  static void unref(FlatPage* p) {
    if (p && p->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      p->~FlatPage();
      page_free(static_cast<void*>(p));
    }
  }
};
static_assert(sizeof(FlatPage) == 8, "slots start 8 bytes into a page");

// Memory: the header, page_count page pointers, then page_count `owned` bytes.
//
// owned[i] == 1 promises that pages()[i] exists and no other directory references it, so while
// the directory itself is exclusive (refs == 1) the owner may write the page in place. Writers
// test it instead of the page's reference count: that count sits on the page's first cache line,
// away from the slot being written, and in a state larger than the cache loading it is a cache
// miss on every row. owned[i] == 2 marks a page shared with the snapshot of the map's
// write-through state (detail/write_through.h) that a batch kernel writes through: in place,
// holding the page or after the snapshot's reader copied it, each slot saved before its first
// write since the snapshot while the page was not copied. Only the
// owner thread reads or writes
// owned[]. It can only be stale towards "not known": a page becomes shared only through
// make_copy, which starts the copy with every byte 0 (the source directory then belongs to
// snapshots, which never write); a page that became exclusive again because a snapshot was
// released keeps 0 or 2 until the owner's next write of it checks the count and sets 1.
struct FlatDirectory {
  std::atomic<uint32_t> refs;
  uint32_t page_shift;  // log2(slots per page)
  size_t capacity;      // slots, a power of two
  size_t page_count;
  FlatLayout layout;  // snapshots read their directory's layout, never the map's

  FlatPage** pages() { return reinterpret_cast<FlatPage**>(this + 1); }
  FlatPage* const* pages() const { return reinterpret_cast<FlatPage* const*>(this + 1); }
  uint8_t* owned() { return reinterpret_cast<uint8_t*>(pages() + page_count); }
  const uint8_t* owned() const { return reinterpret_cast<const uint8_t*>(pages() + page_count); }
  static size_t bytes_for(size_t n) { return sizeof(FlatDirectory) + n * (sizeof(FlatPage*) + 1); }
  size_t mask() const { return capacity - 1; }
  size_t page_mask() const { return (size_t(1) << page_shift) - 1; }
  uint32_t stride() const { return layout.stride(); }

  // Slot i, or nullptr when its page was never written (an empty slot).
  const uint8_t* slot(size_t i) const {
    const FlatPage* p = pages()[i >> page_shift];
    return p ? p->bytes() + (i & page_mask()) * stride() : nullptr;
  }
  // meta of slot i (kFlatEmpty for a missing page).
  uint32_t meta(size_t i) const {
    const uint8_t* s = slot(i);
    return s ? load_u32(s) : kFlatEmpty;
  }

  static FlatDirectory* make(size_t capacity, const FlatLayout& layout) {
    const uint32_t stride = layout.fixed ? layout.stride() : 4;
    uint32_t shift = 0;
    while ((size_t(1) << (shift + 1)) <= capacity &&
           (size_t(1) << (shift + 1)) * stride <= kFlatPageBytes)
      ++shift;
    const size_t n = capacity >> shift;
    void* mem = ::operator new(bytes_for(n));
    FlatDirectory* d = new (mem) FlatDirectory{{1}, shift, capacity, n, layout};
    std::memset(static_cast<void*>(d->pages()), 0, n * (sizeof(FlatPage*) + 1));
    return d;
  }
  static FlatDirectory* make_copy(const FlatDirectory* src) {
    const size_t n = src->page_count;
    void* mem = ::operator new(bytes_for(n));
    FlatDirectory* d = new (mem) FlatDirectory{{1}, src->page_shift, src->capacity, n, src->layout};
    for (size_t i = 0; i < n; ++i) {
      FlatPage* p = src->pages()[i];
      if (p) p->ref();
      d->pages()[i] = p;
    }
    std::memset(d->owned(), 0, n);  // every page is shared with src now
    return d;
  }
  void ref() { refs.fetch_add(1, std::memory_order_relaxed); }
  static void unref(FlatDirectory* d) {
    if (d && d->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      for (size_t i = 0; i < d->page_count; ++i) FlatPage::unref(d->pages()[i]);
      d->~FlatDirectory();
      ::operator delete(static_cast<void*>(d));
    }
  }
};
static_assert(sizeof(FlatDirectory) % alignof(FlatPage*) == 0, "page pointers must be aligned");

// a[0, n) == b[0, n) for sizeof(W) <= n <= 2 * sizeof(W): two overlapping words of each.
template <class W>
inline bool overlapping_words_equal(const uint8_t* a, const uint8_t* b, size_t n) {
  W x0, y0, x1, y1;
  std::memcpy(&x0, a, sizeof(W));
  std::memcpy(&y0, b, sizeof(W));
  std::memcpy(&x1, a + n - sizeof(W), sizeof(W));
  std::memcpy(&y1, b + n - sizeof(W), sizeof(W));
  return x0 == y0 && x1 == y1;
}

// Key suffix comparison. Suffixes of 8-16 bytes (an int64 key, with or without the VoidNamespace
// byte or an int64 namespace) are two overlapping 8-byte loads, of 4-7 bytes (an int32 key with
// its namespace byte) two 4-byte ones, not a call to memcmp.
// Whole-word areas of 24-64 bytes (var layouts) word by word, the first word alone first: it
// holds the size byte and the key's first 7 bytes, where keys that differ almost always do.
inline bool flat_key_equal(const uint8_t* a, const uint8_t* b, size_t n) {
  if (n >= 8 && n <= 16) return overlapping_words_equal<uint64_t>(a, b, n);
  if (n >= 4 && n < 8) return overlapping_words_equal<uint32_t>(a, b, n);
  if (n >= 24 && n % 8 == 0 && n <= kFlatMaxKey) {
    // An early exit a word, which GCC does not vectorise: a 16-byte load of a probe key
    // (probe_key) would span two of its 8-byte stores and not be forwarded.
    for (size_t i = 0; i < n; i += 8)
      if (load_u64(a + i) != load_u64(b + i)) return false;
    return true;
  }
  return std::memcmp(a, b, n) == 0;
}

// The full key of a slot: the layout's prefix, then the stored suffix, into `buf` (at least
// kFlatMaxKey bytes). Returns its size.
inline size_t flat_full_key(const FlatLayout& l, const uint8_t* slot, uint8_t* buf) {
  if (l.var) {
    const size_t ks = slot[4];
    std::memcpy(buf, slot + 5, ks);
    return ks;
  }
  if (l.prefix_size) buf[0] = l.prefix[0];
  const size_t n = l.suffix_size();
  if (n >= 8 && n <= 16) {
    // Two overlapping fixed-size copies instead of a library memcpy call: every migrated slot's
    // key is rebuilt to be hashed, and int64 keys have 8-16 byte suffixes.
    uint64_t a, b;
    std::memcpy(&a, slot + 4, 8);
    std::memcpy(&b, slot + 4 + n - 8, 8);
    std::memcpy(buf + l.prefix_size, &a, 8);
    std::memcpy(buf + l.prefix_size + n - 8, &b, 8);
  } else {
    std::memcpy(buf + l.prefix_size, slot + 4, n);
  }
  return l.key_size;
}

// memcpy of one slot; strides of 16-32 bytes (int64 keys with fixed values) as two overlapping
// fixed-size copies rather than a library call.
inline void flat_copy_slot(uint8_t* dst, const uint8_t* src, size_t stride) {
  if (stride >= 16 && stride <= 32) {
    uint8_t head[16], tail[16];
    std::memcpy(head, src, 16);
    std::memcpy(tail, src + stride - 16, 16);
    std::memcpy(dst, head, 16);
    std::memcpy(dst + stride - 16, tail, 16);
  } else {
    std::memcpy(dst, src, stride);
  }
}

// fn(slot, meta) for every live slot of `d` (not empty, not a tombstone) at index >= `from`
// whose meta passes keep(meta), in index order; a table without a layout has none. fn must not
// change the table. In two passes over runs of 256 slots: the first writes every slot's address
// and advances past it only when it is taken, so no branch depends on the slot; the second calls
// fn on what was taken. Whether a slot is live (at load 1/2 to 3/4) or changed (a micro-batch
// that changes a large share of the keys) is a coin toss, and the test-and-branch of a one-pass
// walk would mispredict about every other slot.
template <class Keep, class Fn>
void flat_for_each_kept(const FlatDirectory* d, size_t from, Keep&& keep, Fn&& fn) {
  if (!d || !d->layout.fixed) return;
  const size_t stride = d->stride();
  const size_t per_page = d->page_mask() + 1;
  constexpr size_t kRun = 256;
  const uint8_t* taken[kRun];
  for (size_t pi = 0; pi < d->page_count; ++pi) {
    const FlatPage* p = d->pages()[pi];
    if (!p || (pi + 1) * per_page <= from) continue;
    size_t k = pi * per_page < from ? from - pi * per_page : 0;
    while (k < per_page) {
      const size_t end = k + kRun < per_page ? k + kRun : per_page;
      size_t n = 0;
      for (; k < end; ++k) {
        const uint8_t* s = p->bytes() + k * stride;
        const uint32_t meta = load_u32(s);
        taken[n] = s;
        n += static_cast<size_t>((meta != kFlatEmpty) & (meta != kFlatDeleted) &
                                 static_cast<bool>(keep(meta)));
      }
      for (size_t j = 0; j < n; ++j) fn(taken[j], load_u32(taken[j]));
    }
  }
}

// fn(slot, meta) for every live slot of `d` at index >= `from`, in index order.
template <class Fn>
void flat_for_each_live(const FlatDirectory* d, size_t from, Fn&& fn) {
  flat_for_each_kept(d, from, [](uint32_t) { return true; }, fn);
}

// Linear probe for a key suffix from its home slot. Slots below `migrated_below` hold entries a
// rehash already moved: occupied for the probe, never a match. Tables are never full (the load
// stays <= 3/4), so an empty slot ends every probe; the step bound only guards that invariant.
inline bool flat_probe(const FlatDirectory* d, uint32_t h, const uint8_t* suffix,
                       size_t migrated_below, size_t* slot) {
  const size_t mask = d->mask();
  const size_t n = d->layout.suffix_size();
  size_t i = h & mask;
  for (size_t step = 0; step <= mask; ++step, i = (i + 1) & mask) {
    const uint8_t* s = d->slot(i);
    if (!s) return false;
    const uint32_t meta = load_u32(s);
    if (meta == kFlatEmpty) return false;
    if (meta != kFlatDeleted && i >= migrated_below && flat_key_equal(s + 4, suffix, n)) {
      *slot = i;
      return true;
    }
  }
  return false;
}

}  // namespace detail
}  // namespace statecore
