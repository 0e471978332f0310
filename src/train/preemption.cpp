#include "shardgan/train/preemption.h"

#include <time.h>

#include <algorithm>
#include <csignal>

namespace shardgan {
namespace {

volatile std::sig_atomic_t g_signal = 0;
timespec g_signal_time{};  // CLOCK_MONOTONIC at the first signal

void set_default(int sig) {
  struct sigaction sa {};
  sa.sa_handler = SIG_DFL;
  sigemptyset(&sa.sa_mask);
  sigaction(sig, &sa, nullptr);
}

extern "C" void record_signal(int sig) {
  if (g_signal == 0) clock_gettime(CLOCK_MONOTONIC, &g_signal_time);
  g_signal = sig;
  // A second SIGTERM or SIGUSR1 now ends the process (the scheduler's, or a user's Ctrl-C
  // equivalent): the default handler used to be left out for good.
  set_default(SIGTERM);
  set_default(SIGUSR1);
}

}  // namespace

void install_preemption_handlers() {
  struct sigaction sa {};
  sa.sa_handler = record_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // blocking I/O resumes; the loop polls the flag between steps
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGUSR1, &sa, nullptr);
}

int preemption_signal() { return g_signal; }

double preemption_signal_age_s() {
  if (g_signal == 0) return -1;
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<double>(now.tv_sec - g_signal_time.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec - g_signal_time.tv_nsec);
}

bool must_abandon_step(double grace_s, double age_s, double step_s, double elapsed_s, double save_s) {
  if (age_s < 0) return false;
  if (step_s <= 0) return true;  // no step finished yet: its length is unknown
  const double rest = std::max(0.0, step_s - elapsed_s);
  return grace_s - age_s < 1.25 * (rest + save_s) + 1.0;
}

void clear_preemption_signal() { g_signal = 0; }

}  // namespace shardgan
