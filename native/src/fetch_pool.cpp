#include "statecore/fetch_pool.h"

#include <algorithm>
#include <utility>

#ifdef __linux__
#include <pthread.h>
#endif

namespace statecore {

void Countdown::reset(size_t n) {
  std::lock_guard<std::mutex> g(mu_);
  left_ = n;
}

void Countdown::count_down() {
  std::lock_guard<std::mutex> g(mu_);
  if (left_ > 0 && --left_ == 0) cv_.notify_all();
}

void Countdown::wait() {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [this] { return left_ == 0; });
}

FetchPool::FetchPool(size_t threads) {
  threads = std::max<size_t>(threads, 1);
  threads_.reserve(threads);
  for (size_t i = 0; i < threads; ++i) threads_.emplace_back([this] { work(); });
}

FetchPool::~FetchPool() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void FetchPool::run(size_t n, std::function<void(size_t)> task, Countdown* done) {
  if (n == 0) return;
  auto shared = std::make_shared<std::function<void(size_t)>>(std::move(task));
  {
    std::lock_guard<std::mutex> g(mu_);
    for (size_t i = 0; i < n; ++i) queue_.push_back(Item{shared, i, done});
  }
  if (n == 1) {
    cv_.notify_one();
  } else {
    cv_.notify_all();
  }
}

void FetchPool::work() {
#ifdef __linux__
  // Named so top -H, perf and /proc/<pid>/task tell the reads apart from the threads that
  // hand them out (a new thread inherits its creator's name).
  ::pthread_setname_np(::pthread_self(), "sc-fetch");
#endif
  for (;;) {
    Item item;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_, nothing left
      item = std::move(queue_.front());
      queue_.pop_front();
    }
    (*item.task)(item.index);
    item.task.reset();  // before the count-down: the caller may free what the task refers to
    item.done->count_down();
  }
}

}  // namespace statecore
