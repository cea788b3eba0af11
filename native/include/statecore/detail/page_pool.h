// Memory of the flat engine's pages (engine internal): large pages come from 2 MiB chunks the
// kernel is asked to back with transparent huge pages.
//
// Why: a state that outgrows the cache is probed at random, and with 4 KiB pages nearly every
// probe also misses the TLB (a few MiB of reach, against 240 MB of slots for 10M int64 entries),
// which on a virtual machine costs a two-dimensional page walk and stops the batch kernels'
// software prefetches from helping. Measured on the 2-core VM of bench/results: add_batch over
// 10M distinct int64 keys went from 1.7-2.0 to 2.4-2.7 M rows/s when every malloc was huge-page
// backed (GLIBC_TUNABLES=glibc.malloc.hugetlb=1); this pool does that for the flat pages alone.
//
// Blocks of one byte size (rounded up to 64) come from chunks of that size class. A chunk is one
// aligned 2 MiB mapping (madvise MADV_HUGEPAGE: with THP in "madvise" mode, as Debian ships it,
// faults there take a huge page when one is free); it hands out never-used blocks by bumping an
// index and reuses freed ones through its own free list, and goes back to the OS once all of its
// blocks are free (one empty chunk per class is kept, so a copy-on-write burst does not map and
// unmap in turn). Pages are allocated by a map's owner while it grows or copies and freed on any
// thread (a snapshot released by a checkpoint writer), never once a row: one mutex guards it all.
//
// Only blocks of at least kPoolMinBytes use chunks (a map's full pages, 8-16 KiB); the small
// pages of small maps stay with operator new, as a 2 MiB chunk per size class would dwarf them.
// Under AddressSanitizer, or with STATECORE_PAGE_POOL=0 in the environment when the first page
// is allocated, everything goes to operator new (ASan then still sees every page's bounds).
#pragma once
#include <cstddef>

namespace statecore {
namespace detail {

constexpr size_t kPoolChunkBytes = size_t(2) << 20;  // one x86-64 huge page
constexpr size_t kPoolMinBytes = 4096;

// `bytes` of memory aligned to 16; std::bad_alloc when none is left.
void* page_alloc(size_t bytes);
// Frees what page_alloc returned (nullptr: no-op); any thread.
void page_free(void* p) noexcept;

struct PagePoolStats {
  size_t chunks = 0;        // 2 MiB chunks mapped now
  size_t blocks_in_use = 0;  // pool blocks allocated and not freed
  bool enabled = false;      // whether large blocks come from chunks
};
PagePoolStats page_pool_stats();

}  // namespace detail
}  // namespace statecore
