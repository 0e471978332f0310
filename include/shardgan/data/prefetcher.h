#pragma once
/// A background thread that produces numbered items in order into a bounded queue.
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include <ATen/core/Tensor.h>

namespace shardgan::data {

/// Runs `produce(seq)` for seq = first, first + 1, ... on its own thread, keeping at most
/// `capacity` finished items that next() has not taken yet (so memory is bounded by
/// capacity + 1 items: the queue plus the one being produced). No MPI and no collectives
/// on the thread. Not thread-safe itself: one consumer thread calls next().
class Prefetcher {
 public:
  /// One produced item: the tensors `produce` returned for sequence number `seq`.
  struct Item {
    int64_t seq = 0;
    std::vector<at::Tensor> tensors;
  };
  using Produce = std::function<std::vector<at::Tensor>(int64_t seq)>;

  /// Starts the thread. Throws std::invalid_argument if capacity < 1.
  Prefetcher(Produce produce, int64_t first, int64_t capacity);
  /// Stops the thread (it finishes the item it is producing, if any) and joins it.
  /// Never throws; an exception of `produce` nobody took is dropped.
  ~Prefetcher();
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  /// The next item in order (seq = first, first + 1, ...), waiting for it if the thread
  /// has not produced it yet. When `produce` threw for this seq, rethrows that exception
  /// (here, on the consumer's thread), and again on every later call: the thread stops
  /// at the first exception.
  Item next();
  /// Seconds next() spent waiting for the thread so far (0 when I/O kept ahead).
  double wait_s() const { return wait_s_; }
  int64_t capacity() const { return capacity_; }
  /// Blocks the thread between two items: returns once `produce` is not running, and
  /// `produce` does not start again until the lock returned is released. For a fork()
  /// that must not copy a library lock held mid-call (an asynchronous checkpoint's
  /// copy-on-write snapshot forks while this thread may be inside HDF5).
  std::unique_lock<std::mutex> hold() { return std::unique_lock<std::mutex>(produce_mu_); }

 private:
  void loop(int64_t first);

  Produce produce_;
  const int64_t capacity_;
  std::mutex mu_;
  std::mutex produce_mu_;  // held by the thread while `produce` runs (hold())
  std::condition_variable not_full_, not_empty_;
  std::deque<Item> queue_;
  std::exception_ptr error_;  // set once, when produce threw; the thread then ends
  bool stop_ = false;
  double wait_s_ = 0;
  std::thread thread_;  // last: starts after every other member is constructed
};

}  // namespace shardgan::data
