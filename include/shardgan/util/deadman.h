#pragma once
/// A deadline for blocking work that has no timeout of its own: MPI_Init, and the start-up
/// calls before the first communicator exists (MPI_Comm_split_type, the node's rank
/// all-gather). A thread waits until disarm() or the deadline; at the deadline it prints
/// "shardgan-train: error on rank R: <what> did not finish within S s (<why>)" to stderr
/// and ends the process with _exit(kExitStatus), since the blocked thread cannot be woken
/// (Open MPI's MPI_Init waits for every host's daemon; a host cut off stalls it for good).
/// Local (never a collective); thread-safe.
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

namespace shardgan {

class Deadman {
 public:
  /// Exit status of a process the deadline ends (as `timeout`'s and the collective
  /// watchdog's 124).
  static constexpr int kExitStatus = 124;
  /// Starts the thread: `what` must finish within `seconds` (> 0) from now; `why` says where
  /// the bound comes from (e.g. "dist.timeout_s"). The rank in the message is MPI's world
  /// rank from the launcher's environment (OMPI_COMM_WORLD_RANK, PMIX_RANK, PMI_RANK,
  /// SLURM_PROCID), or "?" before one is known.
  Deadman(std::string what, double seconds, std::string why);
  /// disarm(), then joins the thread. Does not throw.
  ~Deadman();
  Deadman(const Deadman&) = delete;
  Deadman& operator=(const Deadman&) = delete;
  /// A new deadline, `seconds` from now, for the next piece of work (its own `what`, `why`).
  void rearm(std::string what, double seconds, std::string why);
  /// No deadline any more: the thread ends.
  void disarm();

 private:
  void run();
  std::mutex mu_;
  std::condition_variable cv_;
  std::string what_, why_;
  std::chrono::steady_clock::time_point deadline_;
  double seconds_ = 0;
  bool armed_ = true;
  std::thread thread_;
};

}  // namespace shardgan
