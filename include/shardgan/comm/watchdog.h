#pragma once
/// A thread that watches collectives the host does not wait for: c10d's ProcessGroupNCCL
/// watchdog. With device-side waits (NcclCommunicator, dist.blocking_wait false), Work::wait()
/// only makes the compute stream wait for the collective, so the host never sees a hung peer;
/// this thread polls every collective in flight from its launch and enforces the timeout.
///
/// On the first timeout or error it calls `on_failure` (which aborts the NCCL communicator,
/// so that kernels stuck on a dead peer return), records the message, which failure()
/// returns to the compute thread's next collective (it then throws, and main() ends the job
/// with MPI_Abort), and, unless `exit_after_s` is 0, ends this process with exit status
/// kExitStatus after `exit_after_s` seconds if the watchdog is still alive: a compute thread
/// blocked elsewhere cannot hang the job. Generic (no CUDA): entries are callbacks, so the
/// CPU tests drive it with fakes. Thread-safe; local (never a collective).
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <list>
#include <mutex>
#include <string>
#include <thread>

namespace shardgan {

class CollectiveWatchdog {
 public:
  using Clock = std::chrono::steady_clock;
  /// Exit status of a process the watchdog ends (as `timeout`'s 124).
  static constexpr int kExitStatus = 124;

  /// Starts the thread. It polls every entry each `interval` (> 0). `on_failure` runs once,
  /// on the watchdog thread, with the failure's message.
  CollectiveWatchdog(std::chrono::microseconds interval, std::function<void(const std::string&)> on_failure,
                     double exit_after_s);
  /// Stops and joins the thread, then calls `release` of every entry still watched. Does not
  /// throw.
  ~CollectiveWatchdog();
  CollectiveWatchdog(const CollectiveWatchdog&) = delete;
  CollectiveWatchdog& operator=(const CollectiveWatchdog&) = delete;

  /// Watches one collective, called `what` in messages, launched with `timeout_s` seconds
  /// ending at `deadline`. `done` (called on the watchdog thread) returns true once it has
  /// finished and throws std::exception on an error; `release` runs once after `done`
  /// returned true or the entry failed, or from the destructor. After a failure new entries
  /// are released at once.
  void watch(std::string what, Clock::time_point deadline, double timeout_s, std::function<bool()> done,
             std::function<void()> release);
  /// The first failure's message ("" while none).
  std::string failure() const;
  /// Whether that failure was a timeout (false: an error, or none yet).
  bool timed_out() const;
  /// Entries still watched.
  size_t pending() const;

 private:
  struct Entry {
    std::string what;
    Clock::time_point deadline;
    double timeout_s;
    std::function<bool()> done;
    std::function<void()> release;
  };
  void run();
  void fail(const std::string& msg, bool timed_out);

  std::chrono::microseconds interval_;
  std::function<void(const std::string&)> on_failure_;
  double exit_after_s_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::list<Entry> entries_;
  std::string failure_;
  bool timed_out_ = false;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace shardgan
