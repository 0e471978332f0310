#include "shardgan/data/prefetcher.h"

#include <chrono>
#include <stdexcept>
#include <string>

#include "shardgan/util/threads.h"

namespace shardgan::data {

Prefetcher::Prefetcher(Produce produce, int64_t first, int64_t capacity)
    : produce_(std::move(produce)), capacity_(capacity) {
  if (capacity < 1) throw std::invalid_argument("Prefetcher: capacity must be >= 1, got " + std::to_string(capacity));
  thread_ = std::thread([this, first] { loop(first); });
}

Prefetcher::~Prefetcher() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  not_full_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Prefetcher::loop(int64_t first) {
  use_one_intra_op_thread();
  for (int64_t seq = first;; ++seq) {
    {
      std::unique_lock<std::mutex> lk(mu_);
      not_full_.wait(lk, [&] { return stop_ || static_cast<int64_t>(queue_.size()) < capacity_; });
      if (stop_) return;
    }
    Item item{seq, {}};
    std::exception_ptr err;
    try {
      std::lock_guard<std::mutex> hold(produce_mu_);
      item.tensors = produce_(seq);  // outside the lock: next() can take earlier items meanwhile
    } catch (...) {
      err = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (err) {
        error_ = err;
      } else {
        queue_.push_back(std::move(item));
      }
    }
    not_empty_.notify_one();
    if (err) return;
  }
}

Prefetcher::Item Prefetcher::next() {
  std::unique_lock<std::mutex> lk(mu_);
  if (queue_.empty() && !error_) {
    const auto t0 = std::chrono::steady_clock::now();
    not_empty_.wait(lk, [&] { return !queue_.empty() || error_; });
    wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  if (queue_.empty()) std::rethrow_exception(error_);  // every item before the failed one was taken
  Item item = std::move(queue_.front());
  queue_.pop_front();
  lk.unlock();
  not_full_.notify_one();
  return item;
}

}  // namespace shardgan::data
