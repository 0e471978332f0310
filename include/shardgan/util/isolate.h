#pragma once
/// Running a read that a library might crash on, or loop in, in a forked child process.
/// Debian's HDF5 1.10 trusts a file's metadata more than a crafted or corrupted file
/// deserves: some files make it read out of bounds (SIGSEGV in H5HG_read) or spin for
/// minutes. Isolated, such a file becomes an error naming it, not a dead or hung rank.
/// Local (never a collective). Used by src/h5/probe.cpp and `shardgan-ckpt verify`.
#include <functional>
#include <string>
#include <vector>

namespace shardgan {

/// How an isolated run ended.
struct IsolatedResult {
  std::vector<std::string> problems;  ///< what `fn` appended, plus its exception's text
  int signal = 0;                     ///< the signal that ended the child, 0 if none
  int exit_status = 0;                ///< the child's exit status when it exited (0: fn returned)
  bool timed_out = false;             ///< still running at the deadline: killed with SIGKILL
  double deadline_s = 0;              ///< the deadline it ran under, seconds (<= 0: none)
  /// Empty when the child finished in time with status 0; otherwise one line saying how it
  /// ended ("crashed (signal 11, Segmentation fault)", "did not finish within 120 s",
  /// "exited with status 3"), for the caller to put after the name of what it read.
  std::string failure() const;
};

/// The child's name (/proc/PID/comm), which tests use to tell it from other children.
inline constexpr const char* kIsolatedChildName = "sg-isolated";

/// Runs `fn` in a child made by fork(), named kIsolatedChildName and killed with its parent
/// (PR_SET_PDEATHSIG); `fn` appends the problems it finds to its argument
/// (an exception it throws becomes one more problem, prefixed with `what` and ": ").
/// Waits for the child at most `deadline_s` seconds (<= 0: no deadline), then kills it
/// with SIGKILL. The child leaves with _exit(): no atexit handlers, no HDF5 or MPI
/// shutdown. The child has only the calling thread, so `fn` must not wait for other
/// threads or take locks they may hold (OpenMP regions, MPI calls, LibTorch's thread
/// pool); plain HDF5 reads are fine. When pipe() or fork() fails, `fn` runs in this
/// process instead, without a deadline. Thread-safe as fork() is; throws only
/// std::bad_alloc.
IsolatedResult run_isolated(const std::string& what, const std::function<void(std::vector<std::string>&)>& fn,
                            double deadline_s);

}  // namespace shardgan
