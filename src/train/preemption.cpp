#include "shardgan/train/preemption.h"

#include <csignal>

namespace shardgan {
namespace {

volatile std::sig_atomic_t g_signal = 0;

extern "C" void record_signal(int sig) { g_signal = sig; }

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

void clear_preemption_signal() { g_signal = 0; }

}  // namespace shardgan
