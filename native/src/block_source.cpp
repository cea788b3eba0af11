// Stored blocks opened in order for a bulk load (design: block_source.h).
#include "block_source.h"

#include <cstring>
#include <exception>

namespace statecore {

BlockSource::BlockSource(const uint8_t* data, size_t size, const StoredBlockRef* blocks,
                         size_t count, bool has_validity, bool ahead)
    : data_(data), size_(size), blocks_(blocks), count_(count), has_validity_(has_validity) {
  if (ahead && count > 1) thread_ = std::thread([this] { run(); });
}

BlockSource::~BlockSource() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void BlockSource::run() {
  for (size_t b = 0; b < count_; ++b) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || b < held_ + kAhead; });
      if (stop_) return;
    }
    // Slot b % kAhead last held block b - kAhead, which the loader has handed back.
    std::string why;
    std::exception_ptr error;
    try {
      why = open_block(data_, size_, blocks_[b], has_validity_, &ring_[b % kAhead]);
    } catch (...) {  // std::bad_alloc: raised on the loading thread, as without a worker
      error = std::current_exception();
    }
    const bool bad = !why.empty() || error != nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      why_[b % kAhead] = std::move(why);
      error_ = error;
      opened_ = b + 1;
    }
    cv_.notify_all();
    if (bad) return;  // the loader stops at it
  }
}

const uint8_t* BlockSource::open(size_t b, std::vector<uint8_t>* keep, std::string* why) {
  if (!thread_.joinable()) {
    std::vector<uint8_t>* buf = keep != nullptr ? keep : &own_;
    *why = open_block(data_, size_, blocks_[b], has_validity_, buf);
    return why->empty() ? buf->data() : nullptr;
  }
  {
    std::unique_lock<std::mutex> lock(mu_);
    held_ = b;
    cv_.notify_all();
    cv_.wait(lock, [&] { return opened_ > b; });
    if (opened_ == b + 1 && error_ != nullptr) std::rethrow_exception(error_);
    *why = why_[b % kAhead];
  }
  if (!why->empty()) return nullptr;
  const std::vector<uint8_t>& got = ring_[b % kAhead];
  if (keep == nullptr) return got.data();
  const size_t n = static_cast<size_t>(blocks_[b].raw_length);
  if (keep->size() < n) keep->resize(n);
  if (n != 0) std::memcpy(keep->data(), got.data(), n);
  return keep->data();
}

}  // namespace statecore
