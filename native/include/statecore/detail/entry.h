// One key/value pair of the state map: a single heap allocation (engine internal).
//
// Layout: [Entry header, 32 bytes][key bytes, padded to a multiple of 8][value bytes]
// The value starts 8-byte aligned, so fixed-width values (int64, float64) are inline and aligned;
// a value of another size means a new allocation (StateMap::put relinks the new entry), or for
// the batch kernels' StateMap::resize a realloc of an entry no snapshot reaches. Entries come
// from small_alloc (detail/page_pool.h: huge-page chunks up to 512 bytes, malloc beyond), so a
// large state's random probes do not also miss the TLB; realloc may still grow one in place.
// An entry is immutable once some live snapshot may reach it (version < highest required
// snapshot version): then writers copy it instead (see StateMap's class comment).
// Two versions per entry (as Flink's entryVersion / stateVersion): `version` says when this
// allocation was made (copy-on-write decisions), `modified` when the key's value was last written
// (change tracking); a copy-on-write or rehash copy keeps `modified`, so copies never look changed.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

#include "statecore/detail/page_pool.h"

namespace statecore {
namespace detail {

struct Entry {
  Entry* next;  // next entry of the bucket chain (or nullptr)
  // Map version at which this allocation was created ("entry version"); 32 bits as `modified`
  // (versions stop at UINT32_MAX), which leaves room for value_capacity in the 32-byte header.
  uint32_t version;
  // Value bytes allocated, >= value_size. Equal for every entry but those the batch kernels
  // grew through StateMap::resize: these get slack (grown_capacity) so that a list or map blob
  // growing a row at a time is realloc'd O(log) times rather than once a row (a list appended
  // to n times in one batch cost O(n^2) bytes copied).
  uint32_t value_capacity;
  uint32_t hash;  // mixed key hash; bucket = hash & (capacity - 1)
  uint32_t key_size;
  uint32_t value_size;
  // Map version of the last write of the value (Flink stateVersion). 32 bits keep the header at
  // 32 bytes (key 8-byte aligned); StateMap refuses versions above UINT32_MAX (as Flink refuses
  // Integer.MAX_VALUE snapshots of a CopyOnWriteStateMap).
  uint32_t modified;

  static size_t value_offset(size_t key_size) { return (key_size + 7) & ~static_cast<size_t>(7); }
  static size_t alloc_size(size_t key_size, size_t value_size) {
    return sizeof(Entry) + value_offset(key_size) + value_size;
  }

  uint8_t* key() { return reinterpret_cast<uint8_t*>(this + 1); }
  const uint8_t* key() const { return reinterpret_cast<const uint8_t*>(this + 1); }
  uint8_t* value() { return key() + value_offset(key_size); }
  const uint8_t* value() const { return key() + value_offset(key_size); }

  bool matches(uint32_t h, const uint8_t* k, size_t ks) const {
    return hash == h && key_size == ks && (ks == 0 || std::memcmp(key(), k, ks) == 0);
  }

  // New entry with the key copied in and `vs` zeroed value bytes.
  static Entry* make(uint32_t h, const uint8_t* k, size_t ks, size_t vs, uint64_t version) {
    void* mem = allocate(alloc_size(ks, vs));
    Entry* e = new (mem) Entry{nullptr,
                               static_cast<uint32_t>(version),
                               static_cast<uint32_t>(vs),
                               h,
                               static_cast<uint32_t>(ks),
                               static_cast<uint32_t>(vs),
                               static_cast<uint32_t>(version)};
    if (ks) std::memcpy(e->key(), k, ks);
    std::memset(e->key() + ks, 0, value_offset(ks) - ks + vs);
    return e;
  }

  // Copy-on-write copy: same key, value, `modified` and next link, new version.
  static Entry* make_copy(const Entry* src, uint64_t version) {
    size_t n = alloc_size(src->key_size, src->value_size);
    void* mem = allocate(n);
    std::memcpy(mem, static_cast<const void*>(src), n);
    Entry* e = static_cast<Entry*>(mem);
    e->version = static_cast<uint32_t>(version);
    e->value_capacity = src->value_size;
    return e;
  }

  // The capacity a value growing to `vs` bytes gets: 1.5 x (as a vector grows), so n appends of
  // a few bytes copy O(n) bytes in all; within 32 bits.
  static size_t grown_capacity(size_t vs) {
    const size_t cap = vs + vs / 2;
    return cap > 0xFFFFFFFFu ? (vs > 0xFFFFFFFFu ? vs : 0xFFFFFFFFu) : cap;
  }

  // Copy with the value resized to `vs`: header (next link, `modified`), key and the first
  // min(old, vs) value bytes copied, bytes past the old size zeroed, new version.
  // (A growing value gets slack, grown_capacity.)
  static Entry* make_resized_copy(const Entry* src, size_t vs, uint64_t version) {
    const size_t keep = alloc_size(src->key_size, src->value_size < vs ? src->value_size : vs);
    const size_t cap = vs > src->value_size ? grown_capacity(vs) : vs;
    const size_t n = alloc_size(src->key_size, vs);
    void* mem = allocate(alloc_size(src->key_size, cap));
    std::memcpy(mem, static_cast<const void*>(src), keep);
    if (n > keep) std::memset(static_cast<uint8_t*>(mem) + keep, 0, n - keep);
    Entry* e = static_cast<Entry*>(mem);
    e->version = static_cast<uint32_t>(version);
    e->value_capacity = static_cast<uint32_t>(cap);
    e->value_size = static_cast<uint32_t>(vs);
    return e;
  }

  // True when `e` holds a value of `vs` bytes without reallocating.
  bool fits(size_t vs) const { return vs <= value_capacity; }

  // `e` itself with the value resized to `vs`: in its own allocation when it fits, else realloc'd
  // to grown_capacity(vs) (in place when the allocator can, else moved; the old address is dead
  // then). Only for an entry no snapshot reaches; when it moved, the caller rewrites the one
  // link to it. Bytes past the old size zeroed.
  static Entry* resize(Entry* e, size_t vs) {
    const size_t old = alloc_size(e->key_size, e->value_size);
    const size_t n = alloc_size(e->key_size, vs);
    if (!e->fits(vs)) {
      const size_t cap = grown_capacity(vs);
      void* mem = small_realloc(static_cast<void*>(e), old, alloc_size(e->key_size, cap));
      if (mem == nullptr) throw std::bad_alloc();  // e is untouched
      e = static_cast<Entry*>(mem);
      e->value_capacity = static_cast<uint32_t>(cap);
    }
    if (n > old) std::memset(reinterpret_cast<uint8_t*>(e) + old, 0, n - old);
    e->value_size = static_cast<uint32_t>(vs);
    return e;
  }

  static void destroy(Entry* e) { small_free(static_cast<void*>(e)); }

  static void* allocate(size_t n) { return small_alloc(n); }
};

static_assert(sizeof(Entry) == 32, "entry header must keep keys 8-byte aligned");

}  // namespace detail
}  // namespace statecore
