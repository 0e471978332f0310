// The collective watchdog (include/shardgan/comm/watchdog.h), driven by fake collectives:
// what NcclCommunicator's device-side waits rely on to keep dist.timeout_s without a GPU.
//  - finished collectives are released and nothing fails;
//  - one that never finishes fails the watchdog within its deadline plus a few polls,
//    naming it, calls on_failure once, releases the rest, and refuses later entries;
//  - an error thrown by a poll fails it with that error;
//  - a process whose compute thread never reacts is ended with status 124.
// Plain gtest (no MPI), so the last case can fork.
#include <atomic>
#include <cstdlib>
#include <chrono>
#include <thread>

#include <gtest/gtest.h>

#include "shardgan/comm/watchdog.h"
#include "shardgan/util/deadman.h"

namespace shardgan {
namespace {

using namespace std::chrono_literals;
using Clock = CollectiveWatchdog::Clock;

TEST(CollectiveWatchdog, FinishedCollectivesAreReleased) {
  std::atomic<int> failures{0}, released{0};
  std::atomic<bool> go{false};
  {
    CollectiveWatchdog w(500us, [&](const std::string&) { failures++; }, 0);
    for (int i = 0; i < 10; ++i) {
      w.watch("op" + std::to_string(i), Clock::now() + 60s, 60, [&] { return go.load(); }, [&] { released++; });
    }
    EXPECT_EQ(w.pending(), 10u);
    std::this_thread::sleep_for(20ms);
    EXPECT_EQ(released.load(), 0);  // not finished yet: still watched
    go = true;
    const auto until = Clock::now() + 10s;
    while (w.pending() > 0 && Clock::now() < until) std::this_thread::sleep_for(1ms);
    EXPECT_EQ(w.pending(), 0u);
    EXPECT_EQ(released.load(), 10);
    EXPECT_EQ(w.failure(), "");
  }
  EXPECT_EQ(failures.load(), 0);
}

TEST(CollectiveWatchdog, TimeoutFailsOnceNamingTheCollective) {
  std::atomic<int> failures{0}, released{0};
  std::string seen;
  CollectiveWatchdog w(500us, [&](const std::string& m) { seen = m; failures++; }, 0);
  const auto t0 = Clock::now();
  w.watch("all_gather (rank 1 of 2)", t0 + 100ms, 0.1, [] { return false; }, [&] { released++; });
  w.watch("reduce_scatter (rank 1 of 2)", t0 + 60s, 60, [] { return false; }, [&] { released++; });
  while (failures.load() == 0 && Clock::now() < t0 + 10s) std::this_thread::sleep_for(1ms);
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  const std::string f = w.failure();
  EXPECT_NE(f.find("all_gather (rank 1 of 2) timed out after 0.1 s"), std::string::npos) << f;
  // The deadline, plus polls of 0.5 ms and this loop's 1 ms naps; 2 s is slack for a busy CI.
  EXPECT_GE(took, 0.1);
  EXPECT_LT(took, 2.0);
  while (released.load() < 2 && Clock::now() < t0 + 10s) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(released.load(), 2);  // both: the failed one and the one behind it
  EXPECT_EQ(failures.load(), 1);
  EXPECT_EQ(seen, f);
  EXPECT_TRUE(w.timed_out());
  w.watch("late", Clock::now() + 60s, 60, [] { return false; }, [&] { released++; });
  EXPECT_EQ(released.load(), 3);  // refused and released at once
  EXPECT_EQ(w.pending(), 0u);
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(failures.load(), 1);
}

TEST(CollectiveWatchdog, PollErrorFailsWithIt) {
  std::atomic<int> failures{0};
  CollectiveWatchdog w(500us, [&](const std::string&) { failures++; }, 0);
  w.watch("broadcast", Clock::now() + 60s, 60, []() -> bool { throw std::runtime_error("NCCL: remote process exited"); },
          [] {});
  const auto until = Clock::now() + 10s;
  while (w.failure().empty() && Clock::now() < until) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(w.failure(), "broadcast failed: NCCL: remote process exited");
  EXPECT_FALSE(w.timed_out());
  EXPECT_EQ(failures.load(), 1);
}

TEST(CollectiveWatchdogDeathTest, EndsAProcessThatDoesNotReact) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        CollectiveWatchdog w(500us, [](const std::string&) {}, 0.2);
        w.watch("all_gather", Clock::now() + 50ms, 0.05, [] { return false; }, [] {});
        std::this_thread::sleep_for(30s);  // a compute thread stuck elsewhere
      },
      ::testing::ExitedWithCode(CollectiveWatchdog::kExitStatus), "did not end within 0 s");
}

// The start-up deadline (include/shardgan/util/deadman.h): blocking work that overruns it
// ends the process with 124 and a message naming the work, the bound and the rank; work
// that finishes, or a deadline moved by rearm(), does not.
TEST(DeadmanDeathTest, EndsAProcessStuckPastTheDeadline) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        setenv("OMPI_COMM_WORLD_RANK", "3", 1);
        Deadman d("MPI_Init", 0.2, "a test bound");
        std::this_thread::sleep_for(30s);  // MPI_Init waiting for a host cut off
      },
      ::testing::ExitedWithCode(Deadman::kExitStatus),
      "error on rank 3: MPI_Init did not finish within 0.2 s \\(a test bound\\)");
}

TEST(Deadman, DisarmedOrRearmedInTimeDoesNotFire) {
  {
    Deadman d("quick", 0.3, "test");
    std::this_thread::sleep_for(50ms);
  }  // destroyed (disarmed) before the deadline
  Deadman d("first", 0.3, "test");
  std::this_thread::sleep_for(200ms);
  d.rearm("second", 0.5, "test");  // the first deadline passes while the second holds
  std::this_thread::sleep_for(300ms);
  d.disarm();
  std::this_thread::sleep_for(400ms);  // past the second deadline: disarmed, nothing happens
  SUCCEED();
}

}  // namespace
}  // namespace shardgan
