// The split placement's declarative step schedule (step_schedule.h): for every update rule,
// paired mode, shared D forward, d_steps and micro-batch count, the schedule is well formed
// and both sides (G's ranks and D's ranks) derive the same one, which set_schedule checks
// over the world; a side whose schedule is reordered, or whose code makes a transfer out
// of the schedule's order, is stopped before any send is posted.
#include <algorithm>
#include <map>
#include <stdexcept>
#include <vector>

#include <mpi.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "shardgan/comm/mpi_communicator.h"
#include "shardgan/train/split_placement.h"
#include "shardgan/train/step_schedule.h"

// The gtest files compile together in batches (tests/CMakeLists.txt): this file's names
// live in a namespace of its own.
namespace SHARDGAN_UNITY_ID {

using namespace shardgan;
using T = ScheduledTransfer;

namespace {

std::vector<StepShape> every_shape() {
  std::vector<StepShape> out;
  for (int sim = 0; sim < 2; ++sim) {
    for (int sdf = 0; sdf <= sim; ++sdf) {
      for (int paired = 0; paired < 2; ++paired) {
        for (int64_t d = 1; d <= 3; ++d) {
          for (int64_t k = 1; k <= 4; ++k) out.push_back({sim == 1, sdf == 1, paired == 1, d, k});
        }
      }
    }
  }
  return out;
}

// G's and D's ranks as split placement makes them: G on rank 0, D on the others.
struct Groups {
  MpiCommunicator world{MPI_COMM_WORLD, 30.0};
  std::unique_ptr<Communicator> group = world.split(world.rank() == 0 ? 0 : 1, world.rank());
};

}  // namespace

TEST(StepSchedule, EveryShapeIsWellFormed) {
  std::map<uint64_t, std::vector<T>> seen;
  for (const StepShape& s : every_shape()) {
    const std::vector<T> sched = split_schedule(s);
    const int64_t k = s.micro_batches, d = s.d_steps;
    // Each D step that draws its own images moves k images; G's pass 2k transfers.
    const int64_t d_steps_with_images = s.simultaneous ? d - 1 : d;
    ASSERT_EQ(static_cast<int64_t>(sched.size()), d_steps_with_images * k + 2 * k);
    for (size_t i = 0; i < sched.size(); ++i) {
      if (sched[i].kind == T::kGradsToG) {  // right after its own images, in G's pass
        ASSERT_GT(i, 0u);
        EXPECT_EQ(sched[i].d_step, T::kGPass);
        EXPECT_EQ(sched[i - 1], (T{T::kImagesToD, T::kGPass, sched[i].micro}));
      }
    }
    // The simultaneous rule starts with G's pass; the alternating one ends with it.
    EXPECT_EQ(sched.front().d_step == T::kGPass, s.simultaneous);
    EXPECT_EQ(sched.back().d_step, s.simultaneous && d > 1 ? static_cast<int32_t>(d - 1) : T::kGPass);
    // Two different schedules never share a fingerprint.
    auto [it, fresh] = seen.emplace(schedule_fingerprint(sched), sched);
    if (!fresh) EXPECT_EQ(it->second, sched);
  }
  EXPECT_THROW(split_schedule({false, true, false, 1, 1}), std::invalid_argument);
  EXPECT_THROW(split_schedule({false, false, false, 0, 1}), std::invalid_argument);
}

// Both sides derive their schedule from their own view of the step, and set_schedule
// compares them over the world, for every shape.
TEST(StepSchedule, BothSidesAgreeForEveryShape) {
  Groups g;
  if (g.world.world_size() < 2) GTEST_SKIP() << "split placement needs 2 ranks or more";
  for (const StepShape& s : every_shape()) {
    SplitPlacement p(g.world, *g.group, 1, 12, {1, 2, 2}, torch::kDouble);
    EXPECT_NO_THROW(p.set_schedule(split_schedule(s)));
  }
}

// Negative control: D's side with two transfers swapped (what a reordered loop on one side
// would declare). Every rank throws in set_schedule, before any send is posted.
TEST(StepSchedule, AReorderedScheduleIsCaughtBeforeAnySend) {
  Groups g;
  if (g.world.world_size() < 2) GTEST_SKIP() << "split placement needs 2 ranks or more";
  for (bool sim : {false, true}) {
    std::vector<T> sched = split_schedule({sim, false, false, 2, 2});
    if (g.world.rank() != 0) std::swap(sched[1], sched[2]);
    SplitPlacement p(g.world, *g.group, 1, 12, {1, 2, 2}, torch::kDouble);
    const int64_t sent = g.world.stats().sent_bytes;
    try {
      p.set_schedule(sched);
      ADD_FAILURE() << "a reordered schedule on D's side was accepted";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("schedule"), std::string::npos) << e.what();
    }
    EXPECT_EQ(g.world.stats().sent_bytes, sent) << "bytes were sent before the mismatch was found";
  }
}

// A side's code that makes a transfer out of the schedule's order throws before posting
// it (local: the other side is not involved).
TEST(StepSchedule, ATransferOutOfOrderIsCaughtBeforeItIsPosted) {
  Groups g;
  if (g.world.world_size() < 2) GTEST_SKIP() << "split placement needs 2 ranks or more";
  SplitPlacement p(g.world, *g.group, 1, 12, {1, 2, 2}, torch::kDouble);
  p.set_schedule(split_schedule({false, false, false, 1, 2}));
  p.begin_step();
  const int64_t sent = g.world.stats().sent_bytes;
  if (p.holds_generator()) {
    // The schedule starts with D step 0's images of micro-batch 0, not 1.
    EXPECT_THROW(p.images_to_d({T::kImagesToD, 0, 1}, torch::zeros({12, 1, 2, 2}, torch::kDouble)), std::logic_error);
  } else {
    EXPECT_THROW(p.grads_to_g({T::kGradsToG, T::kGPass, 0}, torch::zeros({6, 1, 2, 2}, torch::kDouble)),
                 std::logic_error);
  }
  EXPECT_EQ(g.world.stats().sent_bytes, sent);
}

}  // namespace SHARDGAN_UNITY_ID
