// The huge-page chunk pool of the flat engine's pages; the design is in detail/page_pool.h.
#include "statecore/detail/page_pool.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

namespace statecore {
namespace detail {
namespace {

struct SizeClass;

struct Chunk {
  uint8_t* base;  // kPoolChunkBytes, aligned to kPoolChunkBytes
  SizeClass* cls;
  void* free_list = nullptr;  // freed blocks, linked through their first word
  size_t bumped = 0;          // blocks handed out from the untouched tail so far
  size_t in_use = 0;
  bool partial = false;  // listed in cls->partial (has a free or untouched block)
};

struct SizeClass {
  size_t block = 0;  // bytes, a multiple of 16 (small) or 64
  size_t per_chunk = 0;
  std::vector<Chunk*> partial;  // chunks with room
  Chunk* empty = nullptr;       // one fully free chunk kept mapped
};

class Pool {
 public:
  static Pool& get() {
    static Pool* pool = new Pool();  // never destroyed: pages may be freed during exit
    return *pool;
  }

  bool enabled() const { return enabled_; }

  void* alloc(size_t bytes) {
    const size_t block =
        bytes <= kPoolSmallMaxBytes ? (bytes + 15) & ~size_t(15) : (bytes + 63) & ~size_t(63);
    std::lock_guard<std::mutex> lock(mu_);
    SizeClass& cls = classes_[block];
    if (cls.block == 0) {
      cls.block = block;
      cls.per_chunk = kPoolChunkBytes / block;
    }
    Chunk* c = nullptr;
    if (!cls.partial.empty()) {
      c = cls.partial.back();
    } else if (cls.empty != nullptr) {
      c = cls.empty;
      cls.empty = nullptr;
      list(c);
    } else {
      c = map_chunk(&cls);
      list(c);
    }
    void* p;
    if (c->free_list != nullptr) {
      p = c->free_list;
      std::memcpy(&c->free_list, p, sizeof(void*));
    } else {
      p = c->base + c->bumped * cls.block;
      ++c->bumped;
    }
    ++c->in_use;
    ++in_use_;
    if (c->free_list == nullptr && c->bumped == cls.per_chunk) unlist(c);
    return p;
  }

  // The block size of p, 0 when p is not a pool block.
  size_t block_of(void* p) {
    const uintptr_t base = reinterpret_cast<uintptr_t>(p) & ~(uintptr_t(kPoolChunkBytes) - 1);
    std::lock_guard<std::mutex> lock(mu_);
    auto it = chunks_.find(base);
    return it == chunks_.end() ? 0 : it->second->cls->block;
  }

  // False when p is not a pool block.
  bool free(void* p) {
    const uintptr_t base = reinterpret_cast<uintptr_t>(p) & ~(uintptr_t(kPoolChunkBytes) - 1);
    std::lock_guard<std::mutex> lock(mu_);
    auto it = chunks_.find(base);
    if (it == chunks_.end()) return false;
    Chunk* c = it->second;
    std::memcpy(p, &c->free_list, sizeof(void*));
    c->free_list = p;
    --c->in_use;
    --in_use_;
    if (!c->partial) list(c);
    if (c->in_use == 0) {
      unlist(c);
      SizeClass* cls = c->cls;
      if (cls->empty == nullptr) {
        cls->empty = c;
      } else {
        chunks_.erase(it);
        keep_or_unmap(c->base);
        delete c;
      }
    }
    return true;
  }

  // A PagePrefault helper's `chunks` to fault in: added to what the running helpers still owe.
  void begin_prefault(size_t chunks) {
    std::lock_guard<std::mutex> lock(mu_);
    prefault_owed_ += chunks;
    ++prefaults_;
  }
  // Whether a helper is to fault in one more chunk (taken from what they owe).
  bool claim_prefault() {
    std::lock_guard<std::mutex> lock(mu_);
    if (prefault_owed_ == 0) return false;
    --prefault_owed_;
    return true;
  }
  // A helper stopped; once none runs, nothing is owed any more.
  void end_prefault() {
    std::lock_guard<std::mutex> lock(mu_);
    if (--prefaults_ == 0) prefault_owed_ = 0;
  }

  // An empty chunk faulted in by PagePrefault, kept as a spare: false (nothing kept) at the spare
  // limit or with the pool off.
  bool add_spare(uint8_t* base) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!enabled_ || spare_.size() >= spare_max_) return false;
    spare_.push_back(base);
    return true;
  }
  // How many more spares PagePrefault may add for a load of `wanted` chunks: what the spares
  // kept already (pages freed before, still mapped) do not cover, up to the limit.
  size_t spares_wanted(size_t wanted) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!enabled_ || spare_.size() >= wanted) return 0;
    return std::min(wanted, spare_max_) - std::min(spare_.size(), spare_max_);
  }

  // A fresh aligned kPoolChunkBytes mapping advised for huge pages; nullptr when none is left.
  static uint8_t* map_aligned() {
    // Twice the size, then the unaligned head and tail unmapped: mmap aligns to 4 KiB only.
    void* raw = mmap(nullptr, 2 * kPoolChunkBytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return nullptr;
    const uintptr_t r = reinterpret_cast<uintptr_t>(raw);
    const uintptr_t a = (r + kPoolChunkBytes - 1) & ~(uintptr_t(kPoolChunkBytes) - 1);
    if (a > r) munmap(raw, a - r);
    const uintptr_t end = r + 2 * kPoolChunkBytes;
    if (end > a + kPoolChunkBytes)
      munmap(reinterpret_cast<void*>(a + kPoolChunkBytes), end - a - kPoolChunkBytes);
#ifdef MADV_HUGEPAGE
    madvise(reinterpret_cast<void*>(a), kPoolChunkBytes, MADV_HUGEPAGE);  // a hint: may fail
#endif
    return reinterpret_cast<uint8_t*>(a);
  }

  PagePoolStats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    PagePoolStats s;
    s.chunks = chunks_.size();
    s.spare_chunks = spare_.size();
    s.blocks_in_use = in_use_;
    s.enabled = enabled_;
    return s;
  }

 private:
  Pool() {
#if defined(__SANITIZE_ADDRESS__)
    enabled_ = false;
#else
    const char* env = std::getenv("STATECORE_PAGE_POOL");
    enabled_ = !(env != nullptr && std::strcmp(env, "0") == 0);
#endif
    const char* spare = std::getenv("STATECORE_PAGE_POOL_SPARE_MB");
    size_t mb = kPoolSpareDefaultMb;
    if (spare != nullptr) {
      char* end = nullptr;
      const unsigned long long v = std::strtoull(spare, &end, 10);
      if (end != spare && *end == '\0') mb = static_cast<size_t>(v);
    }
    spare_max_ = mb / (kPoolChunkBytes >> 20);
  }

  // An empty chunk no class keeps: kept mapped as a spare of any class while there are fewer
  // than spare_max_, its memory given back lazily (MADV_FREE: the kernel takes the pages only
  // when it needs them, and until then the next chunk is served from them without a fault or
  // the zeroing of a fresh page), else unmapped.
  void keep_or_unmap(uint8_t* base) {
#ifdef MADV_FREE
    if (spare_.size() < spare_max_ && madvise(base, kPoolChunkBytes, MADV_FREE) == 0) {
      spare_.push_back(base);
      return;
    }
#endif
    munmap(base, kPoolChunkBytes);
  }

  Chunk* map_chunk(SizeClass* cls) {
    if (!spare_.empty()) {
      // The most recently freed: the likeliest to still hold its pages.
      uint8_t* base = spare_.back();
      spare_.pop_back();
      Chunk* c = new Chunk{base, cls};
      chunks_.emplace(reinterpret_cast<uintptr_t>(base), c);
      return c;
    }
    uint8_t* a = map_aligned();
    if (a == nullptr) throw std::bad_alloc();
    // A load that ran out of prefaulted spares faults this chunk in itself: one chunk fewer
    // for the helpers, which would otherwise fault in chunks the load never takes.
    if (prefault_owed_ > 0) --prefault_owed_;
    Chunk* c = new Chunk{a, cls};
    chunks_.emplace(reinterpret_cast<uintptr_t>(a), c);
    return c;
  }

  void list(Chunk* c) {
    c->partial = true;
    c->cls->partial.push_back(c);
  }
  void unlist(Chunk* c) {
    if (!c->partial) return;
    // From the back: a chunk fills while it is the last listed (alloc takes the back one).
    std::vector<Chunk*>& v = c->cls->partial;
    for (size_t i = v.size(); i-- > 0;) {
      if (v[i] == c) {
        v[i] = v.back();
        v.pop_back();
        break;
      }
    }
    c->partial = false;
  }

  std::mutex mu_;
  bool enabled_ = true;
  size_t in_use_ = 0;
  std::unordered_map<size_t, SizeClass> classes_;
  std::unordered_map<uintptr_t, Chunk*> chunks_;
  std::vector<uint8_t*> spare_;  // empty chunks of no class (keep_or_unmap), newest last
  size_t spare_max_ = 0;
  size_t prefault_owed_ = 0;  // chunks the running PagePrefault helpers may still fault in
  size_t prefaults_ = 0;      // PagePrefault helpers running
};

}  // namespace

void* page_alloc(size_t bytes) {
  Pool& pool = Pool::get();
  if (bytes < kPoolMinBytes || bytes > kPoolChunkBytes / 4 || !pool.enabled())
    return ::operator new(bytes);
  return pool.alloc(bytes);
}

void page_free(void* p) noexcept {
  if (p == nullptr) return;
  Pool& pool = Pool::get();
  if (!pool.enabled() || !pool.free(p)) ::operator delete(p);
}

void* small_alloc(size_t bytes) {
  Pool& pool = Pool::get();
  if (bytes == 0 || bytes > kPoolSmallMaxBytes || !pool.enabled()) {
    void* p = std::malloc(bytes == 0 ? 1 : bytes);
    if (p == nullptr) throw std::bad_alloc();
    return p;
  }
  return pool.alloc(bytes);
}

void small_free(void* p) noexcept {
  if (p == nullptr) return;
  Pool& pool = Pool::get();
  if (!pool.enabled() || !pool.free(p)) std::free(p);
}

void* small_realloc(void* p, size_t valid, size_t bytes) {
  Pool& pool = Pool::get();
  const size_t block = pool.enabled() ? pool.block_of(p) : 0;
  if (block == 0) return std::realloc(p, bytes);  // a malloc'd block stays malloc'd
  if (bytes <= block && bytes + 16 > block) return p;
  void* q = small_alloc(bytes);
  std::memcpy(q, p, valid < bytes ? valid : bytes);
  pool.free(p);
  return q;
}

PagePoolStats page_pool_stats() { return Pool::get().stats(); }

namespace {

// Faults in a fresh chunk, zeroed, as the writes of a load would (a huge page where the kernel
// has one). MADV_POPULATE_WRITE (Linux 5.14, madvise(2)) does it in one call, also where the
// kernel has no huge page to give and a write a 4 KiB page would take 512 faults; older kernels
// reject it (EINVAL) and get the writes.
void populate(uint8_t* base) {
#ifdef MADV_POPULATE_WRITE
  if (madvise(base, kPoolChunkBytes, MADV_POPULATE_WRITE) == 0) return;
#endif
  for (size_t off = 0; off < kPoolChunkBytes; off += 4096)
    static_cast<volatile uint8_t*>(base)[off] = 0;
}

}  // namespace

PagePrefault::PagePrefault(size_t bytes) {
  Pool& pool = Pool::get();
  const size_t n = pool.spares_wanted((bytes + kPoolChunkBytes - 1) / kPoolChunkBytes);
  if (n == 0) {
    finished_.store(true, std::memory_order_release);
    return;
  }
  pool.begin_prefault(n);
  try {
    thread_ = std::thread([this] {
      Pool& pool = Pool::get();
      while (!stop_.load(std::memory_order_relaxed) && pool.claim_prefault()) {
        uint8_t* base = Pool::map_aligned();
        if (base == nullptr) break;
        populate(base);
        if (!pool.add_spare(base)) {
          munmap(base, kPoolChunkBytes);
          break;
        }
        done_.fetch_add(1, std::memory_order_release);
      }
      pool.end_prefault();
      finished_.store(true, std::memory_order_release);
    });
  } catch (...) {
    pool.end_prefault();
    throw;
  }
}

PagePrefault::~PagePrefault() {
  stop_.store(true, std::memory_order_relaxed);
  if (thread_.joinable()) thread_.join();
}

}  // namespace detail
}  // namespace statecore
