// Typed step statistics (step_stats.h, step_figures.h): every field is walked by
// for_each_stat, each combines over the ranks that measure it (StatSide) by its rule
// (StatReduce), shared placement (every rank runs both models) and split placement (G's
// ranks measure G's fields, D's ranks D's) through the same reduce_step_stats, and the
// all-gather exchange gives every rank the same figures and the votes' maxima.
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include <mpi.h>

#include <gtest/gtest.h>

#include "shardgan/comm/mpi_communicator.h"
#include "shardgan/train/step_figures.h"
#include "shardgan/train/step_stats.h"

// The gtest files compile together in batches (tests/CMakeLists.txt): this file's names
// live in a namespace of its own.
namespace SHARDGAN_UNITY_ID {

using namespace shardgan;

namespace {

// A StepStats whose every field holds a value derived from `seed` and its position.
StepStats filled(double seed) {
  StepStats s;
  int i = 0;
  for_each_stat(s, [&](const char*, StatSide, StatReduce, auto& v) {
    using T = std::remove_reference_t<decltype(v)>;
    if constexpr (std::is_same_v<T, bool>) {
      v = (static_cast<int>(seed) + i) % 2 == 1;
    } else {
      v = static_cast<T>(seed * 100 + i + 1);
    }
    ++i;
  });
  return s;
}

std::vector<double> rows_of(const std::vector<std::pair<StepStats, RankRole>>& ranks) {
  std::vector<double> rows;
  for (const auto& [s, role] : ranks) {
    const auto r = pack_step_stats(s, role);
    rows.insert(rows.end(), r.begin(), r.end());
  }
  return rows;
}

}  // namespace

// Every byte of StepStats but alignment padding belongs to a field that for_each_stat
// walks, each named once: a field added to the struct and not to the walk leaves a gap of
// at least its size (doubles and int64s: 8 bytes) and fails here.
TEST(StepStats, EveryFieldIsWalkedOnce) {
  StepStats s;
  const auto* base = reinterpret_cast<const char*>(&s);
  std::vector<std::pair<size_t, size_t>> spans;  // offset, size
  std::set<std::string> names;
  for_each_stat(s, [&](const char* name, StatSide, StatReduce, auto& v) {
    EXPECT_TRUE(names.insert(name).second) << name << " walked twice";
    spans.emplace_back(reinterpret_cast<const char*>(&v) - base, sizeof(v));
  });
  std::sort(spans.begin(), spans.end());
  size_t end = 0;
  for (const auto& [off, size] : spans) {
    EXPECT_GE(off, end) << "overlapping fields";
    EXPECT_LT(off - end, alignof(double)) << "bytes [" << end << ", " << off << ") of StepStats are no walked field";
    end = off + size;
  }
  EXPECT_LT(sizeof(StepStats) - end, alignof(double)) << "StepStats ends with bytes no walked field covers";
  EXPECT_EQ(step_stats_row_size(), static_cast<int64_t>(names.size()) + 1);
}

// Shared placement: every rank measures every field. Means are rank-order sums over N,
// kSame takes rank 0's, kAny any rank's, bytes the sum.
TEST(StepStats, SharedPlacementReducesOverEveryRank) {
  const StepStats a = filled(1), b = filled(2), c = filled(3);
  const std::vector<double> rows = rows_of({{a, RankRole::kBoth}, {b, RankRole::kBoth}, {c, RankRole::kBoth}});
  const StepStats r = reduce_step_stats(rows.data(), 3);
  EXPECT_EQ(r.loss_d, (a.loss_d + b.loss_d + c.loss_d) / 3);
  EXPECT_EQ(r.loss_l1, (a.loss_l1 + b.loss_l1 + c.loss_l1) / 3);
  EXPECT_EQ(r.grad_norm_g, a.grad_norm_g);  // identical after the group's vote: rank 0's
  EXPECT_EQ(r.r1, a.r1);
  EXPECT_EQ(r.skipped_d, a.skipped_d || b.skipped_d || c.skipped_d);
  EXPECT_EQ(r.nonfinite_g, a.nonfinite_g || b.nonfinite_g || c.nonfinite_g);
  EXPECT_EQ(r.bytes_between_groups, a.bytes_between_groups + b.bytes_between_groups + c.bytes_between_groups);
}

// Split placement, G on rank 0, D on ranks 1 and 2: G's fields come from rank 0 alone and
// D's (G's adversarial loss among them: D scores G's images) from ranks 1 and 2.
TEST(StepStats, SplitPlacementReducesEachFieldOverItsSide) {
  const StepStats g = filled(1), d1 = filled(2), d2 = filled(4);
  const std::vector<double> rows =
      rows_of({{g, RankRole::kGenerator}, {d1, RankRole::kDiscriminator}, {d2, RankRole::kDiscriminator}});
  const StepStats r = reduce_step_stats(rows.data(), 3);
  EXPECT_EQ(r.loss_l1, g.loss_l1);
  EXPECT_EQ(r.idle_g_s, g.idle_g_s);
  EXPECT_EQ(r.grad_norm_g, g.grad_norm_g);
  EXPECT_EQ(r.skipped_g, g.skipped_g);
  EXPECT_EQ(r.loss_g, (d1.loss_g + d2.loss_g) / 2);
  EXPECT_EQ(r.loss_d, (d1.loss_d + d2.loss_d) / 2);
  EXPECT_EQ(r.idle_d_s, (d1.idle_d_s + d2.idle_d_s) / 2);
  EXPECT_EQ(r.grad_norm_d, d1.grad_norm_d);
  EXPECT_EQ(r.nonfinite_d, d1.nonfinite_d || d2.nonfinite_d);
  EXPECT_EQ(r.bytes_between_groups, g.bytes_between_groups + d1.bytes_between_groups + d2.bytes_between_groups);
  // Every field of the walk: a G field equals G's row, a D field the D ranks' rule.
  int i = 0;
  for_each_stat(r, [&](const char* name, StatSide side, StatReduce how, const auto& v) {
    if (side == StatSide::kGenerator) {
      EXPECT_EQ(static_cast<double>(v), pack_step_stats(g, RankRole::kGenerator)[static_cast<size_t>(i + 1)]) << name;
    }
    (void)how;
    ++i;
  });
}

TEST(StepStats, ARowWithAnUnknownRoleIsRefused) {
  std::vector<double> row = pack_step_stats(StepStats{}, RankRole::kBoth);
  row[0] = 7;
  EXPECT_THROW(reduce_step_stats(row.data(), 1), std::invalid_argument);
}

// The collective: each rank posts its own statistics and a vote; every rank gets the same
// figures as reduce_step_stats of all the rows, and the votes' maximum. Two posts in
// flight finish in order.
TEST(StepStats, ExchangeGivesEveryRankTheSameFigures) {
  MpiCommunicator world(MPI_COMM_WORLD, 60.0);
  const int n = world.world_size(), me = world.rank();
  // Split roles when there are 2 ranks or more (G on rank 0), shared otherwise.
  auto role = [&](int r) { return n == 1 ? RankRole::kBoth : r == 0 ? RankRole::kGenerator : RankRole::kDiscriminator; };
  StepFiguresExchange ex(world);
  ex.post(filled(me + 1), role(me), {static_cast<double>(me), 0.5});
  ex.post(filled(me + 10), role(me), {1.0 - me, 0.0});
  std::vector<double> votes;
  const StepStats first = ex.finish(&votes);
  std::vector<std::pair<StepStats, RankRole>> all;
  for (int r = 0; r < n; ++r) all.push_back({filled(r + 1), role(r)});
  const std::vector<double> rows = rows_of(all);
  const StepStats want = reduce_step_stats(rows.data(), n);
  EXPECT_EQ(pack_step_stats(first, RankRole::kBoth), pack_step_stats(want, RankRole::kBoth));
  ASSERT_EQ(votes.size(), 2u);
  EXPECT_EQ(votes[0], n - 1);
  EXPECT_EQ(votes[1], 0.5);
  EXPECT_EQ(ex.in_flight(), 1u);
  const StepStats second = ex.finish(&votes);
  EXPECT_EQ(votes[0], 1.0);
  all.clear();
  for (int r = 0; r < n; ++r) all.push_back({filled(r + 10), role(r)});
  const std::vector<double> rows2 = rows_of(all);
  EXPECT_EQ(pack_step_stats(second, RankRole::kBoth), pack_step_stats(reduce_step_stats(rows2.data(), n), RankRole::kBoth));
  EXPECT_THROW(ex.finish(), std::logic_error);
}

}  // namespace SHARDGAN_UNITY_ID
