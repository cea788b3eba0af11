// Paged bucket arrays of the state map (engine internal).
//
// A table's buckets are a Directory of fixed-size Pages of bucket heads. Both are reference
// counted with atomic counts: the live map and every snapshot taken while the table existed hold
// one reference to the Directory; each Directory holds one reference to each of its Pages. A
// snapshot therefore shares the whole bucket array in O(1), and the map copies a Directory
// (O(capacity / page size) pointers) or a Page (O(page size) pointers) only when it is about to
// write into one that is shared. Pages are allocated lazily: a null page pointer is a page of
// empty buckets, so allocating a table costs O(capacity / page size).
//
// Counts are decremented from any thread (a snapshot may be released on a checkpoint thread);
// the last holder frees. Counts are only incremented by the map's owning thread, while it holds a
// reference itself, so a count seen as 1 by the owner cannot rise behind its back.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>

#include "statecore/detail/entry.h"
#include "statecore/detail/page_pool.h"

namespace statecore {
namespace detail {

constexpr size_t kPageShiftMax = 9;               // at most 512 buckets (4 KiB of heads) per page
constexpr size_t kMinCapacity = 4;                // as Flink CopyOnWriteStateMap.MINIMUM_CAPACITY
constexpr size_t kMaxCapacity = size_t(1) << 30;  // as Flink MAXIMUM_CAPACITY

struct Page {
  std::atomic<uint32_t> refs;
  uint32_t slot_count;

  Entry** slots() { return reinterpret_cast<Entry**>(this + 1); }
  Entry* const* slots() const { return reinterpret_cast<Entry* const*>(this + 1); }

  // Full pages (512 heads, 4 KiB) from the huge-page pool, as the flat engine's (page_pool.h).
  static Page* make_empty(uint32_t n) {
    void* mem = page_alloc(sizeof(Page) + n * sizeof(Entry*));
    Page* p = new (mem) Page{{1}, n};
    std::memset(static_cast<void*>(p->slots()), 0, n * sizeof(Entry*));
    return p;
  }
  static Page* make_copy(const Page* src) {
    void* mem = page_alloc(sizeof(Page) + src->slot_count * sizeof(Entry*));
    Page* p = new (mem) Page{{1}, src->slot_count};
    std::memcpy(static_cast<void*>(p->slots()), static_cast<const void*>(src->slots()),
                src->slot_count * sizeof(Entry*));
    return p;
  }
  void ref() { refs.fetch_add(1, std::memory_order_relaxed); }
  // Entries are not owned by pages: freeing a page never frees entries.
  static void unref(Page* p) {
    if (p && p->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      p->~Page();
      page_free(static_cast<void*>(p));
    }
  }
};
static_assert(sizeof(Page) % alignof(Entry*) == 0, "page slots must be aligned");

struct Directory {
  std::atomic<uint32_t> refs;
  uint32_t page_shift;  // log2(buckets per page) = min(log2(capacity), kPageShiftMax)
  size_t capacity;      // buckets, a power of two
  size_t page_count;    // capacity >> page_shift

  Page** pages() { return reinterpret_cast<Page**>(this + 1); }
  Page* const* pages() const { return reinterpret_cast<Page* const*>(this + 1); }
  size_t page_mask() const { return (size_t(1) << page_shift) - 1; }

  Entry* head(size_t bucket) const {
    const Page* p = pages()[bucket >> page_shift];
    return p ? p->slots()[bucket & page_mask()] : nullptr;
  }

  static Directory* make(size_t capacity) {
    uint32_t shift = 0;
    while ((size_t(1) << shift) < capacity && shift < kPageShiftMax) ++shift;
    size_t n = capacity >> shift;
    void* mem = ::operator new(sizeof(Directory) + n * sizeof(Page*));
    Directory* d = new (mem) Directory{{1}, shift, capacity, n};
    std::memset(static_cast<void*>(d->pages()), 0, n * sizeof(Page*));
    return d;
  }
  // Shares every page of `src` (one more reference each).
  static Directory* make_copy(const Directory* src) {
    size_t n = src->page_count;
    void* mem = ::operator new(sizeof(Directory) + n * sizeof(Page*));
    Directory* d = new (mem) Directory{{1}, src->page_shift, src->capacity, n};
    for (size_t i = 0; i < n; ++i) {
      Page* p = src->pages()[i];
      if (p) p->ref();
      d->pages()[i] = p;
    }
    return d;
  }
  void ref() { refs.fetch_add(1, std::memory_order_relaxed); }
  static void unref(Directory* d) {
    if (d && d->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      for (size_t i = 0; i < d->page_count; ++i) Page::unref(d->pages()[i]);
      d->~Directory();
      ::operator delete(static_cast<void*>(d));
    }
  }
};
static_assert(sizeof(Directory) % alignof(Page*) == 0, "directory page pointers must be aligned");

}  // namespace detail
}  // namespace statecore
