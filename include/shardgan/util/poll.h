#pragma once
/// The one wait loop of the communication layer: poll a completion test until it passes or a
/// deadline goes by. MpiCommunicator's request waits (MPI_Testall), NcclCommunicator's
/// enqueue and event waits, and NodeSharedPool's flag waits all use it, so that they share
/// one measured schedule and one timeout rule.
///
/// The schedule (PollSchedule): `spins` polls back to back (a CPU pause between them), then
/// `yields` polls with sched_yield between them (the core goes to another rank when ranks
/// outnumber cores), then a sleep between polls that starts at `first_nap` and grows by
/// `nap_step` up to `sleep_cap`. While it sleeps, the calling thread's timer slack can be
/// lowered (`timer_slack_ns`) and is put back on return: Linux's default slack (50 us) would
/// otherwise stretch every nap by up to 50 us.
///
/// Two schedules, chosen per process (default_poll_schedule()):
///  - own_core(), when the node has a CPU for each of its ranks: naps of at most 20 us at a
///    1 us timer slack, so that a blocking collective on an idle rank returns under 50 us
///    after the last rank's arrival (2-rank barrier and one-float all-reduce, median;
///    tests/test_poll.cpp prints the figures with the CPU model, docs/results.md records
///    them). Its price: an idle waiting rank wakes about every 30 us and spends a sizeable
///    share of a core doing so (~25% on a KVM guest, where each wake-up is a costly timer
///    exit), which is free on a core of its own;
///  - shared_core(), when the ranks outnumber the CPUs (tests under mpirun --oversubscribe,
///    a laptop): the naps grow by 20 us up to 1 ms at the default slack, as every wait did
///    before: a waiting rank then gains more by leaving the core to the rank that computes
///    than by waking early (measured: 4 ranks on 2 cores ran the collectives suite 15-50%
///    slower with the own-core schedule).
#include <chrono>
#include <cstdint>
#include <functional>

namespace shardgan {

using PollClock = std::chrono::steady_clock;

/// How poll_until waits between polls (see the file comment). Durations in microseconds.
struct PollSchedule {
  int spins = 64;                              ///< polls with only a CPU pause between them
  int yields = 64;                             ///< then polls with sched_yield between them
  std::chrono::microseconds first_nap{5};      ///< the first sleep after those
  std::chrono::microseconds nap_step{5};       ///< each later sleep grows by this much
  std::chrono::microseconds sleep_cap{20};     ///< up to this (the latency bound's main term)
  /// The thread's timer slack while sleeping, in ns (Linux prctl PR_SET_TIMERSLACK); 0
  /// leaves it as it is. Put back when poll_until returns or throws.
  int64_t timer_slack_ns = 1000;

  /// For a rank with a CPU of its own: the members' defaults (20 us cap, 1 us slack).
  static PollSchedule own_core();
  /// For ranks that outnumber the CPUs: 64 yields, then naps of 20, 40, ... up to 1000 us
  /// at the default timer slack.
  static PollSchedule shared_core();
};

/// own_core() when `ranks_on_node` <= `cpus` (or either is unknown: <= 0), else
/// shared_core(). Pure.
PollSchedule choose_poll_schedule(int ranks_on_node, int cpus);

/// This process's schedule, chosen once: choose_poll_schedule(ranks on this node, online
/// CPUs). The ranks on the node come from the launcher's environment:
/// OMPI_COMM_WORLD_LOCAL_SIZE (Open MPI's mpirun), else MPI_LOCALNRANKS (MPICH, Intel MPI),
/// else unknown; the CPUs from sysconf(_SC_NPROCESSORS_ONLN). Thread-safe.
const PollSchedule& default_poll_schedule();

/// Calls `done` until it returns true (-> true), or until it has returned false once
/// `deadline` has passed (-> false: the caller raises its timeout, e.g. CollectiveTimeout).
/// `done` is called at least once, even when the deadline has already passed. `progress`
/// (may be empty) runs after each false poll once the spins are over, and every 64th poll
/// during them: the MPI progress engine, for waits that are not MPI calls themselves.
/// Exceptions from `done` or `progress` propagate (the timer slack is restored first).
/// Local; thread-safe (no shared state).
bool poll_until(PollClock::time_point deadline, const std::function<bool()>& done,
                const std::function<void()>& progress = {},
                const PollSchedule& schedule = default_poll_schedule());

/// Now + `seconds`, clamped to [0, one year] (a NaN counts as 0), so that a huge
/// dist.timeout_s cannot overflow the clock.
PollClock::time_point deadline_after(double seconds);

}  // namespace shardgan
