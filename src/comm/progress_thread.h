#pragma once
// Private to src/comm. A helper thread that drives the MPI library's progress engine while
// non-blocking collectives are in flight.
//
// Open MPI 4 has no asynchronous progress for its non-blocking collectives (libnbc) or for
// the shared-memory BTL's single-copy (CMA) transfers: a request started with MPI_Iallgather
// advances only while this process is inside some MPI call. Without help, a prefetched
// all-gather thus does its work inside the compute thread's wait. This thread enters MPI
// (MPI_Iprobe on a private duplicate communicator nobody sends on, which runs
// opal_progress) every `interval` while any request is in flight, and sleeps on a condition
// variable otherwise, so it takes no CPU between collectives. It needs MPI_THREAD_MULTIPLE.
// The requests stay owned by the threads that started them: this one never tests them.
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

namespace shardgan {

class ProgressThread {
 public:
  /// Collective over `comm` (MPI_Comm_dup, which has no request to time out: a Deadman
  /// ends the process if it has not returned after `timeout_s` seconds, as
  /// MpiCommunicator::split does). Throws CollectiveError unless MPI was initialized with
  /// MPI_THREAD_MULTIPLE, or when MPI_Comm_dup fails. `interval` >= 1 us.
  ProgressThread(MPI_Comm comm, std::chrono::microseconds interval, double timeout_s);
  /// Stops and joins the thread, then frees the duplicate (if MPI is not finalized).
  ~ProgressThread();
  ProgressThread(const ProgressThread&) = delete;
  ProgressThread& operator=(const ProgressThread&) = delete;

  /// A request was started (any thread): poll until the matching end().
  void begin();
  /// A request begun with begin() completed.
  void end();
  /// MPI calls this thread has made (for tests and logs).
  int64_t polls() const { return polls_.load(std::memory_order_relaxed); }

 private:
  void run();

  MPI_Comm comm_ = MPI_COMM_NULL;
  std::chrono::microseconds interval_;
  std::mutex mu_;
  std::condition_variable cv_;
  int in_flight_ = 0;
  bool stop_ = false;
  std::atomic<int64_t> polls_{0};
  std::thread thread_;
};

}  // namespace shardgan
