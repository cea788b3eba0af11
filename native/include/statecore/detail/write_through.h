// Write-through copy-on-write of the flat engine (engine internal; design: docs/state-map.md
// "Write-through copy-on-write").
//
// While a snapshot of a flat map has not been read yet, the owner's batch kernels write the
// pages it shares in place and save each slot's bytes as of the snapshot first, once per slot
// (the slot's first write since the snapshot: its `modified` is older than the map version).
// The first reader of the snapshot then makes the snapshot's own copy of the table (its pages,
// with the saved slots put back) and drops its reference to the shared pages, which the owner
// finds exclusive again and writes in place without saving. So what the processing thread pays
// for a snapshot is one saved slot per key written before the reader reached its map, not a page
// per page touched; the table-sized copy is made by the reading (checkpoint) thread.
//
// The gate keeps the owner's in-place writes and the reader's copy apart: the owner holds it
// (kOwner) from the first write of a batch kernel call to the map until the call returns, the
// reader takes it (kReader) in a gap between two calls to copy and closes it for good (kClosed).
// The owner waits for the reader only while a copy is under way, and for at most a bound; a
// reader that finds no gap for a while says it waits (`reader_waiting`), and the owner's next
// calls leave the gate to it.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "statecore/detail/bytes.h"

namespace statecore {
namespace detail {

// A wait for the gate: a few pauses, then yields (the other side holds it for a kernel call or
// a table copy).
void through_backoff(unsigned spins);

class WriteThrough {
 public:
  static constexpr uint32_t kOpen = 0;    // nobody writes in place or copies right now
  static constexpr uint32_t kOwner = 1;   // the owner's kernel call writes in place
  static constexpr uint32_t kReader = 2;  // the reader copies the table
  static constexpr uint32_t kClosed = 3;  // copied (or the snapshot was released): no more saves

  std::atomic<uint32_t> gate{kOpen};
  std::atomic<bool> reader_waiting{false};
  std::atomic<bool> abandoned{false};  // the snapshot was released before it was read

  explicit WriteThrough(uint32_t stride)
      : stride_(stride), record_(8 + stride), per_chunk_(kChunkBytes / (8 + stride)) {}
  WriteThrough(const WriteThrough&) = delete;
  WriteThrough& operator=(const WriteThrough&) = delete;

  // Owner, holding the gate: the bytes of the slot at byte `offset` of page `page`, as the
  // snapshot sees them, before their first write since the snapshot. kStride: the stride when
  // the caller knows it at compile time (0: the table's), so the batch kernels' hot loop copies
  // the slot with a few moves rather than a call.
  template <uint32_t kStride = 0>
  [[gnu::always_inline]] void save(uint32_t page, uint32_t offset, const uint8_t* slot) {
    if (left_ == 0) grow();
    store_u32(cur_, page);
    store_u32(cur_ + 4, offset);
    std::memcpy(cur_ + 8, slot, kStride ? kStride : stride_);
    cur_ += record_;
    --left_;
    ++count_;
  }
  size_t size() const { return count_; }

  // Reader, holding the gate: fn(page, offset, slot bytes) for every record, newest first (so
  // that applying them in this order leaves each slot with its oldest saved bytes: its bytes at
  // snapshot time).
  template <class Fn>
  void for_each_newest_first(Fn&& fn) const {
    size_t n = count_;
    for (size_t c = chunks_.size(); c-- > 0;) {
      const size_t in_chunk = n - c * per_chunk_;
      const uint8_t* base = chunks_[c].get();
      for (size_t r = in_chunk; r-- > 0;) {
        const uint8_t* rec = base + r * record_;
        fn(load_u32(rec), load_u32(rec + 4), rec + 8);
      }
      n -= in_chunk;
    }
  }

 private:
  // Records go to chunks from the C++ heap rather than to huge-page pool blocks: they are
  // written once, sequentially, and freed when the snapshot is read, so they need no huge page,
  // and a freed chunk is reused by the next map's records.
  static constexpr size_t kChunkBytes = size_t(32) << 10;
  [[gnu::noinline, gnu::cold]] void grow() {
    chunks_.emplace_back(new uint8_t[per_chunk_ * record_]);
    cur_ = chunks_.back().get();
    left_ = per_chunk_;
  }

  uint32_t stride_;
  size_t record_;
  size_t per_chunk_;
  std::vector<std::unique_ptr<uint8_t[]>> chunks_;
  uint8_t* cur_ = nullptr;
  size_t left_ = 0;
  size_t count_ = 0;
};

}  // namespace detail
}  // namespace statecore
