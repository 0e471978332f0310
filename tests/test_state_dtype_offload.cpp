// Reduced-precision Adam states offloaded (optim.<model>.state_dtype with
// offload.<model>.optimizer), and bfloat16 offloaded gradients (offload.<model>.gradient_dtype):
// - OffloadedAdam with int8 or bfloat16 states, on the cpu and the disk tier, with and without
//   the master shards in the store, equals ShardedAdam with the same policy bit for bit
//   (parameters, float32 views of the states, and the raw 8-bit parts), through chunks and
//   copy blocks smaller than a unit; the disk file holds 1 byte per element per 8-bit state;
// - a checkpoint of offloaded int8 states resumes bit for bit, into an offloaded or a
//   resident optimizer, at another stage and world size;
// - bfloat16 gradients offloaded through real backward passes (two micro-batches) equal a
//   resident run whose gradient shards are rounded to bfloat16 after each micro-batch.
#include <filesystem>
#include <functional>
#include <tuple>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "shardgan/checkpoint/checkpoint.h"
#include "shardgan/comm/mpi_communicator.h"
#include "shardgan/offload/state_store.h"
#include "shardgan/optim/offloaded_adam.h"
#include "shardgan/optim/sharded_adam.h"
#include "shardgan/sharding/sharded_model.h"
#include "state_dtype_fixture.h"

// The gtest files compile together in batches (tests/CMakeLists.txt): this file's names
// live in a namespace of its own.
namespace SHARDGAN_UNITY_ID {

using namespace shardgan;
using namespace state_dtype_fixture;

namespace {

// A small ring, so that units span several chunks (4096 elements with 8-bit states) and
// chunks several copy blocks (1024 elements).
OffloadConfig offload_config(OffloadDevice dev, bool params, const std::string& dir) {
  OffloadConfig oc;
  oc.optimizer = dev;
  if (params) oc.param = dev;
  oc.path = dir;
  oc.buffer_bytes = 48 << 10;
  oc.buffer_count = 3;
  oc.copy_block_bytes = 4096;
  return oc;
}

void train(ShardedModel& m, ShardedOptimizer& o, int from, int to) {
  for (int s = from; s < to; ++s) {
    set_gradients(m, s);
    o.step();
    m.after_optimizer_step();
  }
}

// Every raw part read_unit_raw hands out, in order, cloned.
std::vector<at::Tensor> raw_parts(ShardedModel& model, ShardedOptimizer& opt) {
  std::vector<at::Tensor> out;
  for (size_t u = 0; u < model.units().size(); ++u) {
    opt.read_unit_raw(u, [&](const std::string&, size_t, const std::string&, const at::Tensor& t) {
      out.push_back(t.clone());
    });
  }
  return out;
}

bool same_raw(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].numel() != b[i].numel() || a[i].scalar_type() != b[i].scalar_type()) return false;
    if (std::memcmp(a[i].data_ptr(), b[i].data_ptr(), static_cast<size_t>(a[i].nbytes())) != 0) return false;
  }
  return true;
}

struct Case {
  StateDtype dtype;
  double beta1;
  bool adamw;
};

}  // namespace

TEST(StateDtypeOffload, OffloadedEqualsResidentBitForBit) {
  MpiCommunicator world(MPI_COMM_WORLD, 60.0);
  const std::string base = shared_tmpdir(world);
  for (Case k : {Case{StateDtype::kInt8, 0.5, false}, Case{StateDtype::kInt8, 0.0, true},
                 Case{StateDtype::kBFloat16, 0.5, true}}) {
    const AdamConfig cfg = config(k.dtype, k.beta1, k.adamw);
    for (int stage : {2, 3}) {
      auto ref = make_model(world, stage, align_for(cfg));
      ShardedAdam ref_opt(*ref, cfg);
      train(*ref, ref_opt, 0, kSteps);
      const auto want = snapshot(*ref, ref_opt, world, stage);
      const auto want_raw = raw_parts(*ref, ref_opt);
      for (auto dev : {OffloadDevice::kCpu, OffloadDevice::kDisk}) {
        const bool params = stage == 3;
        const std::string what = std::string(to_string(k.dtype)) + " beta1 " + std::to_string(k.beta1) + " stage " +
                                 std::to_string(stage) + " " + to_string(dev) + (params ? " + parameters" : "");
        SCOPED_TRACE(what);
        auto model = make_model(world, stage, align_for(cfg));
        OffloadedAdam opt(*model, cfg, offload_config(dev, params, base));
        EXPECT_EQ(opt.state_names(), ref_opt.state_names());
        if (dev == OffloadDevice::kDisk) {
          // The file: per unit and array, S elements of its size, each region padded to 4096.
          const OffloadArrays a = offload_arrays(offload_config(dev, params, base), ref_opt.stores_m(), k.dtype, 4);
          int64_t want_bytes = 0;
          for (auto& u : model->units()) {
            for (int64_t e : a.elem_bytes) want_bytes += (u->shard_numel() * e + 4095) / 4096 * 4096;
          }
          EXPECT_EQ(opt.offloaded_bytes(), want_bytes);
        }
        train(*model, opt, 0, kSteps);
        EXPECT_EQ(opt.nonfinite_blocks(), 0);
        const auto got = snapshot(*model, opt, world, stage);
        EXPECT_TRUE(same_bits(want, got)) << "parameters or states differ from ShardedAdam's";
        EXPECT_TRUE(same_raw(want_raw, raw_parts(*model, opt))) << "raw 8-bit parts differ";
        // The comparison can fail: one more step on this side only is seen.
        train(*model, opt, kSteps, kSteps + 1);
        EXPECT_FALSE(same_bits(want, snapshot(*model, opt, world, stage)));
      }
    }
    if (world.rank() == 0) {
      std::printf("  %s beta1 %.1f: offloaded (cpu, disk; stage 2, stage 3 with parameters) equals resident bit "
                  "for bit on %d rank(s)\n", to_string(k.dtype), k.beta1, world.world_size());
    }
  }
  world.barrier();
  if (world.rank() == 0) std::filesystem::remove_all(base);
}

TEST(StateDtypeOffload, ResumeIsBitExact) {
  // int8 on disk with the master shards (stage 3 over the world): 3 steps, a checkpoint, 4
  // more. The checkpoint loads into (a) the same offloaded setup, (b) the cpu tier at stage
  // 2, (c) a resident ShardedAdam at stage 0 on each rank alone; each takes the same 4 steps
  // and equals the uninterrupted run bit for bit.
  MpiCommunicator world(MPI_COMM_WORLD, 60.0), self(MPI_COMM_SELF, 60.0);
  const std::string base = shared_tmpdir(world);
  for (const AdamConfig& cfg : {config(StateDtype::kInt8, 0.5, false), config(StateDtype::kInt8, 0.0, true)}) {
    const std::string dir = base + "/beta1-" + std::to_string(static_cast<int>(cfg.beta1 * 10));
    std::filesystem::create_directories(base + "/offload");
    auto model = make_model(world, 3, align_for(cfg));
    OffloadedAdam opt(*model, cfg, offload_config(OffloadDevice::kDisk, true, base + "/offload"));
    train(*model, opt, 0, 3);
    TrainCounters counters;
    counters.step = 3;
    counters.noise_rng_state = torch::zeros({8}, torch::kByte);
    const std::string ckpt = save_checkpoint(dir, counters, {ModelAndOptimizer{model.get(), &opt}}, "", world);
    train(*model, opt, 3, 7);
    const auto want = snapshot(*model, opt, world, 3);
    using Make = std::function<std::unique_ptr<ShardedOptimizer>(ShardedModel&)>;
    const std::string off2 = base + "/offload2";
    std::filesystem::create_directories(off2);
    for (auto [name, comm, stage, make] :
         {std::tuple<const char*, Communicator*, int, Make>{"disk, stage 3", &world, 3,
                                                             [&](ShardedModel& m) -> std::unique_ptr<ShardedOptimizer> {
                                                               return std::make_unique<OffloadedAdam>(
                                                                   m, cfg, offload_config(OffloadDevice::kDisk, true, off2));
                                                             }},
          std::tuple<const char*, Communicator*, int, Make>{"cpu, stage 2", &world, 2,
                                                             [&](ShardedModel& m) -> std::unique_ptr<ShardedOptimizer> {
                                                               return std::make_unique<OffloadedAdam>(
                                                                   m, cfg, offload_config(OffloadDevice::kCpu, false, off2));
                                                             }},
          std::tuple<const char*, Communicator*, int, Make>{"resident, 1 rank", &self, 0,
                                                             [&](ShardedModel& m) -> std::unique_ptr<ShardedOptimizer> {
                                                               return std::make_unique<ShardedAdam>(m, cfg);
                                                             }}}) {
      SCOPED_TRACE(std::string(name) + ", beta1 " + std::to_string(cfg.beta1));
      auto to = make_model(*comm, stage, align_for(cfg));
      auto to_opt = make(*to);
      TrainCounters back;
      load_checkpoint(ckpt, back, {ModelAndOptimizer{to.get(), to_opt.get()}}, *comm);
      EXPECT_EQ(to_opt->step_count(), 3);
      train(*to, *to_opt, 3, 7);
      EXPECT_TRUE(same_bits(want, snapshot(*to, *to_opt, *comm, stage))) << "the resumed run differs";
    }
    if (world.rank() == 0) {
      std::printf("  int8 beta1 %.1f offloaded to disk: resumed on disk, on cpu and resident on 1 rank, bit for bit\n",
                  cfg.beta1);
    }
  }
  world.barrier();
  if (world.rank() == 0) std::filesystem::remove_all(base);
}

TEST(StateDtypeOffload, Bf16GradientsRoundEachMicroBatch) {
  // Real backward passes, two micro-batches per step, stages 2 and 3, gradients offloaded in
  // bfloat16 (with int8 states). The reference keeps its gradient shards resident and rounds
  // them to bfloat16 after each micro-batch: the offloaded sum is rounded after each addition.
  MpiCommunicator world(MPI_COMM_WORLD, 60.0);
  const std::string base = shared_tmpdir(world);
  const AdamConfig cfg = config(StateDtype::kInt8, 0.5, false);
  auto steps = [&](ShardedModel& m, ShardedOptimizer& o, bool round) {
    torch::manual_seed(21);
    for (int step = 0; step < 4; ++step) {
      m.zero_grad();
      for (int micro = 0; micro < 2; ++micro) {
        at::Tensor x = torch::randn({6, 96});
        m.forward(x).pow(2).mean().backward();
        if (round) {
          for (auto& u : m.units()) u->grad_shard().copy_(u->grad_shard().to(at::kBFloat16));
        }
      }
      o.step();
      m.after_optimizer_step();
    }
  };
  for (int stage : {2, 3}) {
    auto ref = make_model(world, stage, align_for(cfg));
    ShardedAdam ref_opt(*ref, cfg);
    steps(*ref, ref_opt, true);
    const auto want = snapshot(*ref, ref_opt, world, stage);
    for (auto dev : {OffloadDevice::kCpu, OffloadDevice::kDisk}) {
      SCOPED_TRACE("stage " + std::to_string(stage) + " " + to_string(dev));
      auto model = make_model(world, stage, align_for(cfg));
      OffloadConfig oc = offload_config(dev, stage == 3, base);
      oc.gradient = dev;
      oc.gradient_dtype = OffloadGradDtype::kBFloat16;
      OffloadedAdam opt(*model, cfg, oc);
      ASSERT_TRUE(opt.grads_offloaded());
      steps(*model, opt, false);
      EXPECT_TRUE(same_bits(want, snapshot(*model, opt, world, stage)));
      // The unrounded resident run differs: the rounding is what the comparison sees.
      if (dev == OffloadDevice::kCpu && stage == 2) {
        auto plain = make_model(world, stage, align_for(cfg));
        ShardedAdam plain_opt(*plain, cfg);
        steps(*plain, plain_opt, false);
        EXPECT_FALSE(same_bits(want, snapshot(*plain, plain_opt, world, stage)));
      }
    }
  }
  world.barrier();
  if (world.rank() == 0) std::filesystem::remove_all(base);
}

TEST(StateDtypeOffload, RefusesWhatItCannotStore) {
  MpiCommunicator world(MPI_COMM_WORLD, 60.0);
  const std::string base = shared_tmpdir(world);
  // int8 states on a layout not aligned to the block.
  auto unaligned = make_model(world, 3, 1);
  EXPECT_THROW(OffloadedAdam(*unaligned, config(StateDtype::kInt8, 0.5, false),
                             offload_config(OffloadDevice::kCpu, false, base)),
               std::invalid_argument);
  // Reduced states or bfloat16 gradients with float64 shards.
  auto f64 = make_model(world, 3, 1, torch::kDouble);
  EXPECT_THROW(OffloadedAdam(*f64, config(StateDtype::kBFloat16, 0.5, false),
                             offload_config(OffloadDevice::kCpu, false, base)),
               std::invalid_argument);
  // bfloat16 gradients without gradient offload.
  auto plain = make_model(world, 3, 1);
  OffloadConfig oc = offload_config(OffloadDevice::kCpu, false, base);
  oc.gradient_dtype = OffloadGradDtype::kBFloat16;
  EXPECT_THROW(OffloadedAdam(*plain, config(StateDtype::kFloat32, 0.5, false), oc), std::invalid_argument);
  world.barrier();
  if (world.rank() == 0) std::filesystem::remove_all(base);
}

}  // namespace SHARDGAN_UNITY_ID
