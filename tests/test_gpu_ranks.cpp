// The NCCL backend between ranks (ctest label gpu; `mpirun -np N tests/test_gpu_ranks`, which
// scripts/gpu-check.sh runs with RANKS=N). Every case skips, on every rank alike, without a
// visible GPU or with fewer than 2 ranks. Several ranks may share one GPU with NCCL 2.30 or
// later and NCCL_MULTI_RANK_GPU_ENABLE=1 (resolve_device maps local rank r to GPU r mod count).
//  - the collectives move each rank's data: all-gather, reduce-scatter (sum and average, in
//    float32 and bfloat16), all-reduce, broadcast from a non-zero root, and a host tensor
//    through the MPI side; values are small integers, so every result is exact;
//  - a two-unit model at ZeRO-3 on the GPUs with NCCL against the same model on the CPU with
//    MPI, each rank with its own micro-batch, float64: the shards after 3 Adam steps;
//  - a rank that never joins a collective: the others' blocking all-reduce throws
//    CollectiveTimeout after timeout_s (not before, not much after), and the aborted
//    communicator refuses the next call (GpuRanks.TimeoutAbortsTheCommunicator; run it in a
//    process of its own, as it leaves NCCL aborted).
#include <chrono>
#include <cstdio>

#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

#include "shardgan/comm/mpi_communicator.h"
#include "shardgan/device/device.h"
#include "test_util.h"
#include "two_unit_model.h"
#ifdef SHARDGAN_HAVE_NCCL
#include "shardgan/comm/nccl_communicator.h"
#endif

namespace SHARDGAN_UNITY_ID {

using namespace shardgan;

namespace {

int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int node_local_rank() {
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int r = 0;
  MPI_Comm_rank(node, &r);
  MPI_Comm_free(&node);
  return r;
}

// Every rank sees the same answer (one node, one build), so every rank skips alike.
#define NEED_GPU_RANKS()                                                                            \
  if (!(cuda_compiled_in() && cuda_device_count() > 0))                                             \
    GTEST_SKIP() << "no GPU visible to this process; run scripts/gpu-check.sh with RANKS=2 on a GPU machine"; \
  if (world_size() < 2) GTEST_SKIP() << "needs 2 or more ranks: mpirun -np 2 " << "tests/test_gpu_ranks"

#ifdef SHARDGAN_HAVE_NCCL
c10::Device my_gpu() { return resolve_device("cuda", node_local_rank(), "test_gpu_ranks"); }

TEST(GpuRanks, CollectivesMoveEachRanksData) {
  NEED_GPU_RANKS();
  const c10::Device dev = my_gpu();
  const int n = world_size(), r = world_rank();
  NcclCommunicator comm(MPI_COMM_WORLD, dev.index(), 120.0);
  const auto f32 = torch::TensorOptions().device(dev).dtype(at::kFloat);
  const int64_t m = 1000;
  // all-gather: block q of the result holds rank q's shard.
  {
    at::Tensor shard = torch::full({m}, r + 1, f32), full = torch::empty({n * m}, f32);
    comm.all_gather(full, shard);
    at::Tensor want = torch::arange(1, n + 1, f32).repeat_interleave(m);
    EXPECT_TRUE(torch::equal(full.cpu(), want.cpu())) << "all_gather on rank " << r;
    // The async path with a device-side wait: the default stream sees the result.
    at::Tensor full2 = torch::empty({n * m}, f32);
    auto work = comm.all_gather_async(full2, shard);
    work->wait();
    EXPECT_TRUE(torch::equal((full2 * 1).cpu(), want.cpu())) << "all_gather_async on rank " << r;
  }
  // reduce-scatter: rank q contributes (q + 1) * (j + 1) at index j; rank r's shard holds
  // the sum over q for its block, (j + 1) * n (n + 1) / 2, exact in float32 and, for the
  // values used, in bfloat16 (integers up to 256).
  for (at::ScalarType dt : {at::kFloat, at::kBFloat16}) {
    SCOPED_TRACE(dt == at::kFloat ? "float32" : "bfloat16");
    const int64_t k = dt == at::kFloat ? m : 8;
    at::Tensor j = torch::arange(1, n * k + 1, f32);
    at::Tensor full = ((r + 1) * j).to(dt), shard = torch::empty({k}, f32.dtype(dt));
    comm.reduce_scatter(shard, full, ReduceOp::kSum);
    at::Tensor want = (j.narrow(0, r * k, k) * (n * (n + 1) / 2)).to(dt);
    EXPECT_TRUE(torch::equal(shard.cpu(), want.cpu())) << "reduce_scatter sum on rank " << r;
    at::Tensor avg = torch::empty({k}, f32.dtype(dt));
    at::Tensor full_avg = torch::full({n * k}, 2.0 * (r + 1), f32).to(dt);
    comm.reduce_scatter(avg, full_avg, ReduceOp::kAvg);
    EXPECT_TRUE(torch::equal(avg.cpu(), torch::full({k}, double(n + 1), f32).to(dt).cpu()))
        << "reduce_scatter average on rank " << r;
  }
  // all-reduce (sum and max, float64) and broadcast from the last rank.
  {
    at::Tensor s = torch::full({7}, double(r + 1), f32.dtype(at::kDouble));
    comm.all_reduce(s, ReduceOp::kSum);
    EXPECT_EQ(s.cpu()[3].item<double>(), n * (n + 1) / 2.0);
    at::Tensor x = torch::full({7}, double(r), f32.dtype(at::kDouble));
    comm.all_reduce(x, ReduceOp::kMax);
    EXPECT_EQ(x.cpu()[0].item<double>(), double(n - 1));
    at::Tensor b = torch::full({5}, double(r * 10 + 3), f32);
    comm.broadcast(b, n - 1);
    EXPECT_EQ(b.cpu()[4].item<float>(), float((n - 1) * 10 + 3));
  }
  // A host tensor goes over MPI on the same ranks.
  {
    at::Tensor h = torch::full({3}, int64_t(r + 1), torch::kLong);
    comm.all_reduce(h, ReduceOp::kSum);
    EXPECT_EQ(h[0].item<int64_t>(), int64_t(n) * (n + 1) / 2);
  }
  comm.barrier();
}

// float64 on both sides. Each rank draws its own micro-batch, so the reduce-scatter sums
// different gradients; the GPU and the CPU sum in other orders (cuBLAS, NCCL's ring or tree
// against MPI's), each rounding ~1.1e-16 relative over at most 24-term products and n-term
// sums for 3 steps: 1e-12 leaves a wide margin, and a rank's gradient left out, or data not
// moved between ranks, differs by O(1).
TEST(GpuRanks, ZeroThreeAcrossRanksMatchesTheCpu) {
  NEED_GPU_RANKS();
  const c10::Device dev = my_gpu();
  MpiCommunicator cpu_comm(MPI_COMM_WORLD, 120.0);
  NcclCommunicator gpu_comm(MPI_COMM_WORLD, dev.index(), 120.0);
  test_util::TwoUnitModel cpu(cpu_comm, c10::Device(c10::kCPU), 24), gpu(gpu_comm, dev, 24);
  ASSERT_TRUE(gpu.model->units()[0]->shard().is_cuda());
  EXPECT_LT(gpu.model->units()[0]->shard_numel(), 16 * 24 + 24) << "the unit is not sharded";
  torch::manual_seed(100 + world_rank());
  for (int s = 0; s < 3; ++s) {
    at::Tensor x = torch::randn({5, 16}, torch::kDouble);
    cpu.step(x);
    gpu.step(x);
  }
  for (size_t i = 0; i < 2; ++i) {
    at::Tensor c = cpu.model->units()[i]->shard(), g = gpu.model->units()[i]->shard().cpu();
    const double rel = ((c - g).abs().max() / c.abs().max()).item<double>();
    EXPECT_LE(rel, 1e-12) << "unit " << i << " on rank " << world_rank();
  }
}

// Rank 0 waits for an all-reduce that the other ranks never join. The blocking all-reduce
// must throw CollectiveTimeout no sooner than timeout_s and within a few seconds after it
// (the poll interval and NCCL's abort), and the aborted communicator must refuse the next
// collective instead of hanging. The other ranks wait on the host (MPI) meanwhile.
TEST(GpuRanks, TimeoutAbortsTheCommunicator) {
  NEED_GPU_RANKS();
  const c10::Device dev = my_gpu();
  const double timeout_s = 3.0;
  NcclCommunicator comm(MPI_COMM_WORLD, dev.index(), timeout_s);
  at::Tensor t = torch::ones({16}, torch::TensorOptions().device(dev));
  comm.all_reduce(t, ReduceOp::kSum);  // a working communicator first
  EXPECT_EQ(t.cpu()[0].item<float>(), float(world_size()));
  if (world_rank() == 0) {
    const auto t0 = std::chrono::steady_clock::now();
    bool timed_out = false;
    try {
      comm.all_reduce(t, ReduceOp::kSum);
    } catch (const CollectiveTimeout& e) {
      timed_out = true;
      std::printf("[ gpu ] rank 0: %s\n", e.what());
    }
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("[ gpu ] rank 0: the unmatched all-reduce ended after %.2f s (timeout %.1f s)\n", took, timeout_s);
    EXPECT_TRUE(timed_out);
    EXPECT_GE(took, timeout_s);
    EXPECT_LE(took, timeout_s + 10.0);
    EXPECT_THROW(comm.all_reduce(t, ReduceOp::kSum), CollectiveError) << "the aborted communicator ran again";
  }
  MPI_Barrier(MPI_COMM_WORLD);
}
#endif

}  // namespace

}  // namespace SHARDGAN_UNITY_ID
