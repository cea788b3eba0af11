// The native threads that read and open a run lookup's blocks (run_lookup.h
// LookupStep::run). Why not the interpreter's thread pool: each of its tasks takes the
// GIL to start and again to finish, and while the searching thread runs Python between two
// native calls (or itself waits to retake the GIL), the fetch threads queue behind it; on a
// machine with few cores every such hand-over waits for a thread switch, and reads meant
// to run side by side run one after another. These threads never touch Python.
#pragma once
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace statecore {

// Counts a batch of tasks down to zero; wait() returns once all have finished. Thread-safe.
class Countdown {
 public:
  void reset(size_t n);
  void count_down();
  void wait();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  size_t left_ = 0;
};

class FetchPool {
 public:
  explicit FetchPool(size_t threads);  // at least one thread
  FetchPool(const FetchPool&) = delete;
  FetchPool& operator=(const FetchPool&) = delete;
  ~FetchPool();  // runs the queued tasks to their end, then joins the threads
  size_t threads() const { return threads_.size(); }
  // Queues task(i) for each i in [0, n) and returns at once; each finished task counts `done`
  // down once (the caller reset it to n). A task must not throw.
  void run(size_t n, std::function<void(size_t)> task, Countdown* done);

 private:
  struct Item {
    std::shared_ptr<std::function<void(size_t)>> task;
    size_t index;
    Countdown* done;
  };
  void work();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace statecore
