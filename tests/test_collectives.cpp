// Every collective, every dtype, against analytically computed results. Run under mpirun
// with 1, 2, 3 and 4 ranks (3 gives uneven shard padding in the sharding tests).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <climits>
#include <thread>
#include <vector>

#include "shardgan/comm/mpi_communicator.h"

// The gtest files compile together in batches (tests/CMakeLists.txt): this file's names
// live in a namespace of its own.
namespace SHARDGAN_UNITY_ID {

using namespace shardgan;

namespace {

class Collectives : public ::testing::TestWithParam<at::ScalarType> {
 protected:
  MpiCommunicator comm{MPI_COMM_WORLD, 60.0};
  int n = comm.world_size(), r = comm.rank();
  torch::TensorOptions opt() const { return torch::TensorOptions().dtype(GetParam()); }
  // All expected values are small integers or halves: exact in every tested dtype.
  static void expect_equal(const at::Tensor& got, const at::Tensor& want) {
    ASSERT_EQ(got.sizes(), want.sizes());
    EXPECT_TRUE(torch::equal(got.to(at::kDouble), want.to(at::kDouble)))
        << "got " << got.to(at::kDouble) << "\nwant " << want.to(at::kDouble);
  }
};

TEST_P(Collectives, AllGatherConcatenatesInRankOrder) {
  const int64_t s = 5;
  at::Tensor shard = torch::arange(r * s, (r + 1) * s, opt());
  at::Tensor full = torch::full({n * s}, -1, opt());
  comm.all_gather(full, shard);
  expect_equal(full, torch::arange(n * s, opt()));
}

TEST_P(Collectives, ReduceScatterSumAndAvg) {
  const int64_t s = 7;
  at::Tensor base = torch::arange(n * s, torch::kDouble).remainder(7).add(1);  // 1..7
  at::Tensor full = (base * (r + 1)).to(GetParam());
  at::Tensor shard = torch::empty({s}, opt());
  comm.reduce_scatter(shard, full, ReduceOp::kSum);
  at::Tensor block = base.narrow(0, r * s, s);
  expect_equal(shard, block * (n * (n + 1) / 2.0));
  comm.reduce_scatter(shard, full, ReduceOp::kAvg);
  expect_equal(shard, block * ((n + 1) / 2.0));
}

// The reduce-scatter (a direct exchange with a local reduction in rank order) against
// MPI's own all-reduce of the same data, a reference that shares none of its code, with
// three reduce-scatters in flight at once and waited in reverse order (the engine keeps
// several in flight; their messages must not cross). At N <= 2 a block is one addition,
// so the results are equal bit for bit. Above, the order of the additions differs. Each
// float32 (float64) sum of N terms is within (N - 1) eps sum|x| of the exact sum, so the two
// differ by at most 2 N eps sum|x|; an average divides that by N and adds each side's
// division rounding (eps |result|); a 16-bit result adds one 16-bit ulp, which the two
// roundings may take apart (2^-7 relative for bfloat16, 2^-10 for float16).
TEST_P(Collectives, ReduceScatterMatchesAllReduceWithSeveralInFlight) {
  const int64_t s = 1000;
  std::vector<at::Tensor> full, got, abs_sum;
  std::vector<std::unique_ptr<Work>> work;
  for (int i = 0; i < 3; ++i) {
    torch::manual_seed(100 * i + r);
    full.push_back(torch::randn({n * s}, torch::kDouble).mul_(i + 1).to(GetParam()));
    got.push_back(torch::empty({s}, opt()));
  }
  for (int i = 0; i < 3; ++i) work.push_back(comm.reduce_scatter_async(got[i], full[i], i == 1 ? ReduceOp::kSum : ReduceOp::kAvg));
  for (int i = 2; i >= 0; --i) work[i]->wait();
  for (int i = 0; i < 3; ++i) {
    const bool lowp = GetParam() == at::kBFloat16 || GetParam() == at::kHalf;
    at::Tensor want = full[i].to(lowp ? at::kFloat : GetParam(), /*non_blocking=*/false, /*copy=*/true);
    comm.all_reduce(want, i == 1 ? ReduceOp::kSum : ReduceOp::kAvg);
    want = want.narrow(0, r * s, s).to(GetParam());
    if (n <= 2) {
      EXPECT_TRUE(torch::equal(got[i], want)) << "reduce-scatter " << i << " differs from the all-reduce";
      continue;
    }
    at::Tensor mag = full[i].to(at::kDouble).abs();
    comm.all_reduce(mag, ReduceOp::kSum);
    const double eps = GetParam() == at::kDouble ? 0x1p-53 : 0x1p-24;
    const double ulp = GetParam() == at::kBFloat16 ? 0x1p-7 : GetParam() == at::kHalf ? 0x1p-10 : 0.0;
    const at::Tensor w = want.to(at::kDouble).abs();
    at::Tensor bound = mag.narrow(0, r * s, s) * (2 * n * eps);
    if (i != 1) bound = bound / n + w * (2 * eps);
    bound = bound + w * ulp;
    at::Tensor err = (got[i].to(at::kDouble) - want.to(at::kDouble)).abs();
    EXPECT_TRUE(err.le(bound).all().item<bool>()) << "reduce-scatter " << i << ": worst excess "
                                                  << (err - bound).max().item<double>();
  }
}

TEST_P(Collectives, AllReduceSumAvgMax) {
  at::Tensor j = torch::arange(6, torch::kDouble).view({2, 3});
  at::Tensor t = (j + r).to(GetParam());
  comm.all_reduce(t, ReduceOp::kSum);
  expect_equal(t, j * n + n * (n - 1) / 2.0);
  t = (j + r).to(GetParam());
  comm.all_reduce(t, ReduceOp::kMax);
  expect_equal(t, j + (n - 1));
  t = (j * 2 + r * 2).to(GetParam());
  comm.all_reduce(t, ReduceOp::kAvg);
  expect_equal(t, j * 2 + (n - 1));
}

TEST_P(Collectives, BroadcastFromLastRank) {
  const int root = n - 1;
  at::Tensor t = r == root ? torch::arange(9, opt()) : torch::zeros({9}, opt());
  comm.broadcast(t, root);
  expect_equal(t, torch::arange(9, opt()));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, Collectives,
                         ::testing::Values(at::kFloat, at::kDouble, at::kBFloat16, at::kHalf),
                         [](const auto& info) { return std::string(c10::toString(info.param)); });

TEST(CollectivesMisc, BarrierWaitsForTheSlowestRank) {
  // Every rank must leave the barrier after rank 0 entered it. steady_clock is
  // CLOCK_MONOTONIC, one clock for all processes of a host, so the times compare exactly
  // whatever the scheduling delays (the ranks of this test share one host).
  MpiCommunicator comm(MPI_COMM_WORLD, 60.0);
  auto now_ns = [] {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch()).count();
  };
  at::Tensor entered = torch::zeros({1}, torch::kLong);
  if (comm.rank() == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    entered[0] = now_ns();
  }
  comm.barrier();
  const int64_t left = now_ns();
  comm.broadcast(entered, 0);
  EXPECT_GE(left, entered.item<int64_t>()) << "rank " << comm.rank() << " left the barrier early";
}

TEST(CollectivesMisc, SizeMismatchThrowsBeforeCommunicating) {
  MpiCommunicator comm(MPI_COMM_WORLD, 60.0);
  at::Tensor shard = torch::zeros({3});
  at::Tensor wrong = torch::zeros({3 * comm.world_size() + 1});
  try {
    comm.all_gather(wrong, shard);
    FAIL() << "expected CollectiveError";
  } catch (const CollectiveError& e) {
    EXPECT_NE(std::string(e.what()).find("all_gather on rank"), std::string::npos) << e.what();
  }
}

TEST(CollectivesMisc, StatsCountBytes) {
  MpiCommunicator comm(MPI_COMM_WORLD, 60.0);
  at::Tensor shard = torch::zeros({4}), full = torch::zeros({4 * comm.world_size()});
  comm.all_gather(full, shard);
  comm.reduce_scatter(shard, full, ReduceOp::kSum);
  EXPECT_EQ(comm.stats().all_gather_calls, 1);
  EXPECT_EQ(comm.stats().all_gather_bytes, 16 * comm.world_size());
  EXPECT_EQ(comm.stats().reduce_scatter_bytes, 16 * comm.world_size());
}

// MPI counts are int: above INT_MAX elements per rank, an all-gather and a reduce-scatter
// run on a derived datatype and the other collectives are split into several calls
// (MpiCommunicator::set_max_count). With the limit lowered to 3 elements, every
// collective must give exactly what one call gives, and the call counters prove the split.
// A split that drops or misplaces a column range leaves zeros or swapped values, which
// torch::equal rejects; the call counters prove that the split path ran at all.
TEST(CollectivesSplit, SplitCallsEqualOneCall) {
  MpiCommunicator one(MPI_COMM_WORLD, 60.0), split(MPI_COMM_WORLD, 60.0);
  split.set_max_count(3);
  const int n = one.world_size(), r = one.rank();
  const int64_t s = 10;  // 4 calls of 3, 3, 3, 1 elements per rank
  for (auto dt : {at::kFloat, at::kBFloat16}) {
    at::Tensor shard = torch::randn({s}, torch::TensorOptions().dtype(dt)).add_(r);
    at::Tensor want = torch::empty({n * s}, shard.options()), got = torch::zeros_like(want);
    one.all_gather(want, shard);
    split.all_gather(got, shard);
    EXPECT_TRUE(torch::equal(got, want)) << "all_gather " << dt;
    // In place (the shard is block r of full), and async.
    at::Tensor inplace = torch::zeros_like(want);
    inplace.narrow(0, r * s, s).copy_(shard);
    at::Tensor own = inplace.narrow(0, r * s, s);
    split.all_gather_async(inplace, own)->wait();
    EXPECT_TRUE(torch::equal(inplace, want)) << "in-place async all_gather " << dt;
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
      at::Tensor full = torch::randn({n * s}).add_(r).to(dt);
      at::Tensor a = torch::empty({s}, full.options()), b = torch::empty({s}, full.options());
      one.reduce_scatter(a, full, op);
      split.reduce_scatter_async(b, full, op)->wait();
      EXPECT_TRUE(torch::equal(a, b)) << "reduce_scatter " << to_string(op) << " " << dt;
    }
    at::Tensor t = torch::randn({11}).add_(r).to(dt), u = t.clone();
    one.all_reduce(t, ReduceOp::kSum);
    split.all_reduce(u, ReduceOp::kSum);
    EXPECT_TRUE(torch::equal(t, u)) << "all_reduce " << dt;
    at::Tensor bt = torch::randn({10}).add_(r).to(dt), bu = bt.clone();
    one.broadcast(bt, n - 1);
    split.broadcast(bu, n - 1);
    EXPECT_TRUE(torch::equal(bt, bu)) << "broadcast " << dt;
  }
  EXPECT_EQ(split.stats().all_gather_calls, 2 * 2);  // 2 dtypes x (blocking, async), one derived-type call each
  EXPECT_EQ(split.stats().reduce_scatter_calls, 2 * 2);  // 2 dtypes x (sum, avg), derived-type blocks
  EXPECT_EQ(one.stats().all_gather_calls, 2);
}

// One real collective above INT_MAX elements: a uint8 broadcast of 2^31 + 7 bytes (2 GiB
// per rank; run at world size <= 2 to bound memory). Without the split, the count cast to
// int is negative and MPI_Ibcast fails.
TEST(CollectivesSplit, BroadcastAboveIntMax) {
  MpiCommunicator comm(MPI_COMM_WORLD, 120.0);
  // ctest runs it at world size 1 and 2 only; a manual run at more ranks reports a skip.
  if (comm.world_size() > 2) GTEST_SKIP() << "2 GiB per rank: run at world size 1 and 2 only";
  const int64_t numel = (int64_t{1} << 31) + 7;
  at::Tensor t = torch::empty({numel}, torch::kByte);
  const int root = comm.world_size() - 1;
  const uint8_t fill = comm.rank() == root ? 7 : 0;
  t.fill_(fill);
  if (comm.rank() == root) t[numel - 1] = 9;
  comm.broadcast(t, root);
  EXPECT_EQ(t[0].item<int>(), 7);
  EXPECT_EQ(t[INT_MAX - 1].item<int>(), 7);
  EXPECT_EQ(t[INT_MAX].item<int>(), 7);
  EXPECT_EQ(t[numel - 1].item<int>(), 9);
  at::Tensor body = t.narrow(0, 0, numel - 1);  // min and max reduce without a temporary
  EXPECT_EQ(body.min().item<int>(), 7);
  EXPECT_EQ(body.max().item<int>(), 7);
  EXPECT_EQ(comm.stats().broadcast_calls, 1);
}

// All-gather and reduce-scatter above INT_MAX elements per rank, through the derived
// datatypes (large_contiguous): uint8 blocks of 2^31 + 7 elements, checked element by
// element (min and max of each block, and marked elements at 0, INT_MAX - 1, INT_MAX and
// the end). About 8 GiB per rank at world size 2; registered as its own ctest entry at np 2.
TEST(CollectivesSplit, AllGatherAndReduceScatterAboveIntMax) {
  MpiCommunicator comm(MPI_COMM_WORLD, 300.0);
  const int n = comm.world_size(), r = comm.rank();
  const int64_t s = (int64_t{1} << 31) + 7;
  const std::vector<int64_t> marks{0, INT_MAX - 1, INT_MAX, s - 1};
  // Block q of a tensor is all `base`, except `base + 10 + k` at marks[k].
  auto check_block = [&](const at::Tensor& block, int base, const std::string& what) {
    for (size_t k = 0; k < marks.size(); ++k) {
      EXPECT_EQ(block[marks[k]].item<int>(), (base + 10 + static_cast<int>(k)) % 256) << what << " mark " << k;
      block[marks[k]] = base;
    }
    EXPECT_EQ(block.min().item<int>(), base) << what;  // min and max reduce without a temporary
    EXPECT_EQ(block.max().item<int>(), base) << what;
  };
  auto mark = [&](at::Tensor block, int base) {
    block.fill_(base);
    for (size_t k = 0; k < marks.size(); ++k) block[marks[k]] = base + 10 + static_cast<int>(k);
  };
  at::Tensor full = torch::empty({n * s}, torch::kByte);
  {
    at::Tensor shard = torch::empty({s}, torch::kByte);
    mark(shard, r + 1);
    comm.all_gather(full, shard);
  }
  for (int q = 0; q < n; ++q) check_block(full.narrow(0, q * s, s), q + 1, "all_gather block " + std::to_string(q));
  // Reduce-scatter: rank r's block q is (r + 1) + q everywhere; the sum over ranks of block
  // `me` is sum_r (r + 1 + me), marks add 10 + k per rank (all mod 256).
  for (int q = 0; q < n; ++q) mark(full.narrow(0, q * s, s), r + 1 + q);
  at::Tensor shard = torch::empty({s}, torch::kByte);
  comm.reduce_scatter(shard, full, ReduceOp::kSum);
  full = at::Tensor();
  int base = 0;
  for (int q = 0; q < n; ++q) base += q + 1 + r;
  for (size_t k = 0; k < marks.size(); ++k) {  // the marks add 10 + k on each rank
    EXPECT_EQ(shard[marks[k]].item<int>(), (base + n * (10 + static_cast<int>(k))) % 256) << "reduce_scatter mark " << k;
    shard[marks[k]] = base % 256;
  }
  EXPECT_EQ(shard.min().item<int>(), base % 256);
  EXPECT_EQ(shard.max().item<int>(), base % 256);
  EXPECT_EQ(comm.stats().all_gather_calls, 1);
  EXPECT_EQ(comm.stats().reduce_scatter_calls, 1);
}

// The progress thread moves a prefetched all-gather while this thread computes and never
// calls MPI: the peer's block lands in `full` before wait(). 16 MiB per rank is far above
// the shared-memory BTL's eager limit, so without the thread the transfer waits for the
// next MPI call (negative control, run once: without enable_progress_thread the block never
// arrives and the test fails after its 10 s budget).
TEST(CollectivesProgress, ThreadAdvancesAllGatherWithoutMpiCalls) {
  MpiCommunicator comm(MPI_COMM_WORLD, 60.0);
  const int n = comm.world_size(), r = comm.rank();
  if (n < 2) GTEST_SKIP() << "needs a peer (ctest runs it at world size 2 and up)";
  comm.enable_progress_thread(100);
  const int64_t s = int64_t{4} << 20;  // float32 elements: 16 MiB
  at::Tensor shard = torch::full({s}, static_cast<float>(r + 1));
  at::Tensor full = torch::zeros({n * s});
  comm.barrier();  // both ranks start together
  auto work = comm.all_gather_async(full, shard);
  const int peer = (r + 1) % n;
  const volatile float* last = full.data_ptr<float>() + (peer + 1) * s - 1;  // the peer block's end
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  bool arrived = false;
  while (!(arrived = *last == static_cast<float>(peer + 1)) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // "compute": no MPI call here
  }
  EXPECT_TRUE(arrived) << "the peer's block did not arrive before wait() within 10 s";
  work->wait();
  // Some rank's thread moved it (on 2 cores with 4 ranks, this rank's may not have run yet).
  at::Tensor polls = torch::tensor({comm.progress_polls()}, torch::kLong);
  comm.all_reduce(polls, ReduceOp::kSum);
  EXPECT_GT(polls.item<int64_t>(), 0);
  for (int q = 0; q < n; ++q) EXPECT_TRUE(full.narrow(0, q * s, s).eq(q + 1).all().item<bool>()) << "block " << q;
}

}  // namespace

}  // namespace SHARDGAN_UNITY_ID
