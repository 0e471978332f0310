// poll_until (util/poll.h), the wait loop behind every blocking collective: its timeout rule,
// its progress calls and its timer slack, and the latency it adds to a blocking collective on
// an idle rank, the measurement behind its sleep cap. The latency cases need two ranks (run
// under mpirun -np 2); on another count they say so and measure nothing. Each latency case
// prints one JSON line per figure ({"bench": "poll_latency", ...}) on rank 0.
#include <mpi.h>
#include <sys/prctl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "shardgan/comm/mpi_communicator.h"
#include "shardgan/util/poll.h"

// The gtest files compile together in batches (tests/CMakeLists.txt): this file's names
// live in a namespace of its own.
namespace SHARDGAN_UNITY_ID {

using namespace shardgan;
using namespace std::chrono_literals;

namespace {

double seconds_since(PollClock::time_point t0) {
  return std::chrono::duration<double>(PollClock::now() - t0).count();
}

TEST(PollUntil, ReturnsTrueOnTheFirstPassingPoll) {
  int calls = 0;
  EXPECT_TRUE(poll_until(deadline_after(10), [&] { return ++calls == 300; }));
  EXPECT_EQ(calls, 300);
}

TEST(PollUntil, PollsOnceEvenPastTheDeadline) {
  int calls = 0;
  EXPECT_TRUE(poll_until(PollClock::now() - 1s, [&] { return ++calls > 0; }));
  EXPECT_FALSE(poll_until(PollClock::now() - 1s, [&] { return ++calls < 0; }));
  EXPECT_EQ(calls, 2);
}

// The timeout rule of every blocking collective: false once the deadline has passed, not
// before it.
TEST(PollUntil, GivesUpAfterTheDeadlineNotBefore) {
  const auto t0 = PollClock::now();
  int64_t calls = 0;
  EXPECT_FALSE(poll_until(deadline_after(0.05), [&] { ++calls; return false; }));
  const double took = seconds_since(t0);
  EXPECT_GE(took, 0.05);
  EXPECT_LT(took, 1.0);  // generous: the machine may be loaded
  EXPECT_GT(calls, 128);  // the spins and yields, then the naps
}

// `progress` runs every 64th poll while spinning, then after every failed poll.
TEST(PollUntil, RunsProgressBetweenPolls) {
  int polls = 0, progress = 0;
  EXPECT_TRUE(poll_until(deadline_after(10), [&] { return ++polls == 300; }, [&] { ++progress; }));
  // Failed polls 0..298: number 63, then 64..298.
  EXPECT_EQ(progress, 1 + (299 - 64));
}

TEST(PollUntil, ExceptionsPropagateAndTheTimerSlackComesBack) {
  const int before = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
  ASSERT_GT(before, 1000) << "the test needs a coarser timer slack than poll_until's";
  int polls = 0, slack_while_napping = -1;
  EXPECT_THROW(poll_until(deadline_after(10), [&]() -> bool {
                 if (++polls == 200) {
                   slack_while_napping = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
                   throw std::runtime_error("a failed test");
                 }
                 return false;
               }),
               std::runtime_error);
  EXPECT_EQ(slack_while_napping, 1000);
  EXPECT_EQ(prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0), before);
  EXPECT_FALSE(poll_until(deadline_after(0.01), [] { return false; }));
  EXPECT_EQ(prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0), before);
}

TEST(PollUntil, DeadlineAfterClamps) {
  const auto now = PollClock::now();
  const auto negative = deadline_after(-5), nan = deadline_after(std::nan(""));
  EXPECT_LE(negative, PollClock::now());
  EXPECT_LE(nan, PollClock::now());
  const double year = 365.0 * 24 * 3600;
  const double huge = std::chrono::duration<double>(deadline_after(1e300) - now).count();
  EXPECT_GE(huge, year);
  EXPECT_LT(huge, year + 60);
  const double inf = std::chrono::duration<double>(deadline_after(std::numeric_limits<double>::infinity()) - now).count();
  EXPECT_GE(inf, year);
  EXPECT_LT(inf, year + 60);
}

TEST(PollUntil, OneScheduleForOwnCoresAnotherForSharedOnes) {
  const PollSchedule own = choose_poll_schedule(2, 2), shared = choose_poll_schedule(3, 2);
  EXPECT_EQ(own.sleep_cap.count(), 20);
  EXPECT_EQ(own.timer_slack_ns, 1000);
  EXPECT_EQ(shared.sleep_cap.count(), 1000);
  EXPECT_EQ(shared.timer_slack_ns, 0);
  EXPECT_EQ(choose_poll_schedule(0, 2).sleep_cap.count(), 20);   // ranks unknown
  EXPECT_EQ(choose_poll_schedule(64, 0).sleep_cap.count(), 20);  // CPUs unknown
}

// ---- the latency a blocking collective adds on an idle rank --------------------------------

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);) {
    if (line.rfind("model name", 0) == 0) {
      std::string m = line.substr(line.find(':') + 2);
      std::string out;
      for (char c : m) out += (c == '"' || c == '\\') ? ' ' : c;
      return out;
    }
  }
  return "unknown";
}

double load1() {
  std::ifstream f("/proc/loadavg");
  double l = -1;
  f >> l;
  return l;
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(PollClock::now().time_since_epoch()).count();
}

struct Figures {
  double median = 0, p90 = 0, p99 = 0, max = 0;
};

Figures figures(std::vector<double> us) {  // all 0 for none (rank 1)
  if (us.empty()) return {};
  std::sort(us.begin(), us.end());
  auto at = [&](double q) { return us[std::min(us.size() - 1, static_cast<size_t>(q * us.size()))]; };
  return {at(0.5), at(0.9), at(0.99), us.back()};
}

// Rank 1 arrives 2 ms (plus a jitter of 0-199 us, so that its arrival falls anywhere in
// rank 0's sleep cycle) after a common start, while rank 0, idle, is already waiting in
// `collective`. Returns, on rank 0, how long after rank 1's arrival rank 0 returned, in us,
// per trial (empty on rank 1). steady_clock is the same clock in both processes (one node).
std::vector<double> late_returns(MpiCommunicator& comm, int trials, const std::function<void()>& collective) {
  std::vector<double> us;
  at::Tensor mark = torch::zeros({1}, torch::kLong), marks = torch::zeros({2}, torch::kLong);
  for (int t = 0; t < trials; ++t) {
    comm.barrier();
    if (comm.rank() == 1) {
      std::this_thread::sleep_for(2ms + std::chrono::microseconds((t * 37) % 200));
      mark[0] = now_ns();
      collective();
    } else {
      collective();
      mark[0] = now_ns();
    }
    comm.all_gather(marks, mark);
    if (comm.rank() == 0) us.push_back((marks[0].item<int64_t>() - marks[1].item<int64_t>()) / 1e3);
  }
  return us;
}

// One JSON line: the late returns' figures, and the median above `floor_us` (the
// never-sleeping floor's median) as added_us.
void print(const char* collective, const char* schedule, const PollSchedule& s, int trials, const Figures& f,
           double floor_us) {
  std::printf(
      "{\"bench\": \"poll_latency\", \"collective\": \"%s\", \"schedule\": \"%s\", \"sleep_cap_us\": %lld, "
      "\"timer_slack_ns\": %lld, \"ranks\": 2, \"trials\": %d, \"median_us\": %.1f, \"p90_us\": %.1f, "
      "\"p99_us\": %.1f, \"max_us\": %.1f, \"added_us\": %.1f, \"cpu\": \"%s\", \"load1\": %.2f}\n",
      collective, schedule, static_cast<long long>(s.spins == std::numeric_limits<int>::max() ? 0 : s.sleep_cap.count()),
      static_cast<long long>(s.timer_slack_ns), trials, f.median, f.p90, f.p99, f.max, f.median - floor_us,
      cpu_model().c_str(), load1());
  std::fflush(stdout);
}

// One request that `start` posts on MPI_COMM_WORLD, waited for with `s` as
// MpiCommunicator::wait does (up to 4 MPI_Test calls per poll).
void raw_wait(const std::function<MPI_Request()>& start, const PollSchedule& s) {
  MPI_Request req = start();
  const bool ok = poll_until(deadline_after(60), [&] {
    int flag = 0;
    for (int i = 0; i < 4 && !flag; ++i) MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
    return flag != 0;
  }, {}, s);
  if (!ok) throw std::runtime_error("raw wait timed out");
}

MPI_Request ibarrier() {
  MPI_Request req;
  MPI_Ibarrier(MPI_COMM_WORLD, &req);
  return req;
}

MPI_Request iallreduce_one_float() {
  static float x = 1;
  MPI_Request req;
  MPI_Iallreduce(MPI_IN_PLACE, &x, 1, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &req);
  return req;
}

// Never sleeps: the floor that MPI and the machine set (what the other figures add to).
PollSchedule spin_schedule() {
  PollSchedule s;
  s.spins = std::numeric_limits<int>::max();
  return s;
}

constexpr int kTrials = 150;
constexpr double kBudgetUs = 50;  // what a blocking collective may add on an idle rank

// The figure the sleep cap is chosen by: how much later than the never-sleeping floor
// (median against median) rank 0, idle, returns from MpiCommunicator::barrier and from a
// one-float MpiCommunicator::all_reduce, through the communicator's own wait with the
// own-core schedule. Must stay under 50 us. Control: the shared-core schedule (the former
// one, 1 ms cap), waited for the same way, must exceed it, or this measurement could not
// tell a slow schedule from a fast one. Subtracting the floor keeps the check about the
// wait loop when other processes load the machine; the raw figures are printed too. Takes
// about 3 s (5-8 s with the second attempt).
TEST(PollLatency, BlockingCollectiveOnAnIdleRankAddsUnder50us) {
  MpiCommunicator comm{MPI_COMM_WORLD, 60.0};
  if (comm.world_size() != 2) {
    std::printf("PollLatency needs exactly 2 ranks (mpirun -np 2); measuring nothing on %d\n", comm.world_size());
    return;
  }
  const PollSchedule def = default_poll_schedule(), spin = spin_schedule(), shared = PollSchedule::shared_core();
  if (def.sleep_cap != PollSchedule::own_core().sleep_cap) {
    GTEST_SKIP() << "this node has fewer CPUs than ranks: no rank is idle on a core of its own";
  }
  at::Tensor one = torch::ones({1});
  Figures barrier_floor, barrier, reduce_floor, reduce;
  // Two attempts, so that a burst of load from other processes during one does not fail the
  // case; rank 0 decides and tells rank 1.
  for (int attempt = 0; attempt < 2; ++attempt) {
    barrier_floor = figures(late_returns(comm, kTrials, [&] { raw_wait(ibarrier, spin); }));
    barrier = figures(late_returns(comm, kTrials, [&] { comm.barrier(); }));
    reduce_floor = figures(late_returns(comm, kTrials, [&] { raw_wait(iallreduce_one_float, spin); }));
    reduce = figures(late_returns(comm, kTrials, [&] { comm.all_reduce(one, ReduceOp::kSum); }));
    at::Tensor ok = torch::zeros({1}, torch::kLong);
    if (comm.rank() == 0) {
      print("barrier", "spin_floor", spin, kTrials, barrier_floor, 0);
      print("barrier", "own_core", def, kTrials, barrier, barrier_floor.median);
      print("all_reduce_1_float", "spin_floor", spin, kTrials, reduce_floor, 0);
      print("all_reduce_1_float", "own_core", def, kTrials, reduce, reduce_floor.median);
      ok[0] = barrier.median - barrier_floor.median < kBudgetUs && reduce.median - reduce_floor.median < kBudgetUs;
    }
    comm.broadcast(ok, 0);
    if (ok[0].item<int64_t>() != 0) break;
  }
  const Figures former = figures(late_returns(comm, kTrials, [&] { raw_wait(ibarrier, shared); }));
  if (comm.rank() != 0) return;
  print("barrier", "shared_core", shared, kTrials, former, barrier_floor.median);
  // A machine whose never-sleeping floor is itself above the budget (a slowed EPYC guest gave
  // 61.5 us for the one-float all-reduce) cannot resolve a 50 us difference: reported as
  // skipped, with the figures, not as a verdict.
  if (std::max(barrier_floor.median, reduce_floor.median) > kBudgetUs) {
    GTEST_SKIP() << "the spin floor (barrier " << barrier_floor.median << " us, all_reduce " << reduce_floor.median
                 << " us median) exceeds the " << kBudgetUs << " us budget on this machine";
  }
  EXPECT_LT(barrier.median - barrier_floor.median, kBudgetUs) << "MpiCommunicator::barrier on an idle rank";
  EXPECT_LT(reduce.median - reduce_floor.median, kBudgetUs) << "MpiCommunicator::all_reduce on an idle rank";
  EXPECT_GT(former.median - barrier_floor.median, kBudgetUs) << "control: the 1 ms cap should exceed the budget";
}

// The sweep behind the own-core cap (benchmarks/poll_latency.sh runs it): the barrier's late
// return for several caps at a 1 us timer slack, and at the default 50 us slack.
TEST(PollLatency, DISABLED_SweepSleepCaps) {
  MpiCommunicator comm{MPI_COMM_WORLD, 60.0};
  if (comm.world_size() != 2) return;
  const Figures floor = figures(late_returns(comm, kTrials, [&] { raw_wait(ibarrier, spin_schedule()); }));
  if (comm.rank() == 0) print("barrier", "spin_floor", spin_schedule(), kTrials, floor, 0);
  for (int64_t slack : {int64_t{1000}, int64_t{0}}) {
    for (int cap : {5, 10, 20, 30, 50, 100, 200}) {
      PollSchedule s;
      s.sleep_cap = std::chrono::microseconds(cap);
      s.first_nap = std::min(s.first_nap, s.sleep_cap);
      s.timer_slack_ns = slack;
      const Figures f = figures(late_returns(comm, kTrials, [&] { raw_wait(ibarrier, s); }));
      if (comm.rank() == 0) print("barrier", slack ? "sweep" : "sweep_default_slack", s, kTrials, f, floor.median);
    }
  }
}

}  // namespace

}  // namespace SHARDGAN_UNITY_ID
