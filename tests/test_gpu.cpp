// Tests that need a GPU (ctest label `gpu`; scripts/gpu-check.sh runs them). Each skips with
// a message when no GPU is visible, so CI on the CPU machines reports the entry as skipped.
//  - free and refill of a gathered flat parameter on CUDA storage (the caching allocator);
//  - a two-unit model at ZeRO-3 on cuda:0 with the NCCL backend (world size 1) against the
//    same model on the CPU with MPI, float64: gradients and an Adam step (torch's fused CUDA
//    Adam against the CPU path);
//  - the chunked host-staging copy from and to device memory, with pinned staging buffers;
//  - NCCL's device-side wait (the default): Work::wait() returns while the collective, queued
//    behind about 0.1 s of matrix products, has not run yet, and the results (float32
//    all-gather, bfloat16 reduce-scatter rounded after the wait) are right; with
//    dist.blocking_wait it returns only after them;
//  - ZeRO-Offload with CUDA shards: the gradient blocks come down and the parameters go back
//    through pinned buffers, overlapped with the CPU Adam (offload.overlap_copies) or not,
//    bit-identical to ShardedAdam on the CPU.
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "shardgan/comm/mpi_communicator.h"
#include "shardgan/device/device.h"
#include "shardgan/device/host_copy.h"
#include "shardgan/optim/offloaded_adam.h"
#include "shardgan/optim/sharded_adam.h"
#include "shardgan/sharding/sharded_model.h"
#include "sharding/torch_internals.h"
#include "test_util.h"
#ifdef SHARDGAN_HAVE_NCCL
#include "shardgan/comm/nccl_communicator.h"
#endif

using namespace shardgan;
using shardgan::test_util::sharding;

namespace {

bool have_gpu() { return cuda_compiled_in() && cuda_device_count() > 0; }

#define NEED_GPU()                                                                       \
  if (!have_gpu()) GTEST_SKIP() << "no GPU visible to this process (CUDA compiled in: " \
                                << cuda_compiled_in() << "); run scripts/gpu-check.sh on a GPU machine"

TEST(Gpu, FreeAndRefillKeepViewsOnCudaStorage) {
  NEED_GPU();
  const c10::Device dev = resolve_device("cuda", 0, "test_gpu");
  at::Tensor full = torch::randn({1000}, torch::TensorOptions().device(dev));
  at::Tensor view = full.narrow(0, 10, 20);
  shardgan::detail::free_storage(full);
  EXPECT_EQ(shardgan::detail::storage_nbytes(full), 0u);
  shardgan::detail::refill_storage(full, 1000 * sizeof(float));
  full.fill_(3.0);
  EXPECT_EQ(view.sum().item<float>(), 60.0f);
  EXPECT_TRUE(view.is_cuda());
}

TEST(Gpu, HostStagingCopiesThroughPinnedBuffers) {
  NEED_GPU();
  const c10::Device dev = resolve_device("cuda", 0, "test_gpu");
  set_pin_host_memory(true);
  setenv("SHARDGAN_HOST_STAGING_BYTES", "4096", 1);
  at::Tensor src = torch::randn({10007}, torch::TensorOptions().device(dev));
  at::Tensor host = torch::empty({10007});
  copy_to_host(src, host);
  EXPECT_TRUE(torch::equal(src.cpu(), host));
  at::Tensor back = torch::zeros_like(src);
  copy_from_host(host, back);
  EXPECT_TRUE(torch::equal(back, src));
  unsetenv("SHARDGAN_HOST_STAGING_BYTES");
  set_pin_host_memory(false);
}

#ifdef SHARDGAN_HAVE_NCCL
struct TwoUnits {
  torch::nn::Linear a{torch::nn::LinearOptions(16, 8)}, b{torch::nn::LinearOptions(8, 4)};
  std::unique_ptr<ShardedModel> model;
  std::unique_ptr<ShardedAdam> opt;
  TwoUnits(Communicator& comm, c10::Device dev) {
    torch::manual_seed(11);
    a = torch::nn::Linear(torch::nn::LinearOptions(16, 8));
    b = torch::nn::Linear(torch::nn::LinearOptions(8, 4));
    a->to(dev, at::kDouble);
    b->to(dev, at::kDouble);
    model = std::make_unique<ShardedModel>("m", comm, sharding(3));
    auto fa = a, fb = b;
    model->add_unit("a", a.ptr(), [fa](const at::Tensor& x) mutable { return torch::tanh(fa->forward(x)); });
    model->add_unit("b", b.ptr(), [fb](const at::Tensor& x) mutable { return fb->forward(x); });
    opt = std::make_unique<ShardedAdam>(*model, AdamConfig{1e-2, 0.5, 0.999, 1e-8});
  }
  void step(const at::Tensor& x) {
    model->zero_grad();
    model->forward(x).square().sum().backward();
    opt->step();
  }
};

// float64 on both sides; the GPU's kernels (cuBLAS GEMM, fused Adam) order their sums
// differently from the CPU's, each rounding ~1.1e-16 relative, over reductions of at most 16
// terms and 3 steps: 1e-12 leaves a factor of ~100 of margin, and a missing gradient or a
// skipped reduction differs by O(1).
TEST(Gpu, ZeroThreeOnCudaWithNcclMatchesTheCpu) {
  NEED_GPU();
  const c10::Device dev = resolve_device("cuda", 0, "test_gpu");
  MpiCommunicator cpu_comm(MPI_COMM_SELF, 60.0);
  NcclCommunicator gpu_comm(MPI_COMM_SELF, dev.index(), 60.0);
  TwoUnits cpu(cpu_comm, c10::Device(c10::kCPU)), gpu(gpu_comm, dev);
  EXPECT_TRUE(gpu.model->units()[0]->shard().is_cuda());
  torch::manual_seed(12);
  for (int s = 0; s < 3; ++s) {
    at::Tensor x = torch::randn({5, 16}, torch::kDouble);
    cpu.step(x);
    gpu.step(x);  // the model moves the host input to cuda:0
  }
  for (size_t i = 0; i < 2; ++i) {
    at::Tensor c = cpu.model->units()[i]->shard(), g = gpu.model->units()[i]->shard().cpu();
    const double rel = ((c - g).abs().max() / c.abs().max()).item<double>();
    EXPECT_LE(rel, 1e-12) << "unit " << i;
  }
}

// The offloaded step on CUDA shards runs the CPU kernel on the same numbers as ShardedAdam
// on CPU shards (the copies are exact), so the shards must be the same bits after 5 steps,
// with the copies overlapped in 4096-byte blocks (hundreds per unit) and without.
// Negative control: one step more on one side is seen.
TEST(Gpu, DeviceSideWaitLeavesTheHostFree) {
  NEED_GPU();
  const c10::Device dev = resolve_device("cuda", 0, "test_gpu");
  using Clock = std::chrono::steady_clock;
  auto since = [](Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); };
  const auto opts = torch::TensorOptions().device(dev);
  for (bool blocking : {false, true}) {
    SCOPED_TRACE(blocking ? "blocking_wait" : "device-side wait");
    NcclCommunicator comm(MPI_COMM_SELF, dev.index(), 60.0, blocking);
    at::Tensor a = torch::randn({4096, 4096}, opts) / 64;
    // Warm-up: a communicator's first collective sets NCCL up and synchronizes the device,
    // and the first product initializes cuBLAS (the first GPU run of this test, without
    // this, saw the host wait 0.25 s for both).
    {
      at::Tensor one = torch::ones({8}, opts), eight = torch::empty({8}, opts);
      comm.all_gather_async(eight, one)->wait();
      at::Tensor h16 = one.to(at::kBFloat16), o16 = torch::empty({8}, opts.dtype(at::kBFloat16));
      comm.reduce_scatter_async(o16, h16, ReduceOp::kSum)->wait();
      (void)torch::mm(a, a);
    }
    torch::cuda::synchronize();
    const auto t0 = Clock::now();
    at::Tensor b = a;
    for (int i = 0; i < 40; ++i) b = torch::mm(a, b);  // 40 x 137 GFLOP, queued
    at::Tensor shard = b.flatten().narrow(0, 0, 4096).contiguous();
    at::Tensor full = torch::empty({4096}, opts);
    auto work = comm.all_gather_async(full, shard);
    at::Tensor grad16 = b.flatten().narrow(0, 0, 4096).to(at::kBFloat16);
    at::Tensor out16 = torch::empty({4096}, opts.dtype(at::kBFloat16));
    auto rs = comm.reduce_scatter_async(out16, grad16, ReduceOp::kSum);
    work->wait();
    rs->wait();
    const double host_s = since(t0);
    torch::cuda::synchronize();
    const double total_s = since(t0);
    std::printf("[ gpu ] %s: wait returned after %.4f s, the device finished after %.4f s\n",
                blocking ? "blocking_wait" : "device-side wait", host_s, total_s);
    EXPECT_GT(total_s, 0.02) << "the queued products were too short to tell the waits apart";
    if (blocking) {
      EXPECT_GT(host_s, 0.9 * total_s);
    } else {
      EXPECT_LT(host_s, 0.5 * total_s);
    }
    EXPECT_TRUE(torch::equal(full.cpu(), shard.cpu()));
    EXPECT_TRUE(torch::equal(out16.cpu(), grad16.cpu()));  // one rank: the sum is the input
  }
}

TEST(Gpu, OffloadedAdamOnCudaShardsBitIdenticalToTheCpu) {
  NEED_GPU();
  const c10::Device dev = resolve_device("cuda", 0, "test_gpu");
  set_pin_host_memory(true);
  MpiCommunicator cpu_comm(MPI_COMM_SELF, 60.0);
  NcclCommunicator gpu_comm(MPI_COMM_SELF, dev.index(), 60.0);
  for (bool overlap : {true, false}) {
    SCOPED_TRACE(overlap ? "overlapped copies" : "synchronous copies");
    auto build = [](Communicator& comm, c10::Device d, torch::nn::Linear& a, torch::nn::Linear& b) {
      torch::manual_seed(5);
      a = torch::nn::Linear(torch::nn::LinearOptions(300, 700));
      b = torch::nn::Linear(torch::nn::LinearOptions(700, 3));
      a->to(d);
      b->to(d);
      auto m = std::make_unique<ShardedModel>("generator", comm, sharding(3));
      auto fa = a, fb = b;
      m->add_unit("a", a.ptr(), [fa](const at::Tensor& x) mutable { return fa->forward(x); });
      m->add_unit("b", b.ptr(), [fb](const at::Tensor& x) mutable { return fb->forward(x); });
      return m;
    };
    torch::nn::Linear ca{nullptr}, cb{nullptr}, ga{nullptr}, gb{nullptr};
    auto cpu = build(cpu_comm, c10::Device(c10::kCPU), ca, cb);
    auto gpu = build(gpu_comm, dev, ga, gb);
    ASSERT_TRUE(gpu->units()[0]->shard().is_cuda());
    const AdamConfig cfg{1e-2, 0.9, 0.999, 1e-8, 0.001, false};
    ShardedAdam ref(*cpu, cfg);
    OffloadConfig oc;
    oc.optimizer = OffloadDevice::kCpu;
    oc.buffer_bytes = int64_t{1} << 20;
    oc.copy_block_bytes = 4096;
    oc.overlap_copies = overlap;
    OffloadedAdam off(*gpu, cfg, oc);
    torch::manual_seed(9);
    for (int step = 0; step < 5; ++step) {
      for (size_t u = 0; u < 2; ++u) {
        at::Tensor g = torch::randn({cpu->units()[u]->shard_numel()});
        cpu->units()[u]->grad_shard().copy_(g);
        gpu->units()[u]->grad_shard().copy_(g);
      }
      ref.step();
      off.step();
    }
    for (size_t u = 0; u < 2; ++u) {
      EXPECT_TRUE(torch::equal(cpu->units()[u]->shard(), gpu->units()[u]->shard().cpu())) << "unit " << u;
    }
    off.step();
    EXPECT_FALSE(torch::equal(cpu->units()[0]->shard(), gpu->units()[0]->shard().cpu()));
  }
  set_pin_host_memory(false);
}
#endif

}  // namespace
