#pragma once
/// One long-lived worker thread that runs an offload tier's jobs (reads or writes) in the
/// order they were submitted, so that the compute thread goes on while the tier works
/// (ZeRO-Infinity, Rajbhandari et al. 2021, Sec. 6.2: overlap-centric design). Gradient
/// offload adds reduced shards into the tier on one (ShardedModel::write_grad_async);
/// parameter offload's ReadAhead (read_ahead.h) reads master shards on another.
///
/// - One thread for the worker's whole life, started by the constructor; jobs run on it in
///   FIFO order, one at a time, each with the caller's tier mutex held (when one is given),
///   so that the tier sees one user at a time across the worker and the compute thread.
/// - The thread calls use_one_intra_op_thread() first: a job's LibTorch ops run on the
///   worker itself and leave the cores to the compute thread.
/// - At most `max_pending` jobs are queued or running; submit() beyond that waits.
/// - A job that throws does not stop the worker: its error (the first one, if several
///   failed) is rethrown once, by the next submit() or drain(), and then forgotten.
/// Local: no communication. No torch in this header.
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace shardgan {

class TierWorker {
 public:
  /// Starts the thread. `tier_mu` (may be nullptr: no lock) is held around each job and
  /// must outlive the worker. `max_pending` values below 1 read as 1.
  TierWorker(std::mutex* tier_mu, size_t max_pending);
  /// Waits for the jobs still queued or running (they run; their errors are dropped), then
  /// stops and joins the thread.
  ~TierWorker();
  TierWorker(const TierWorker&) = delete;
  TierWorker& operator=(const TierWorker&) = delete;

  /// Queues `job`, to run on the worker after every job submitted before it, with the tier
  /// mutex held. Waits while max_pending jobs are queued or running. Rethrows (once) the
  /// error of a job that failed earlier, and then does not queue `job`.
  void submit(std::function<void()> job);
  /// Waits until every job submitted so far has run; rethrows the first error among the
  /// jobs that failed since the last rethrow (once).
  void drain();
  /// Jobs queued or running now.
  size_t pending() const;
  /// The worker thread's id (never the caller's).
  std::thread::id thread_id() const { return thread_.get_id(); }

 private:
  void run();
  void rethrow_locked(std::unique_lock<std::mutex>& lk);

  std::mutex* tier_mu_;
  const size_t max_pending_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  size_t running_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;  // last: started once the members above exist
};

}  // namespace shardgan
