#include "shardgan/util/deadman.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

namespace shardgan {
namespace {

std::string launcher_world_rank() {
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"}) {
    if (const char* e = std::getenv(v)) return e;
  }
  return "?";
}

std::chrono::steady_clock::time_point after(double seconds) {
  return std::chrono::steady_clock::now() +
         std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(seconds));
}

}  // namespace

Deadman::Deadman(std::string what, double seconds, std::string why)
    : what_(std::move(what)), why_(std::move(why)), deadline_(after(seconds)), seconds_(seconds) {
  thread_ = std::thread([this] { run(); });
}

Deadman::~Deadman() {
  disarm();
  if (thread_.joinable()) thread_.join();
}

void Deadman::rearm(std::string what, double seconds, std::string why) {
  std::lock_guard<std::mutex> lk(mu_);
  what_ = std::move(what);
  why_ = std::move(why);
  seconds_ = seconds;
  deadline_ = after(seconds);
  cv_.notify_all();
}

void Deadman::disarm() {
  std::lock_guard<std::mutex> lk(mu_);
  armed_ = false;
  cv_.notify_all();
}

void Deadman::run() {
  std::unique_lock<std::mutex> lk(mu_);
  while (armed_) {
    if (cv_.wait_until(lk, deadline_) == std::cv_status::timeout && armed_ &&
        std::chrono::steady_clock::now() >= deadline_) {
      std::fprintf(stderr,
                   "shardgan-train: error on rank %s: %s did not finish within %g s (%s): a peer rank or host is "
                   "unreachable or never started; this rank exits\n",
                   launcher_world_rank().c_str(), what_.c_str(), seconds_, why_.c_str());
      std::fflush(stderr);
      ::_exit(kExitStatus);
    }
  }
}

}  // namespace shardgan
