#pragma once
// Gradient offload's writer (ShardedModel::write_grad_async): one worker thread that adds
// reduced gradient shards into the offload tier in the order they were submitted, under
// the model's tier lock, so that the compute thread goes on with the next unit's backward
// while the previous unit's shard goes to disk (ZeRO-Infinity, Rajbhandari et al. 2021,
// Sec. 6.2: overlap-centric design). At most `max_pending` jobs are queued or running; a
// submit beyond that waits. Private to the sharding layer.
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace shardgan::detail {

class GradWriter {
 public:
  GradWriter(std::mutex& tier_mu, size_t max_pending);
  /// Waits for the jobs still queued (their errors are dropped) and stops the thread.
  ~GradWriter();
  GradWriter(const GradWriter&) = delete;
  GradWriter& operator=(const GradWriter&) = delete;

  /// Queues `job` (run on the worker with the tier lock held). Waits while max_pending
  /// jobs are queued or running. Rethrows the error of a job that failed earlier (once).
  void submit(std::function<void()> job);
  /// Waits until every submitted job has run; rethrows the first error among them (once).
  void drain();

 private:
  void run();
  void rethrow_locked(std::unique_lock<std::mutex>& lk);

  std::mutex& tier_mu_;
  const size_t max_pending_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  size_t running_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace shardgan::detail
