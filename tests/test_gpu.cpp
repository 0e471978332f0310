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
//    bit-identical to ShardedAdam on the CPU;
//  - BigGAN's spectral-norm convolution (one autograd function, ConvDivSigma) and its fused
//    upsampling convolution on CUDA, which take the general branch (at::convolution and
//    at::convolution_backward in the tensors' dtype), against plain LibTorch autograd.
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "models/biggan/layers.h"
#include "shardgan/comm/mpi_communicator.h"
#include "shardgan/device/device.h"
#include "shardgan/device/host_copy.h"
#include "shardgan/optim/offloaded_adam.h"
#include "shardgan/optim/sharded_adam.h"
#include "shardgan/sharding/sharded_model.h"
#include "sharding/torch_internals.h"
#include "sn_conv_reference.h"
#include "test_util.h"
#include "two_unit_model.h"
#ifdef SHARDGAN_HAVE_NCCL
#include "shardgan/comm/nccl_communicator.h"
#endif

// The gtest files compile together in batches (tests/CMakeLists.txt): this file's names
// live in a namespace of its own.
namespace SHARDGAN_UNITY_ID {

using namespace shardgan;
using shardgan::test_util::sharding;
using namespace shardgan::biggan;

namespace {

bool have_gpu() { return cuda_compiled_in() && cuda_device_count() > 0; }

#define NEED_GPU()                                                                       \
  if (!have_gpu()) GTEST_SKIP() << "no GPU visible to this process (CUDA compiled in: " \
                                << cuda_compiled_in() << "); run scripts/gpu-check.sh on a GPU machine"

// SNConv2d on cuda:0 against plain autograd of at::conv2d(x, W) / sigma + b on cuda:0, and
// forward_upsampled against forward(upsample2(x)):
//  - float64: the output, the gradients of x, W and b, and an R1-style double backward (the
//    W gradient of ||d sum(y * r) / dx||^2) within 1e-12 of the largest magnitude. Only
//    summation orders differ (cuDNN's algorithms against each other, ~1e-16 per rounding
//    over at most ~100 terms); a lost sigma term or a wrong tap is off by O(1). The CPU
//    versions of these checks (tests/test_biggan_layers.cpp) had negative controls.
//  - bfloat16 parameters and input (u float32, as the sharding layer casts them): the
//    output and the x and W gradients within 4 bfloat16 steps (2^-6) of their largest
//    magnitude against the float32 reference of the same bfloat16 values. On CUDA the
//    convolution rounds its bfloat16 output, the division by sigma rounds again, and the
//    backward rounds dx or dW and then the division: four roundings of 2^-9 each at
//    most, plus the reference's TF32 (2^-11).
TEST(Gpu, SpectralNormConvOnCudaMatchesPlainAutograd) {
  NEED_GPU();
  const c10::Device dev = resolve_device("cuda", 0, "test_gpu");
  const auto f64 = torch::TensorOptions().dtype(torch::kDouble).device(dev);
  const test_util::SnConvErrors e = test_util::sn_conv_errors_float64(dev);
  EXPECT_LE(e.output, 1e-12) << "output";
  EXPECT_LE(e.x_grad, 1e-12) << "x gradient";
  EXPECT_LE(e.w_grad, 1e-12) << "W gradient";
  EXPECT_LE(e.bias_grad, 1e-12) << "bias gradient";
  EXPECT_LE(e.double_backward, 1e-12) << "double backward";
  auto rel_err = [](const at::Tensor& a, const at::Tensor& b) { return test_util::rel_err(a, b, /*floor=*/0.0); };

  // The fused upsampling convolution (a transposed 4x4 convolution, stride 2), float64.
  SNConv2d conv = test_util::sn_conv_float64(dev);
  const at::Tensor u0 = conv->u.clone();
  const at::Tensor x0 = torch::randn({2, 5, 6, 6}, f64);
  SNConv2d plain(5, 4, 3, 1);
  plain->to(dev, at::kDouble);
  {
    torch::NoGradGuard g;
    plain->weight.copy_(conv->weight);
    plain->bias.copy_(conv->bias);
    plain->u.copy_(u0);
  }
  at::Tensor xf = x0.clone().requires_grad_(true), xu = x0.clone().requires_grad_(true);
  const at::Tensor yf = conv->forward_upsampled(xf), yu = plain->forward(at::upsample_nearest2d(xu, {12, 12}));
  const at::Tensor gy = torch::randn(yu.sizes(), f64);
  yf.backward(gy);
  yu.backward(gy);
  EXPECT_LE(rel_err(yf.detach(), yu.detach()), 1e-12) << "fused upsampling output";
  EXPECT_LE(rel_err(xf.grad(), xu.grad()), 1e-12) << "fused upsampling x gradient";
  EXPECT_LE(rel_err(conv->weight.grad(), plain->weight.grad()), 1e-12) << "fused upsampling W gradient";

  // bfloat16 on CUDA against float32 autograd of the same values.
  SNConv2d lowp(6, 5, 3, 1, /*bias=*/false);
  init_weights(*lowp, Init::kOrtho);
  lowp->to(dev);
  {
    torch::NoGradGuard g;
    lowp->weight.mul_(1.7);
    lowp->weight.set_data(lowp->weight.detach().to(at::kBFloat16));
  }
  const at::Tensor ul = lowp->u.clone();
  const at::Tensor xl0 = torch::randn({2, 6, 7, 7}, torch::TensorOptions().device(dev)).to(at::kBFloat16);
  const at::Tensor rl = torch::randn({2, 5, 7, 7}, torch::TensorOptions().device(dev)).to(at::kBFloat16);
  at::Tensor xl = xl0.clone().requires_grad_(true);
  const at::Tensor yl = lowp->forward(xl);
  ASSERT_EQ(yl.scalar_type(), at::kBFloat16);
  yl.backward(rl);
  at::Tensor wl = lowp->weight.detach().to(at::kFloat).requires_grad_(true);
  at::Tensor xlr = xl0.to(at::kFloat).requires_grad_(true);
  const at::Tensor ylr = at::conv2d(xlr, wl, {}, 1, 1) / test_util::plain_sigma(wl, ul);
  ylr.backward(rl.to(at::kFloat));
  const double bound = 1.0 / 64;
  EXPECT_LE(rel_err(yl.detach(), ylr.detach()), bound) << "bfloat16 output";
  EXPECT_LE(rel_err(xl.grad(), xlr.grad()), bound) << "bfloat16 x gradient";
  EXPECT_LE(rel_err(lowp->weight.grad(), wl.grad()), bound) << "bfloat16 W gradient";
}

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
// float64 on both sides; the GPU's kernels (cuBLAS GEMM, fused Adam) order their sums
// differently from the CPU's, each rounding ~1.1e-16 relative, over reductions of at most 16
// terms and 3 steps: 1e-12 leaves a factor of ~100 of margin, and a missing gradient or a
// skipped reduction differs by O(1).
TEST(Gpu, ZeroThreeOnCudaWithNcclMatchesTheCpu) {
  NEED_GPU();
  const c10::Device dev = resolve_device("cuda", 0, "test_gpu");
  MpiCommunicator cpu_comm(MPI_COMM_SELF, 60.0);
  NcclCommunicator gpu_comm(MPI_COMM_SELF, dev.index(), 60.0);
  test_util::TwoUnitModel cpu(cpu_comm, c10::Device(c10::kCPU)), gpu(gpu_comm, dev);
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

}  // namespace SHARDGAN_UNITY_ID
