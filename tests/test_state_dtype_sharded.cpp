// Reduced-precision Adam states inside the sharded optimizer (optim.<model>.state_dtype):
// - sharded Adam with bfloat16 or int8 states at stages 1-3 over every rank of the run
//   equals the unsharded step (stage 0 on one rank) bit for bit, parameters and states,
//   because 8-bit blocks start at every parameter and the flat layout aligns parameters and
//   shard boundaries to the block (flat_layout.h);
// - frozen parameters keep their stored bits (raw 8-bit blocks, not a float32 round trip);
// - with beta1 0, m is not stored, and the step equals the stored-m step;
// - the bfloat16 states survive the checkpoint's float32 view bit for bit;
// - negative control (ctest optimizer_state_dtype_unaligned_control_np2, under
//   SHARDGAN_TEST_CONTROL=state_dtype_unaligned): int8 states on an unaligned flat layout,
//   where a block straddles two ranks, and the comparison then fails.
#include <cstring>
#include <filesystem>
#include <map>
#include <tuple>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "shardgan/checkpoint/checkpoint.h"
#include "shardgan/checkpoint/shard_io.h"
#include "shardgan/comm/mpi_communicator.h"
#include "shardgan/optim/blockwise_quant.h"
#include "shardgan/optim/sharded_adam.h"
#include "shardgan/sharding/sharded_model.h"
#include "state_dtype_fixture.h"

// The gtest files compile together in batches (tests/CMakeLists.txt): this file's names
// live in a namespace of its own.
namespace SHARDGAN_UNITY_ID {

using namespace shardgan;
using namespace state_dtype_fixture;

namespace {

struct Case {
  StateDtype dtype;
  double beta1;
  bool adamw;
};

TEST(StateDtypeSharded, ShardedEqualsUnshardedBitForBit) {
  MpiCommunicator world(MPI_COMM_WORLD, 60.0), self(MPI_COMM_SELF, 60.0);
  for (Case k : {Case{StateDtype::kInt8, 0.5, false}, Case{StateDtype::kInt8, 0.0, true},
                 Case{StateDtype::kBFloat16, 0.5, true}, Case{StateDtype::kBFloat16, 0.0, false}}) {
    const AdamConfig cfg = config(k.dtype, k.beta1, k.adamw);
    const auto ref = run(self, 0, cfg, align_for(cfg));
    for (int stage : {1, 2, 3}) {
      const auto got = run(world, stage, cfg, align_for(cfg));
      EXPECT_TRUE(same_bits(ref, got)) << to_string(k.dtype) << " beta1 " << k.beta1 << " stage " << stage << " on "
                                       << world.world_size() << " ranks";
    }
    if (world.rank() == 0) {
      std::printf("  %s beta1 %.1f %s: stages 1-3 on %d rank(s) equal stage 0 bit for bit\n", to_string(k.dtype),
                  k.beta1, k.adamw ? "adamw" : "adam", world.world_size());
    }
  }
}

TEST(StateDtypeSharded, LayoutIsAlignedAndCounted) {
  MpiCommunicator world(MPI_COMM_WORLD, 60.0);
  const AdamConfig cfg = config(StateDtype::kInt8, 0.5, false);
  auto model = make_model(world, 3, cfg.state.block);
  ShardedAdam opt(*model, cfg);
  int64_t bytes = 0;
  for (size_t u = 0; u < model->units().size(); ++u) {
    const ShardedUnit& unit = *model->units()[u];
    EXPECT_EQ(unit.shard_offset() % cfg.state.block, 0) << unit.name();
    EXPECT_EQ(unit.shard_numel() % cfg.state.block, 0) << unit.name();
    for (const auto& s : unit.slots()) EXPECT_EQ(s.offset % cfg.state.block, 0) << unit.name() << "." << s.name;
    const StateLayout& l = opt.layout(u);
    EXPECT_EQ(l.reduced_numel + l.float32_numel, unit.shard_numel());
    bytes += 2 * l.state_bytes(StateDtype::kInt8);
  }
  EXPECT_EQ(opt.state_bytes(), bytes);
  // b.weight is kept float32 by the glob, the biases by state_min_numel: every rank's
  // reduced elements are those of a.weight, c.0.weight and c.1.weight, with their padding.
  EXPECT_TRUE(opt.stores_m());
  EXPECT_EQ(opt.state_names(), (std::vector<std::string>{"exp_avg", "exp_avg_sq"}));
}

TEST(StateDtypeSharded, Int8RefusesAnUnalignedModel) {
  MpiCommunicator world(MPI_COMM_WORLD, 60.0);
  auto model = make_model(world, 3, 1);
  EXPECT_THROW(ShardedAdam(*model, config(StateDtype::kInt8, 0.5, false)), std::invalid_argument);
  // float64 shards: the reduced kernels take float32 only.
  auto f64 = make_model(world, 3, 1, torch::kDouble);
  EXPECT_THROW(ShardedAdam(*f64, config(StateDtype::kBFloat16, 0.5, false)), std::invalid_argument);
}

TEST(StateDtypeSharded, UnstoredMomentEqualsTheStoredStep) {
  // beta1 0, float32 states: m is not stored, and p and v equal the reference loop that
  // keeps m (the same operations; m is 0 * m + 1 * g either way).
  MpiCommunicator self(MPI_COMM_SELF, 60.0);
  AdamConfig cfg = config(StateDtype::kFloat32, 0.0, false);
  auto model = make_model(self, 0, 1);
  ShardedAdam opt(*model, cfg);
  EXPECT_FALSE(opt.stores_m());
  EXPECT_EQ(opt.state_names(), std::vector<std::string>{"exp_avg_sq"});
  std::vector<at::Tensor> p, m, v;
  for (auto& u : model->units()) {
    p.push_back(u->shard().clone());
    m.push_back(torch::zeros_like(u->shard()));
    v.push_back(torch::zeros_like(u->shard()));
  }
  for (int s = 0; s < kSteps; ++s) {
    set_gradients(*model, s);
    const AdamCoefficients c = adam_coefficients(cfg.lr, cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay, false, s + 1);
    for (size_t u = 0; u < p.size(); ++u) {
      at::Tensor g = model->units()[u]->grad_shard().clone();
      at::Tensor before = p[u].clone();
      reference_adam_step(p[u].data_ptr<float>(), g.data_ptr<float>(), m[u].data_ptr<float>(), v[u].data_ptr<float>(),
                          p[u].numel(), c);
      for (const auto& sl : model->units()[u]->slots()) {  // the frozen weight keeps its value
        if (!sl.param.requires_grad()) {
          p[u].narrow(0, sl.offset, sl.numel).copy_(before.narrow(0, sl.offset, sl.numel));
        }
      }
    }
    opt.step();
    model->after_optimizer_step();
  }
  for (size_t u = 0; u < p.size(); ++u) {
    EXPECT_TRUE(torch::equal(p[u], model->units()[u]->shard())) << "unit " << u;
  }
}

TEST(StateDtypeSharded, Bf16StatesSurviveTheFloat32View) {
  // Checkpoints store the states through read_unit_state / write_unit_state (float32): for
  // bfloat16 states the round trip gives back the same bits, so a resume is exact.
  MpiCommunicator world(MPI_COMM_WORLD, 60.0);
  const AdamConfig cfg = config(StateDtype::kBFloat16, 0.5, false);
  auto model = make_model(world, 2, 1);
  ShardedAdam opt(*model, cfg);
  for (int s = 0; s < 3; ++s) {
    set_gradients(*model, s);
    opt.step();
    model->after_optimizer_step();
  }
  for (size_t u = 0; u < model->units().size(); ++u) {
    std::vector<at::Tensor> before;
    opt.read_unit_state(u, [&](const std::string&, at::Tensor& st) { before.push_back(st.clone()); });
    size_t k = 0;
    opt.write_unit_state(u, [&](const std::string&, at::Tensor& st) { st.copy_(before[k++]); });
    std::vector<at::Tensor> after;
    opt.read_unit_state(u, [&](const std::string&, at::Tensor& st) { after.push_back(st.clone()); });
    EXPECT_TRUE(same_bits(before, after)) << "unit " << u;
  }
}

TEST(StateDtypeSharded, UnalignedControl) {
  // Run only under SHARDGAN_TEST_CONTROL=state_dtype_unaligned, on 2 ranks: ShardedAdam then
  // accepts int8 states on a flat layout that is not aligned to the block, so a.weight's
  // blocks straddle the shard boundary at element 3880, and the sharded step must differ
  // from the unsharded one somewhere.
  MpiCommunicator world(MPI_COMM_WORLD, 60.0), self(MPI_COMM_SELF, 60.0);
  ASSERT_EQ(world.world_size(), 2) << "the control runs on 2 ranks";
  const AdamConfig cfg = config(StateDtype::kInt8, 0.5, false);
  const auto ref = run(self, 0, cfg, 1);
  const auto got = run(world, 1, cfg, 1);
  EXPECT_FALSE(same_bits(ref, got)) << "unaligned 8-bit blocks gave the unsharded bits: the comparison cannot fail";
}

// Trains `cfg` for 3 steps at `stage` over the world, saves, and loads the checkpoint into
// a fresh model and optimizer with `cfg_to` (another state dtype, hence another flat
// layout for int8) at `stage_to` over `to_comm`. Then both take `after` more steps on the
// same gradients. Returns the snapshots of the saved run and of the loaded one
// (parameters and float32 views of the states, each [data_end]).
std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>> save_and_load(Communicator& world, const AdamConfig& cfg,
                                                                          int stage, Communicator& to_comm,
                                                                          const AdamConfig& cfg_to, int stage_to,
                                                                          const std::string& dir, int after = 0) {
  auto model = make_model(world, stage, align_for(cfg));
  ShardedAdam opt(*model, cfg);
  auto train = [](ShardedModel& m, ShardedAdam& o, int from, int to) {
    for (int s = from; s < to; ++s) {
      set_gradients(m, s);
      o.step();
      m.after_optimizer_step();
    }
  };
  train(*model, opt, 0, 3);
  TrainCounters counters;
  counters.step = 3;
  counters.noise_rng_state = torch::zeros({8}, torch::kByte);
  const std::string ckpt = save_checkpoint(dir, counters, {ModelAndOptimizer{model.get(), &opt}}, "", world);
  train(*model, opt, 3, 3 + after);
  auto saved = snapshot(*model, opt, world, stage);
  auto to = make_model(to_comm, stage_to, align_for(cfg_to));
  ShardedAdam opt_to(*to, cfg_to);
  TrainCounters back;
  load_checkpoint(ckpt, back, {ModelAndOptimizer{to.get(), &opt_to}}, to_comm);
  EXPECT_EQ(opt_to.step_count(), 3);
  train(*to, opt_to, 3, 3 + after);
  return {saved, snapshot(*to, opt_to, to_comm, stage_to)};
}

// Snapshots hold, per unit, [param, m, v]: the parameters' elements of each, in parameter
// order (the two layouts place them differently).
std::vector<at::Tensor> by_parameter(const std::vector<at::Tensor>& snap, ShardedModel& layout) {
  std::vector<at::Tensor> out;
  for (size_t u = 0; u < layout.units().size(); ++u) {
    for (size_t k = 0; k < 3; ++k) {
      std::vector<at::Tensor> parts;
      for (const auto& s : layout.units()[u]->slots()) parts.push_back(snap[3 * u + k].narrow(0, s.offset, s.numel));
      out.push_back(torch::cat(parts));
    }
  }
  return out;
}

}  // namespace

TEST(StateDtypeCheckpoint, ReducedStatesLoadAcrossDtypesAndLayouts) {
  MpiCommunicator world(MPI_COMM_WORLD, 60.0), self(MPI_COMM_SELF, 60.0);
  const std::string base = shared_tmpdir(world);
  auto plain = make_model(self, 0, 1);
  auto aligned = make_model(self, 0, 256);
  const AdamConfig f32 = config(StateDtype::kFloat32, 0.5, false), bf16 = config(StateDtype::kBFloat16, 0.5, false),
                   i8 = config(StateDtype::kInt8, 0.5, false), i8_b0 = config(StateDtype::kInt8, 0.0, true);
  // Resumes that must equal the uninterrupted run bit for bit, 4 steps after the save:
  // 8-bit states stored as held (per parameter: codes and absmax), bfloat16 widened.
  for (auto [cfg, stage, to_stage, name] : {std::tuple{i8, 3, 1, "int8"}, std::tuple{i8_b0, 2, 3, "int8-beta1-0"},
                                            std::tuple{bf16, 3, 1, "bf16"}}) {
    auto [a, b] = save_and_load(world, cfg, stage, world, cfg, to_stage, base + "/" + name, 4);
    EXPECT_TRUE(same_bits(a, b)) << name << ": the resumed run differs from the uninterrupted one";
    if (world.rank() == 0) std::printf("  %s: stage %d -> %d on %d rank(s), resumed run equals the uninterrupted one bit for bit\n",
                                       name, stage, to_stage, world.world_size());
  }
  {  // int8 at stage 2 over the world -> int8 at stage 0 on each rank alone: another world size
    auto [a, b] = save_and_load(world, i8, 2, self, i8, 0, base + "/int8-to-1", 4);
    EXPECT_TRUE(same_bits(a, b)) << "int8 resumed on 1 rank differs from the uninterrupted run";
  }
  {  // float32 (packed layout) -> int8 (aligned layout): parameters exact, states requantized
    auto [a, b] = save_and_load(world, f32, 2, world, i8, 3, base + "/f32-to-int8");
    const auto pa = by_parameter(a, *plain), pb = by_parameter(b, *aligned);
    for (size_t i = 0; i < pa.size(); ++i) {
      if (i % 3 == 0) {
        EXPECT_TRUE(torch::equal(pa[i], pb[i])) << "parameters of unit " << i / 3;
      } else {  // requantized: a loose bound (the map's gaps are under 0.02 of a block's absmax)
        const double tol = 0.06 * pa[i].abs().max().item<double>();
        EXPECT_LE((pa[i] - pb[i]).abs().max().item<double>(), tol) << "state " << i % 3 << " of unit " << i / 3;
      }
    }
  }
  {  // int8 (aligned) -> float32 (packed): parameters exact, states the dequantized values
    auto [a, b] = save_and_load(world, i8, 1, world, f32, 3, base + "/int8-to-f32");
    const auto pa = by_parameter(a, *aligned), pb = by_parameter(b, *plain);
    for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(torch::equal(pa[i], pb[i])) << "tensor " << i;
    // The checkpoint verifies, and its consolidated view (what shardgan-ckpt consolidate
    // writes) holds the 8-bit states dequantized: the run's own float32 view.
    if (world.rank() == 0) {
      ckpt::CheckpointReader rd(base + "/int8-to-f32/checkpoints/step-00000003");
      EXPECT_TRUE(rd.verify_all().empty());
      std::map<std::string, std::vector<at::Tensor>> parts;  // "<state>/<unit index>" -> per parameter
      for (const ckpt::TensorRef& t : rd.tensors()) {
        if (t.kind.rfind("optim/", 0) != 0) continue;
        EXPECT_EQ(t.dtype, "float32");
        at::Tensor v = torch::empty({t.numel()}, torch::kFloat);
        rd.read_tensor(t, v.data_ptr());
        parts[t.kind + "/" + std::to_string(t.unit)].push_back(v);
      }
      for (size_t u = 0; u < aligned->units().size(); ++u) {
        EXPECT_TRUE(torch::equal(torch::cat(parts["optim/exp_avg/" + std::to_string(u)]), pa[3 * u + 1])) << u;
        EXPECT_TRUE(torch::equal(torch::cat(parts["optim/exp_avg_sq/" + std::to_string(u)]), pa[3 * u + 2])) << u;
      }
      // verify_all checks the raw parts' sizes: an index that claims blocks of 128 (twice
      // the absmax values the files hold) is reported, naming the absmax.
      const std::string bad = base + "/int8-bad-index";
      std::filesystem::copy(base + "/int8-to-f32/checkpoints/step-00000003", bad);
      ckpt::Manifest m = rd.manifest();
      m.models.at(0).raw_state_block = 128;
      ckpt::write_index(bad, m);
      ckpt::CheckpointReader bad_rd(bad);
      const auto problems = bad_rd.verify_all();
      EXPECT_FALSE(problems.empty());
      bool named = false;
      for (const auto& p : problems) named |= p.find("absmax") != std::string::npos;
      EXPECT_TRUE(named) << (problems.empty() ? "no problem reported" : problems[0]);
    }
  }
  world.barrier();
  if (world.rank() == 0) std::filesystem::remove_all(base);
}

}  // namespace SHARDGAN_UNITY_ID
