// Write-through copy-on-write of the flat engine (engine internal; design: docs/state-map.md
// "Write-through copy-on-write").
//
// While a snapshot of a flat map has not been read yet, the owner's batch kernels write the
// pages it shares in place and save each slot's bytes as of the snapshot first, once per slot
// (the slot's first write since the snapshot: its `modified` is older than the map version).
// The first reader of the snapshot then copies the table into the snapshot's own pages, page by
// page, while the owner keeps writing, puts the saved slots back and drops its reference to the
// shared pages, which the owner finds exclusive again. So what the processing thread pays for a
// snapshot is one saved slot per key written before the reader copied the key's page, not a page
// per page touched; the table-sized copy is made by the reading (checkpoint) thread.
//
// The two threads keep apart by the map until the reader starts on it, then page by page. A
// kernel call of the owner takes the whole map (gate_) at its first write lane on it while the
// reader has not started, and writes with saves alone; the reader takes the gate in a gap between
// two calls (or asks the owner's next calls to leave it, reader_waiting_) and keeps it. From then
// on the owner marks the one page of the map it writes in place (owner_page_, kept from its first
// write there until it writes another page of the map or its kernel call ends), the reader the
// one page it copies (reader_page_). Each publishes its page and then reads the other's, both
// sequentially consistent (Dekker's mutual exclusion), so at most one of them goes on with a
// page:
//  - the reader skips a page the owner holds and comes back to it after the rest;
//  - the owner never waits: a page the reader copies right now is written the classic way (a
//    page copy, through the general path), a page already copied (copied_) in place without a
//    save: the reader no longer looks at it.
// The owner saves slots only holding the map or a page not yet copied, so every record was
// appended before the reader copied its page, and the reader reads the records after its last
// page. The map stage exists because the page stage costs an exchange per row on pages not yet
// copied, which is every row of a map the reader has not reached.
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

// A wait of the reader for a page the owner holds: a few pauses, then yields.
void through_backoff(unsigned spins);

class WriteThrough : public std::enable_shared_from_this<WriteThrough> {
 public:
  static constexpr uint32_t kNoPage = 0xFFFFFFFFu;

  // Set by the reader once its copy is complete (or by a release of the unread snapshot): the
  // owner drops the state at its next write lane on the map (FlatLane::open).
  std::atomic<bool> done{false};

  WriteThrough(uint32_t stride, size_t page_count)
      : copied_(new std::atomic<uint8_t>[page_count]),
        stride_(stride),
        record_(8 + stride),
        per_chunk_(kChunkBytes / (8 + stride)) {
    for (size_t i = 0; i < page_count; ++i) copied_[i].store(0, std::memory_order_relaxed);
  }
  WriteThrough(const WriteThrough&) = delete;
  WriteThrough& operator=(const WriteThrough&) = delete;

  // ---- owner ----

  // Before the owner's in-place write of the slot at byte `offset` of page `page` (shared with
  // the snapshot), whose meta is `meta`: true when the slot may be written in place now (saved
  // first when this is its first write since the snapshot, meta != version, and the page was
  // not copied yet); false when the reader copies that page right now (the caller then copies
  // the page). kStride: the stride when the caller knows it at compile time (0: the table's),
  // so the batch kernels' hot loop copies the slot with a few moves rather than a call.
  template <uint32_t kStride = 0>
  [[gnu::always_inline]] bool owner_write(uint32_t page, uint32_t offset, const uint8_t* slot,
                                          uint32_t version) {
    if (whole_) {
      if (load_u32(slot) != version) save<kStride>(page, offset, slot);
      return true;
    }
    if (held_ != page) {
      if (copied_[page].load(std::memory_order_acquire)) return true;
      const int h = hold(page);
      if (h <= 0) return h == 0;
    }
    if (load_u32(slot) != version) save<kStride>(page, offset, slot);
    return true;
  }
  // At the owner's first write lane on the map in a kernel call: while the reader has not
  // started on the map and does not wait to, the call takes the whole map (gate_) and writes
  // with no per-page exchange.
  void begin_call();
  // The end of the owner's kernel call: the map or the page it holds goes back
  // (release_through_claims).
  void end_call() {
    claimed_ = false;
    if (whole_) {
      whole_ = false;
      gate_.store(kOpen, std::memory_order_release);
    }
    release_held();
  }

  // ---- reader ----

  // Copies every page i with src[i] != nullptr into dst[i] (n pages of `bytes` bytes each),
  // marking each copied as it goes; pages the owner holds are taken after the others (waiting
  // for the owner to move on, which it does at its next write to another page of the map or at
  // the end of its kernel call). Then the saved records can be read (for_each_newest_first).
  void copy_pages(const uint8_t* const* src, uint8_t* const* dst, size_t n, size_t bytes);

  // After copy_pages: fn(page, offset, slot bytes) for every record, newest first (so that
  // applying them in this order leaves each slot with its oldest saved bytes: its bytes at
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
  size_t size() const { return count_; }

 private:
  // Records go to chunks from the C++ heap rather than to huge-page pool blocks: they are
  // written once, sequentially, and freed when the snapshot is read, so they need no huge page,
  // and a freed chunk is reused by the next map's records.
  static constexpr size_t kChunkBytes = size_t(32) << 10;

  // Owner: takes `page` (giving back the one held before). 1: held, not copied (saves needed);
  // 0: copied meanwhile (write in place, no save); -1: the reader copies it now.
  [[gnu::noinline]] int hold(uint32_t page);

  void release_held() {
    held_ = kNoPage;
    owner_page_.store(kNoPage, std::memory_order_release);
  }

  template <uint32_t kStride>
  [[gnu::always_inline]] void save(uint32_t page, uint32_t offset, const uint8_t* slot) {
    if (left_ == 0) grow();
    store_u32(cur_, page);
    store_u32(cur_ + 4, offset);
    std::memcpy(cur_ + 8, slot, kStride ? kStride : stride_);
    cur_ += record_;
    --left_;
    ++count_;
  }
  [[gnu::noinline, gnu::cold]] void grow() {
    chunks_.emplace_back(new uint8_t[per_chunk_ * record_]);
    cur_ = chunks_.back().get();
    left_ = per_chunk_;
  }

  static constexpr uint32_t kOpen = 0;    // neither holds the map
  static constexpr uint32_t kOwner = 1;   // an owner's kernel call holds the whole map
  static constexpr uint32_t kReader = 2;  // the reader started copying: pages kept apart from now
  std::atomic<uint32_t> gate_{kOpen};
  std::atomic<bool> reader_waiting_{false};  // the owner's next calls leave the gate to the reader
  bool whole_ = false;                       // owner only: this call holds gate_ (kOwner)
  std::atomic<uint32_t> owner_page_{kNoPage};       // the page the owner writes in place
  std::atomic<uint32_t> reader_page_{kNoPage};      // the page the reader copies
  std::unique_ptr<std::atomic<uint8_t>[]> copied_;  // 1: the reader has its copy of the page
  uint32_t held_ = kNoPage;                         // owner only: owner_page_ as it set it
  bool claimed_ = false;  // owner only: in t_claims, for the end of the kernel call

  // Owner-appended, read by the reader after its last page (see the file comment).
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
