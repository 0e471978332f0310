// The device-generic parts of issue 20 that run without a GPU:
//  - run.device / dist.backend refusals in the config;
//  - run.device=cuda on a machine without a GPU: LibTorch's CUDA library loads, and the
//    rank is refused with a message naming run.device (on a GPU machine: cuda:0);
//  - the chunked, double-buffered host copy (checkpoints, offload) with CPU tensors forced
//    through the staging path: exact, and every chunk's event recorded and waited once;
//  - ShardedAdam through torch's fused Adam (the GPU path's kernel call; torch has a CPU
//    kernel for the same op) against the torch-ops reference, Adam and AdamW.
#include <cstdlib>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "shardgan/comm/mpi_communicator.h"
#include "shardgan/device/device.h"
#include "shardgan/device/host_copy.h"
#include "shardgan/optim/sharded_adam.h"
#include "shardgan/sharding/sharded_model.h"
#include "shardgan/train/config.h"
#include "test_util.h"

// The gtest files compile together in batches (tests/CMakeLists.txt): this file's names
// live in a namespace of its own.
namespace SHARDGAN_UNITY_ID {

using namespace shardgan;
using shardgan::test_util::sharding;

namespace {

std::string config_error(const std::string& yaml) {
  try {
    parse_config(yaml, "t.yaml", {});
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(DeviceConfig, BackendFollowsTheDeviceAndMismatchesAreRefused) {
  EXPECT_EQ(parse_config("", "t.yaml", {}).backend, "mpi");
  EXPECT_EQ(parse_config("", "t.yaml", {}).device, "cpu");
  const std::string nccl_cpu = config_error("dist: {backend: nccl}\n");
  EXPECT_NE(nccl_cpu.find("dist.backend"), std::string::npos) << nccl_cpu;
  EXPECT_NE(nccl_cpu.find("run.device=cuda"), std::string::npos) << nccl_cpu;
  const std::string bad = config_error("run: {device: tpu}\n");
  EXPECT_NE(bad.find("run.device"), std::string::npos) << bad;
  if (cuda_compiled_in()) {
    EXPECT_EQ(parse_config("run: {device: cuda}\n", "t.yaml", {}).backend, "nccl");
    const std::string mpi_cuda = config_error("run: {device: cuda}\ndist: {backend: mpi}\n");
    EXPECT_NE(mpi_cuda.find("mpi needs run.device=cpu"), std::string::npos) << mpi_cuda;
  } else {
    const std::string no_cuda = config_error("run: {device: cuda}\n");
    EXPECT_NE(no_cuda.find("CUDA runtime compiled in"), std::string::npos) << no_cuda;
  }
}

TEST(DeviceResolve, CpuIsCpuAndCudaNeedsAVisibleGpu) {
  EXPECT_TRUE(resolve_device("cpu", 0, "t.yaml").is_cpu());
  EXPECT_THROW(resolve_device("gpu", 0, "t.yaml"), DeviceError);
  if (!cuda_compiled_in()) GTEST_SKIP() << "no CUDA runtime compiled in";
  const int n = cuda_device_count();  // loads libtorch_cuda.so: must work without a GPU too
  if (n == 0) {
    EXPECT_EQ(device_memory_used_bytes(), -1);  // no GPU in use: metrics.jsonl gets no device column
    try {
      resolve_device("cuda", 0, "t.yaml");
      ADD_FAILURE() << "run.device=cuda was accepted without a GPU";
    } catch (const DeviceError& e) {
      EXPECT_NE(std::string(e.what()).find("run.device=cuda"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("no GPU is visible"), std::string::npos) << e.what();
    }
  } else {
    EXPECT_EQ(resolve_device("cuda", 0, "t.yaml"), c10::Device(c10::kCUDA, 0));
    EXPECT_GT(device_memory_used_bytes(), 0);  // the context at least
    EXPECT_THROW(resolve_device("cuda", n, "t.yaml"), DeviceError);  // more local ranks than GPUs
  }
}

struct StagingEnv {
  StagingEnv() {
    setenv("SHARDGAN_TEST_HOST_STAGING", "1", 1);
    setenv("SHARDGAN_HOST_STAGING_BYTES", "4096", 1);
  }
  ~StagingEnv() {
    unsetenv("SHARDGAN_TEST_HOST_STAGING");
    unsetenv("SHARDGAN_HOST_STAGING_BYTES");
  }
};

// Sizes around the chunk (4096 bytes: 1024 float32, 512 float64 elements), including an
// empty tensor and an odd number of chunks (so the final drain starts with either buffer).
TEST(HostStaging, ChunkedCopiesAreExactAndEveryChunkIsWaitedOnce) {
  StagingEnv env;
  for (at::ScalarType dt : {at::kFloat, at::kDouble}) {
    const int64_t chunk = 4096 / static_cast<int64_t>(c10::elementSize(dt));
    for (int64_t n : {int64_t{0}, int64_t{1}, chunk - 1, chunk, chunk + 1, 3 * chunk + 7, 4 * chunk}) {
      SCOPED_TRACE(std::string(c10::toString(dt)) + " numel " + std::to_string(n));
      const int64_t chunks = (n + chunk - 1) / chunk;
      at::Tensor src = torch::randn({n}, torch::TensorOptions().dtype(dt));
      at::Tensor host = torch::full({n}, -7.0, src.options());
      const int64_t r0 = DeviceEvent::cpu_records(), w0 = DeviceEvent::cpu_waits();
      copy_to_host(src, host);
      EXPECT_TRUE(torch::equal(src, host));
      EXPECT_EQ(DeviceEvent::cpu_records() - r0, chunks);
      EXPECT_EQ(DeviceEvent::cpu_waits() - w0, chunks);
      at::Tensor back = torch::full({n}, -7.0, src.options());
      copy_from_host(host, back);
      EXPECT_TRUE(torch::equal(src, back));
      EXPECT_EQ(DeviceEvent::cpu_records() - r0, 2 * chunks);
      EXPECT_EQ(DeviceEvent::cpu_waits() - w0, 2 * chunks);
    }
  }
  at::Tensor a = torch::zeros({10}), b = torch::zeros({11});
  EXPECT_THROW(copy_to_host(a, b), std::invalid_argument);
  at::Tensor c = torch::zeros({10}, torch::kDouble);
  EXPECT_THROW(copy_from_host(a, c), std::invalid_argument);
  at::Tensor grid = torch::randn({3, 5, 7}).transpose(0, 2);  // not contiguous: host_copy copies
  EXPECT_TRUE(torch::equal(host_copy(grid), grid));
}

TEST(HostStaging, AnEventNeverRecordedIsNotWaitedFor) {
  const int64_t w0 = DeviceEvent::cpu_waits();
  DeviceEvent ev(c10::Device(c10::kCPU));
  ev.wait();
  EXPECT_EQ(DeviceEvent::cpu_waits(), w0);
  ev.record();
  ev.wait();
  EXPECT_EQ(DeviceEvent::cpu_waits(), w0 + 1);
}

// CopyStream on the CPU: synchronous copies, events recorded through it counted (and then
// waited for) as DeviceEvent's own; mismatched tensors refused.
TEST(HostStaging, CopyStreamOnTheCpuCopiesAndRecords) {
  CopyStream s(c10::Device(c10::kCPU));
  at::Tensor src = torch::randn({1000}), dst = torch::zeros({1000});
  s.copy(dst, src);
  EXPECT_TRUE(torch::equal(dst, src));
  const int64_t r0 = DeviceEvent::cpu_records(), w0 = DeviceEvent::cpu_waits();
  DeviceEvent ev(c10::Device(c10::kCPU));
  s.record(ev);
  ev.wait();
  EXPECT_EQ(DeviceEvent::cpu_records(), r0 + 1);
  EXPECT_EQ(DeviceEvent::cpu_waits(), w0 + 1);
  EXPECT_THROW(s.copy(torch::zeros({999}), src), std::invalid_argument);
  EXPECT_THROW(s.copy(torch::zeros({1000}, torch::kDouble), src), std::invalid_argument);
  EXPECT_THROW(s.copy(torch::zeros({2000}).slice(0, 0, 2000, 2), src), std::invalid_argument);  // stride 2
}

// torch's fused Adam (the kernel GPU shards use) against adam_torch_step, the op-for-op
// copy of torch::optim::Adam that float64 CPU shards use, over 20 steps.
// float64: both evaluate the same formula; only the order of a few roundings may differ,
// each ~1.1e-16 relative, so after 20 steps of updates of size <= lr (1e-2) on weights of
// order 1 the difference stays below 20 * 8 * 1.1e-16 * 1 ~ 2e-14: the bound is 1e-12.
// float32: the same count with float32's unit roundoff 6e-8 gives 20 * 8 * 6e-8 ~ 1e-5 of
// max|p| (the bound is 2e-5); a wrong bias correction (e.g. the step off by one: 1 - beta1
// = 0.5 at step 1 against 0.75 at step 2) moves the weights by ~lr, 500x more.
TEST(ShardedAdamTorchFused, MatchesTheTorchOpsReferenceAdamAndAdamW) {
  MpiCommunicator self(MPI_COMM_SELF, 60.0);
  for (at::ScalarType dt : {at::kFloat, at::kDouble}) {
    for (bool adamw : {false, true}) {
      SCOPED_TRACE(std::string(c10::toString(dt)) + (adamw ? " adamw" : " adam"));
      torch::manual_seed(5);
      auto lin = torch::nn::Linear(torch::nn::LinearOptions(9, 7));
      lin->to(dt);
      ShardedModel model("m", self, sharding(0));
      ShardedUnit& unit = model.add_unit("lin", lin.ptr(), [lin](const at::Tensor& x) mutable { return lin->forward(x); });
      AdamConfig cfg{1e-2, 0.5, 0.999, 1e-8, 0.1, adamw};
      ShardedAdam opt(model, cfg);
      opt.set_torch_fused(true);
      at::Tensor p = unit.shard().clone(), m = torch::zeros_like(p), v = torch::zeros_like(p);
      for (int step = 1; step <= 20; ++step) {
        at::Tensor g = torch::randn({unit.numel()}, torch::TensorOptions().dtype(dt));
        unit.grad_shard().copy_(g);
        opt.step();
        adam_torch_step(p, g, m, v, cfg, cfg.lr, step);
      }
      const double rel = ((unit.shard() - p).abs().max() / p.abs().max()).item<double>();
      EXPECT_LE(rel, dt == at::kDouble ? 1e-12 : 2e-5);
      const double mdiff = (opt.exp_avg()[0] - m).abs().max().item<double>();
      EXPECT_LE(mdiff, dt == at::kDouble ? 1e-12 : 1e-5);
    }
  }
}

}  // namespace

}  // namespace SHARDGAN_UNITY_ID
