// Stored blocks opened in file order for a bulk load (bulk_load.cpp load_blocks), on the loading
// thread or on a worker thread ahead of it. Not a public header.
//
// Opening a block (block_codec.h open_block: XXH64 of its stored bytes, LZ4 decompression, the
// payload's checks) is about 0.4 of a restore's CPU time and touches nothing the load touches:
// on a worker thread it runs while the loader stores the block before it, so the load takes
// about the time of the larger of the two steps rather than of their sum (the CPU time is the
// same, spent on two cores).
#pragma once
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "statecore/block_codec.h"

namespace statecore {

class BlockSource {
 public:
  // The blocks `blocks[0, count)` of `data[0, size)` (kept alive and unchanged by the caller
  // until this is destroyed), payloads with a validity bitmap with `has_validity`. `ahead`: open
  // them on a worker thread, up to kAhead blocks before the one the loader holds; else each on
  // the calling thread when it is asked for.
  BlockSource(const uint8_t* data, size_t size, const StoredBlockRef* blocks, size_t count,
              bool has_validity, bool ahead);
  // Stops the worker thread (a load that ended early) and waits for it.
  ~BlockSource();
  BlockSource(const BlockSource&) = delete;
  BlockSource& operator=(const BlockSource&) = delete;

  // Block b opened (b = 0, 1, 2, ... in turn, each once; asking for a block hands back the one
  // before it): its checked payload of blocks[b].raw_length bytes, or nullptr with *why set to
  // what is wrong with it (open_block's wording). The payload is in `*keep` when given (which
  // the caller then owns), else in memory of this source that the next call may reuse.
  // std::bad_alloc (from the worker thread too) when no memory is left for the payload.
  const uint8_t* open(size_t b, std::vector<uint8_t>* keep, std::string* why);

 private:
  static constexpr size_t kAhead = 4;  // blocks opened ahead: a few hundred KiB, in L2
  void run();

  const uint8_t* data_;
  size_t size_;
  const StoredBlockRef* blocks_;
  size_t count_;
  bool has_validity_;
  std::vector<uint8_t> own_;  // without a worker thread
  std::vector<uint8_t> ring_[kAhead];
  std::string why_[kAhead];
  std::mutex mu_;
  std::condition_variable cv_;
  size_t opened_ = 0;  // blocks the worker finished (a bad one included); guarded by mu_
  size_t held_ = 0;    // the block the loader holds: the worker may fill up to held_ + kAhead - 1
  bool stop_ = false;  // guarded by mu_
  std::exception_ptr error_;  // what opening block opened_ - 1 threw; guarded by mu_
  std::thread thread_;
};

}  // namespace statecore
