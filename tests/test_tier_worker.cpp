// The offload layer's workers (issue 58): TierWorker (gradient offload's writer) and
// ReadAhead (parameter offload's read-ahead, one long-lived thread per model instead of a
// std::async thread per read). FIFO order, one thread, the tier mutex, the bounded queue,
// errors to the next submit/drain (writes) or to the taker (reads), drain dropping reads,
// and destruction with work queued. Negative control (ctest tier_worker_control): with
// SHARDGAN_TEST_CONTROL=read_ahead_async ReadAhead starts one std::async thread per read,
// and ReadAhead.ReadsRunOnTheOneWorkerThread must fail.
#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "shardgan/offload/direct_file.h"  // OffloadError
#include "shardgan/offload/read_ahead.h"
#include "shardgan/offload/tier_worker.h"

// The gtest files compile together in batches (tests/CMakeLists.txt): this file's names
// live in a namespace of its own.
namespace SHARDGAN_UNITY_ID {

using namespace shardgan;
using Clock = std::chrono::steady_clock;

namespace {

// A gate the test opens: jobs wait on it (through a copy of `f`, captured by value) to stay
// queued or running. A gate destroyed unopened (a failed ASSERT) releases its waiters too.
struct Gate {
  std::promise<void> p;
  std::shared_future<void> f = p.get_future().share();
  void open() { p.set_value(); }
};

// Polls `done` every millisecond for at most 10 s; false on timeout.
template <class F>
bool wait_for(F done) {
  const auto end = Clock::now() + std::chrono::seconds(10);
  while (!done()) {
    if (Clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

at::Tensor value(int64_t i) { return torch::full({1}, i, torch::kLong); }

ReadAhead::Key key(size_t i) { return reinterpret_cast<ReadAhead::Key>(i + 1); }

}  // namespace

TEST(TierWorker, RunsJobsInOrderOnOneThreadOtherThanTheCallers) {
  std::mutex tier;
  TierWorker w(&tier, 4);
  std::vector<int> order;
  std::vector<std::thread::id> ids;
  for (int i = 0; i < 200; ++i) {
    w.submit([&, i] {
      order.push_back(i);
      ids.push_back(std::this_thread::get_id());
    });
  }
  w.drain();
  ASSERT_EQ(order.size(), 200u);
  for (int i = 0; i < 200; ++i) EXPECT_EQ(order[i], i);
  const std::set<std::thread::id> distinct(ids.begin(), ids.end());
  EXPECT_EQ(distinct.size(), 1u);
  EXPECT_EQ(*distinct.begin(), w.thread_id());
  EXPECT_NE(w.thread_id(), std::this_thread::get_id());
}

TEST(TierWorker, HoldsTheTierMutexAroundEachJob) {
  std::mutex tier;
  TierWorker w(&tier, 2);
  std::atomic<bool> ran{false};
  {
    std::lock_guard<std::mutex> lk(tier);  // the compute thread uses the tier
    w.submit([&] { ran = true; });
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_FALSE(ran.load()) << "the job ran while the caller held the tier mutex";
  }
  w.drain();
  EXPECT_TRUE(ran.load());
}

TEST(TierWorker, FirstErrorRethrownOnceByDrain) {
  TierWorker w(nullptr, 4);
  // The first job waits until all three are queued: otherwise its error could reach the
  // second submit (which rethrows it, as ErrorRethrownBySubmit... checks) on a slow run.
  std::atomic<bool> go{false};
  w.submit([&] {
    while (!go.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    throw OffloadError("write a failed");
  });
  w.submit([] { throw OffloadError("write b failed"); });
  std::atomic<int> later{0};
  w.submit([&] { ++later; });  // a failed job does not stop the worker
  go = true;
  try {
    w.drain();
    ADD_FAILURE() << "drain did not rethrow";
  } catch (const OffloadError& e) {
    EXPECT_STREQ(e.what(), "write a failed");
  }
  EXPECT_EQ(later.load(), 1);
  EXPECT_NO_THROW(w.drain()) << "an error is rethrown once";
}

TEST(TierWorker, ErrorRethrownBySubmitWhichThenQueuesNothing) {
  TierWorker w(nullptr, 4);
  w.submit([] { throw OffloadError("write failed"); });
  ASSERT_TRUE(wait_for([&] { return w.pending() == 0; }));
  std::atomic<bool> ran{false};
  EXPECT_THROW(w.submit([&] { ran = true; }), OffloadError);
  EXPECT_NO_THROW(w.drain());
  EXPECT_FALSE(ran.load()) << "the job whose submit threw was queued";
  w.submit([&] { ran = true; });
  w.drain();
  EXPECT_TRUE(ran.load());
}

TEST(TierWorker, SubmitBlocksWhileMaxPendingJobsAreQueuedOrRunning) {
  TierWorker w(nullptr, 2);
  Gate gate;
  w.submit([g = gate.f] { g.wait(); });  // running
  w.submit([] {});                 // queued: 2 pending
  std::atomic<bool> returned{false};
  std::thread third([&] {
    w.submit([] {});
    returned = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(returned.load()) << "submit did not wait with max_pending jobs pending";
  EXPECT_EQ(w.pending(), 2u);
  gate.open();
  third.join();
  EXPECT_TRUE(returned.load());
  w.drain();
  EXPECT_EQ(w.pending(), 0u);
}

TEST(TierWorker, DestructionRunsQueuedJobsAndDropsTheirErrors) {
  std::atomic<int> ran{0};
  {
    TierWorker w(nullptr, 8);
    w.submit([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      ++ran;
    });
    w.submit([] { throw OffloadError("dropped at destruction"); });
    for (int i = 0; i < 4; ++i) w.submit([&] { ++ran; });
  }
  EXPECT_EQ(ran.load(), 5);
}

// The check the control breaks: every read runs on the one worker thread, never the
// caller's. Each round holds 4 reads at once (the first waits on a gate until all are
// started), so one thread per read would show several ids even if the system reused ids.
TEST(ReadAhead, ReadsRunOnTheOneWorkerThread) {
  std::mutex tier, mu;
  std::vector<std::thread::id> ids;
  ReadAhead ra(&tier, 4);  // after what its reads use: destroyed first
  for (int round = 0; round < 25; ++round) {
    Gate gate;
    for (size_t i = 0; i < 4; ++i) {
      ASSERT_TRUE(ra.start(key(i), [&, i, g = gate.f] {
        if (i == 0) g.wait();
        std::lock_guard<std::mutex> lk(mu);
        ids.push_back(std::this_thread::get_id());
        return value(static_cast<int64_t>(i));
      }));
    }
    gate.open();
    for (size_t i = 0; i < 4; ++i) EXPECT_EQ(ra.take(key(i)).item<int64_t>(), static_cast<int64_t>(i));
  }
  ASSERT_EQ(ids.size(), 100u);
  const std::set<std::thread::id> distinct(ids.begin(), ids.end());
  EXPECT_EQ(distinct.size(), 1u) << "reads ran on " << distinct.size() << " distinct worker threads";
  EXPECT_EQ(*distinct.begin(), ra.worker_thread_id());
  EXPECT_EQ(distinct.count(std::this_thread::get_id()), 0u) << "a read ran on the caller's thread";
}

TEST(ReadAhead, ReadsRunInTheOrderTheyWereStarted) {
  std::vector<int> order;  // written by the worker only
  ReadAhead ra(nullptr, 3);
  for (int batch = 0; batch < 20; ++batch) {
    Gate gate;
    for (int i = 0; i < 3; ++i) {
      const int n = batch * 3 + i;
      ASSERT_TRUE(ra.start(key(i), [&, n, i, g = gate.f] {
        if (i == 0) g.wait();  // the others stay queued behind it
        order.push_back(n);
        return value(n);
      }));
    }
    gate.open();
    for (int i = 2; i >= 0; --i) EXPECT_EQ(ra.take(key(i)).item<int64_t>(), batch * 3 + i);  // taken in reverse
  }
  ASSERT_EQ(order.size(), 60u);
  for (int n = 0; n < 60; ++n) EXPECT_EQ(order[n], n);
}

TEST(ReadAhead, TakeRethrowsTheReadsErrorAndTheWorkerGoesOn) {
  std::mutex tier;
  ReadAhead ra(&tier, 2);
  ASSERT_TRUE(ra.start(key(0), []() -> at::Tensor { throw OffloadError("offload tier: short read of unit 0"); }));
  try {
    ra.take(key(0));
    ADD_FAILURE() << "take did not rethrow the read's error";
  } catch (const OffloadError& e) {
    EXPECT_STREQ(e.what(), "offload tier: short read of unit 0");
  }
  EXPECT_FALSE(ra.contains(key(0)));
  EXPECT_THROW(ra.take(key(0)), std::out_of_range) << "a taken read is no longer held";
  ASSERT_TRUE(ra.start(key(0), [] { return value(7); }));
  EXPECT_EQ(ra.take(key(0)).item<int64_t>(), 7);
}

TEST(ReadAhead, StartNeverWaitsAndRespectsItsBound) {
  Gate gate;
  std::atomic<int> ran{0};
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    gate.open();
  });
  ReadAhead ra(nullptr, 2);
  const auto t0 = Clock::now();
  EXPECT_TRUE(ra.start(key(0), [&, g = gate.f] {
    g.wait();
    ++ran;
    return value(0);
  }));
  EXPECT_TRUE(ra.start(key(1), [&] { ++ran; return value(1); }));
  EXPECT_FALSE(ra.start(key(1), [&] { ++ran; return value(-1); })) << "a second read of one key";
  EXPECT_FALSE(ra.start(key(2), [&] { ++ran; return value(2); })) << "beyond max_reads";
  EXPECT_LT(seconds_since(t0), 0.25) << "start() waited for a read";
  EXPECT_EQ(ra.size(), 2u);
  EXPECT_FALSE(ra.contains(key(2)));
  EXPECT_EQ(ra.take(key(0)).item<int64_t>(), 0);
  EXPECT_TRUE(ra.start(key(2), [&] { ++ran; return value(2); })) << "a take frees a place";
  EXPECT_EQ(ra.take(key(1)).item<int64_t>(), 1);
  EXPECT_EQ(ra.take(key(2)).item<int64_t>(), 2);
  opener.join();
  EXPECT_EQ(ran.load(), 3);
}

TEST(ReadAhead, DrainDiscardsValuesAndErrors) {
  std::atomic<int> ran{0};
  ReadAhead ra(nullptr, 3);
  ASSERT_TRUE(ra.start(key(0), [&]() -> at::Tensor {
    ++ran;
    throw OffloadError("offload tier: unreadable");
  }));
  ASSERT_TRUE(ra.start(key(1), [&] {
    ++ran;
    return value(1);
  }));
  ASSERT_TRUE(wait_for([&] { return ran.load() == 2; }));  // the error has happened
  EXPECT_NO_THROW(ra.drain());
  EXPECT_EQ(ra.size(), 0u);
  EXPECT_FALSE(ra.contains(key(0)));
  EXPECT_THROW(ra.take(key(1)), std::out_of_range);
}

TEST(ReadAhead, DrainWaitsForTheRunningReadAndDropsTheQueuedOnes) {
  Gate gate;
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    gate.open();
  });
  std::atomic<bool> started{false}, finished{false}, queued_ran{false};
  {
    ReadAhead ra(nullptr, 3);
    EXPECT_TRUE(ra.start(key(0), [&, g = gate.f] {
      started = true;
      g.wait();
      finished = true;
      return value(0);
    }));
    EXPECT_TRUE(ra.start(key(1), [&] {
      queued_ran = true;
      return value(1);
    }));
    EXPECT_TRUE(wait_for([&] { return started.load(); }));
    ra.drain();
    EXPECT_TRUE(finished.load()) << "drain returned with a read in flight";
  }
  opener.join();
  EXPECT_FALSE(queued_ran.load()) << "a read nobody will take ran after drain";
}

TEST(ReadAhead, DestructionWithReadsQueuedDoesNotHang) {
  std::mutex tier;
  std::atomic<bool> started{false}, queued_ran{false};
  Gate gate;
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    gate.open();
  });
  const auto t0 = Clock::now();
  {
    ReadAhead ra(&tier, 3);
    EXPECT_TRUE(ra.start(key(0), [&, g = gate.f]() -> at::Tensor {
      started = true;
      g.wait();
      throw OffloadError("fails while the owner goes away");
    }));
    EXPECT_TRUE(ra.start(key(1), [&] { queued_ran = true; return value(1); }));
    EXPECT_TRUE(ra.start(key(2), [&] { queued_ran = true; return value(2); }));
    EXPECT_TRUE(wait_for([&] { return started.load(); }));
  }  // destroyed while read 0 waits on the gate and reads 1 and 2 are queued
  EXPECT_LT(seconds_since(t0), 5.0);
  opener.join();
  EXPECT_FALSE(queued_ran.load()) << "a read queued at destruction ran";
  // And with nothing started at all.
  { ReadAhead idle(&tier, 2); }
}

}  // namespace SHARDGAN_UNITY_ID
