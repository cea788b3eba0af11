// Memory of the flat engine's pages (engine internal): large pages come from 2 MiB chunks the
// kernel is asked to back with transparent huge pages.
//
// Why: a state that outgrows the cache is probed at random, and with 4 KiB pages nearly every
// probe also misses the TLB (a few MiB of reach, against 240 MB of slots for 10M int64 entries),
// which on a virtual machine costs a two-dimensional page walk and stops the batch kernels'
// software prefetches from helping. Huge pages give the probes TLB reach; this pool backs the
// maps' pages (and the chained engine's entries) with them without changing malloc for the
// whole process (docs/state-map.md "Page pool").
//
// Blocks of one byte size (rounded up to 64) come from chunks of that size class. A chunk is one
// aligned 2 MiB mapping (madvise MADV_HUGEPAGE: with THP in "madvise" mode, as Debian ships it,
// faults there take a huge page when one is free); it hands out never-used blocks by bumping an
// index and reuses freed ones through its own free list. Once all of its blocks are free, one
// empty chunk per class is kept (so a copy-on-write burst does not map and unmap in turn); the
// others become spares of any class, their memory given back with MADV_FREE (the kernel reclaims
// it only under memory pressure), up to kPoolSpareDefaultMb, and beyond that go back to the OS.
// A state built after another was dropped (a restore after a closed backend, the tasks of a
// rescale one after another) then reuses those pages instead of faulting in fresh ones, whose
// zeroing by the kernel costs more than the restore's own work. Pages are allocated by a map's owner while it grows or copies and freed on any
// thread (a snapshot released by a checkpoint writer), never once a row: one mutex guards it all.
//
// Only blocks of at least kPoolMinBytes use chunks (a map's full pages, 8-16 KiB); the small
// pages of small maps stay with operator new, as a 2 MiB chunk per size class would dwarf them.
//
// The chained engine's entries (detail/entry.h, 40-300 bytes each, one per key of a string or
// otherwise variable-length state) come from the same chunks through small_alloc, in 16-byte
// size classes up to kPoolSmallMaxBytes; larger ones (list and map blobs) are malloc'd. Their
// problem is the one above: a large string state is gigabytes of entries read at random.
// The cost is one lock per entry allocated or freed (not per row that only updates), and up to
// one partly used 2 MiB chunk per size class in use.
//
// Under AddressSanitizer, or with STATECORE_PAGE_POOL=0 in the environment when the first block
// is allocated, everything goes to operator new / malloc (ASan then still sees every bound).
#pragma once
#include <atomic>
#include <cstddef>
#include <thread>

namespace statecore {
namespace detail {

constexpr size_t kPoolChunkBytes = size_t(2) << 20;  // one x86-64 huge page
constexpr size_t kPoolMinBytes = 4096;

constexpr size_t kPoolSmallMaxBytes = 512;

// Most MiB of empty chunks kept as spares for any size class (page_pool.cpp keep_or_unmap)
// unless STATECORE_PAGE_POOL_SPARE_MB (a whole number of MiB, 0: none) says otherwise when the
// first block is allocated.
constexpr size_t kPoolSpareDefaultMb = 1024;

// `bytes` of memory aligned to 16; std::bad_alloc when none is left.
void* page_alloc(size_t bytes);
// Frees what page_alloc returned (nullptr: no-op); any thread.
void page_free(void* p) noexcept;

// Entry memory: `bytes` aligned to 16 from a 16-byte size class of the pool when bytes <=
// kPoolSmallMaxBytes and the pool is on, else from malloc. std::bad_alloc when none is left.
void* small_alloc(size_t bytes);
// Frees what small_alloc or small_realloc returned (nullptr: no-op); any thread.
void small_free(void* p) noexcept;
// p (from small_alloc/small_realloc) grown or shrunk to `bytes`, its first min(valid, bytes)
// bytes kept: p itself when its block is large enough, else a new block (p is freed). A malloc'd
// p is realloc'd. nullptr (p untouched) or std::bad_alloc when no memory is left.
void* small_realloc(void* p, size_t valid, size_t bytes);

struct PagePoolStats {
  size_t chunks = 0;         // 2 MiB chunks mapped now and in use by a size class
  size_t spare_chunks = 0;   // empty chunks kept mapped for reuse by any class
  size_t blocks_in_use = 0;  // pool blocks allocated and not freed (pages and entries)
  bool enabled = false;      // whether large blocks come from chunks
};
PagePoolStats page_pool_stats();

// Faults in pool memory ahead of a bulk load (a restore into a new table) on a helper thread:
// about `bytes` (whole chunks) mapped, advised for huge pages, populated (MADV_POPULATE_WRITE,
// else a write a 4 KiB page: the kernel zeroes each page as it faults it in, on the helper's
// thread) and kept as spares, which the loading thread's next chunks are taken from, so the
// loader writes mapped memory instead of faulting in and zeroing each page itself. In a process
// without freed pages to reuse, that first touch costs more than the restore's own work. Spares
// the pool keeps already (freed pages) count against `bytes`, and so does every fresh chunk
// the pool maps while the helper runs (a loader that ran ahead of it faults that chunk in
// itself), so that helper and loader together fault in about `bytes`, not more.
// The helper stops at the spare limit (kPoolSpareDefaultMb, so at most
// that much is kept unused when the estimate was too large), after `bytes`, or when the object is
// destroyed (which waits for it); nothing when the pool is off or keeps no spares.
class PagePrefault {
 public:
  explicit PagePrefault(size_t bytes);
  ~PagePrefault();
  PagePrefault(const PagePrefault&) = delete;
  PagePrefault& operator=(const PagePrefault&) = delete;
  // Chunks the helper faulted in and handed to the pool so far.
  size_t chunks() const { return done_.load(std::memory_order_acquire); }
  // True once the helper stopped on its own (or never started): chunks() is final.
  bool finished() const { return finished_.load(std::memory_order_acquire); }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<bool> finished_{false};
  std::atomic<size_t> done_{0};
  std::thread thread_;
};

}  // namespace detail
}  // namespace statecore
