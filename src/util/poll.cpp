#include "shardgan/util/poll.h"

#include <sched.h>
#if defined(__linux__)
#include <sys/prctl.h>
#endif

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

namespace shardgan {
namespace {

void cpu_pause() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Lowers the calling thread's timer slack at the first lower() (the first nap) and puts the
// old value back on destruction (return or throw).
class TimerSlack {
 public:
  explicit TimerSlack(int64_t ns) : ns_(ns) {}
  ~TimerSlack() {
#if defined(__linux__)
    if (saved_ >= 0) prctl(PR_SET_TIMERSLACK, static_cast<unsigned long>(saved_), 0, 0, 0);
#endif
  }
  TimerSlack(const TimerSlack&) = delete;
  TimerSlack& operator=(const TimerSlack&) = delete;
  void lower() {
#if defined(__linux__)
    if (ns_ <= 0 || tried_) return;
    tried_ = true;
    const int old = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
    if (old < 0 || old <= ns_) return;  // already at least as fine
    if (prctl(PR_SET_TIMERSLACK, static_cast<unsigned long>(ns_), 0, 0, 0) == 0) saved_ = old;
#endif
  }

 private:
  int64_t ns_;
  int64_t saved_ = -1;  // the slack to put back, once lowered
  bool tried_ = false;
};

}  // namespace

PollSchedule PollSchedule::own_core() { return PollSchedule{}; }

PollSchedule PollSchedule::shared_core() {
  PollSchedule s;
  s.spins = 0;
  s.yields = 64;
  s.first_nap = std::chrono::microseconds(20);
  s.nap_step = std::chrono::microseconds(20);
  s.sleep_cap = std::chrono::microseconds(1000);
  s.timer_slack_ns = 0;
  return s;
}

PollSchedule choose_poll_schedule(int ranks_on_node, int cpus) {
  return ranks_on_node > 0 && cpus > 0 && ranks_on_node > cpus ? PollSchedule::shared_core()
                                                                : PollSchedule::own_core();
}

const PollSchedule& default_poll_schedule() {
  static const PollSchedule chosen = [] {
    int ranks = 0;
    for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"}) {
      if (const char* v = std::getenv(name)) {
        ranks = std::atoi(v);
        break;
      }
    }
    return choose_poll_schedule(ranks, static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)));
  }();
  return chosen;
}

bool poll_until(PollClock::time_point deadline, const std::function<bool()>& done,
                const std::function<void()>& progress, const PollSchedule& schedule) {
  TimerSlack slack(schedule.timer_slack_ns);
  auto nap = std::min(schedule.first_nap, schedule.sleep_cap);
  const int64_t busy = static_cast<int64_t>(std::max(schedule.spins, 0)) + std::max(schedule.yields, 0);
  for (int64_t polls = 0;; ++polls) {
    if (done()) return true;
    if (PollClock::now() > deadline) return false;
    if (progress && (polls >= schedule.spins || (polls & 63) == 63)) progress();
    if (polls < schedule.spins) {
      cpu_pause();
    } else if (polls < busy) {
      sched_yield();
    } else {
      slack.lower();
      std::this_thread::sleep_for(nap);
      nap = std::min(schedule.sleep_cap, nap + schedule.nap_step);
    }
  }
}

PollClock::time_point deadline_after(double seconds) {
  constexpr double kYear = 365.0 * 24 * 3600;
  const double s = seconds >= 0 ? std::min(seconds, kYear) : 0.0;  // NaN -> 0
  return PollClock::now() + std::chrono::duration_cast<PollClock::duration>(std::chrono::duration<double>(s));
}

}  // namespace shardgan
