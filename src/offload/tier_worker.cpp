#include "shardgan/offload/tier_worker.h"

#include "shardgan/util/threads.h"

namespace shardgan {

TierWorker::TierWorker(std::mutex* tier_mu, size_t max_pending)
    : tier_mu_(tier_mu), max_pending_(max_pending < 1 ? 1 : max_pending), thread_([this] { run(); }) {}

TierWorker::~TierWorker() {
  {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [this] { return queue_.empty() && running_ == 0; });
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void TierWorker::rethrow_locked(std::unique_lock<std::mutex>& lk) {
  if (!error_) return;
  std::exception_ptr e = error_;
  error_ = nullptr;
  lk.unlock();
  std::rethrow_exception(e);
}

void TierWorker::submit(std::function<void()> job) {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [this] { return queue_.size() + running_ < max_pending_ || error_; });
  rethrow_locked(lk);
  queue_.push_back(std::move(job));
  lk.unlock();
  cv_.notify_all();
}

void TierWorker::drain() {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [this] { return queue_.empty() && running_ == 0; });
  rethrow_locked(lk);
}

size_t TierWorker::pending() const {
  std::lock_guard<std::mutex> lk(mu_);
  return queue_.size() + running_;
}

void TierWorker::run() {
  use_one_intra_op_thread();  // the compute thread keeps the cores
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    cv_.wait(lk, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_
    std::function<void()> job = std::move(queue_.front());
    queue_.pop_front();
    ++running_;
    lk.unlock();
    std::exception_ptr err;
    try {
      std::unique_lock<std::mutex> tier;
      if (tier_mu_) tier = std::unique_lock<std::mutex>(*tier_mu_);
      job();
    } catch (...) {
      err = std::current_exception();
    }
    job = nullptr;  // frees what the job held (a gradient shard) before the next wait
    lk.lock();
    --running_;
    if (err && !error_) error_ = err;
    cv_.notify_all();
  }
}

}  // namespace shardgan
