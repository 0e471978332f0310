#include "progress_thread.h"

#include <string>

#include "shardgan/comm/communicator.h"
#include "shardgan/util/deadman.h"

namespace shardgan {

ProgressThread::ProgressThread(MPI_Comm comm, std::chrono::microseconds interval, double timeout_s)
    : interval_(interval) {
  int provided = MPI_THREAD_SINGLE;
  MPI_Query_thread(&provided);
  if (provided < MPI_THREAD_MULTIPLE) {
    throw CollectiveError(
        "dist.progress_thread: the MPI library was initialized without MPI_THREAD_MULTIPLE (provided level " +
        std::to_string(provided) +
        "), which a progress thread needs. Use an MPI built with thread support, or set dist.progress_thread: false");
  }
  int rc = MPI_SUCCESS;
  {
    Deadman deadline("MPI_Comm_dup for the progress thread", timeout_s, "dist.timeout_s");
    rc = MPI_Comm_dup(comm, &comm_);
  }
  if (rc != MPI_SUCCESS) {
    comm_ = MPI_COMM_NULL;
    throw CollectiveError("dist.progress_thread: MPI_Comm_dup failed (MPI error " + std::to_string(rc) + ")");
  }
  thread_ = std::thread([this] { run(); });
}

ProgressThread::~ProgressThread() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void ProgressThread::begin() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    ++in_flight_;
  }
  cv_.notify_one();
}

void ProgressThread::end() {
  std::lock_guard<std::mutex> lk(mu_);
  if (in_flight_ > 0) --in_flight_;
}

void ProgressThread::run() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    cv_.wait(lk, [this] { return stop_ || in_flight_ > 0; });
    if (stop_) return;
    lk.unlock();
    // Never matches (no rank sends on the duplicate); Open MPI runs opal_progress in it,
    // which advances libnbc schedules and the BTLs' pending transfers.
    int flag = 0;
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm_, &flag, MPI_STATUS_IGNORE);
    polls_.fetch_add(1, std::memory_order_relaxed);
    std::this_thread::sleep_for(interval_);
    lk.lock();
  }
}

}  // namespace shardgan
