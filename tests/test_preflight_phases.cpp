// preflight_alive_buffers (issue 58, review finding 1): the step's phases (src/train/
// step_phases.h) against the objective's real order of events, and the memory pre-flight's
// count of the gradient shards alive at once.
// - Real steps: the tiny conditional BigGAN (float64, SGD, 2 micro-batches, 2 steps) under
//   GanObjective at stages 2 and 3 on mpirun's ranks (the ctest entry runs 2 and 4), for
//   the alternating update (d_steps 1 and 2) and the simultaneous one with and without the
//   shared D forward (d_steps 1 and 2). At every optimizer update (the objective's
//   before-update hook) the test reads which units hold a gradient shard (a reduction since
//   their last zero_grad) and their bytes; each must equal what the update's phase says
//   (StepPhase::g/d.grad_shard) times the estimate's grad_released_bytes.
// - The pre-flight's state count (step_peak over the phases) is both models' persistent
//   state with both released shards for simultaneous + shared D forward and for
//   simultaneous with d_steps 2, and the larger shard only where no phase holds both.
// - Control, computed in the test: the count without phases (gan_state_bytes: the larger
//   shard only) must differ from the shards seen in the real step wherever both are alive;
//   the test fails if it does not (so the real-step check could tell the two counts apart).
// - Pure checks of the description: split placement holds one model, stage 3's shared D
//   forward gathers D whole, R1 gathers D whole, N = 2 and 4 by arithmetic.
#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "float64_gan_reference.h"
#include "shardgan/comm/mpi_communicator.h"
#include "shardgan/sharding/memory_estimate.h"
#include "tiny_biggan.h"
#include "shardgan/train/step_phases.h"

// The gtest files compile together in batches (tests/CMakeLists.txt): this file's names
// live in a namespace of its own.
namespace SHARDGAN_UNITY_ID {

using namespace shardgan;

namespace {

using Gathered = ModelAlive::Gathered;

struct Case {
  bool simultaneous;
  bool shared_d_forward;
  int64_t d_steps;
  int stage;
  std::string name() const {
    return std::string(simultaneous ? "simultaneous" : "alternating") + (shared_d_forward ? "+shared_d_forward" : "") +
           " d_steps " + std::to_string(d_steps) + " stage " + std::to_string(stage);
  }
  PhaseShape shape() const {
    PhaseShape s;
    s.step.simultaneous = simultaneous;
    s.step.shared_d_forward = shared_d_forward;
    s.step.d_steps = d_steps;
    s.step.micro_batches = 2;
    s.g_stage = s.d_stage = stage;
    return s;
  }
  // Whether some phase holds both models' released shards (finding 1's combinations).
  bool both_alive() const { return simultaneous && (shared_d_forward || d_steps > 1); }
};

std::vector<Case> cases() {
  std::vector<Case> out;
  for (int stage : {2, 3}) {
    for (int64_t d_steps : {1, 2}) {
      out.push_back({false, false, d_steps, stage});
      out.push_back({true, false, d_steps, stage});
      out.push_back({true, true, d_steps, stage});
    }
  }
  return out;
}

// The bytes of `m`'s gradient shards allocated now: units with a reduction since their last
// zero_grad (at stages 2-3 the first reduction allocates the shard, zero_grad releases it).
int64_t shard_bytes_now(ShardedModel& m) {
  int64_t b = 0;
  for (auto& u : m.units()) {
    if (u->reduced()) b += u->shard_numel() * static_cast<int64_t>(c10::elementSize(u->master_dtype()));
  }
  return b;
}

ModelMemoryEstimate estimate_of(ShardedModel& m, int stage) {
  ModelMemorySpec s;
  for (auto& u : m.units()) s.unit_numels.push_back(u->numel());
  s.world_size = m.comm().world_size();
  s.stage = stage;
  s.master_bytes = s.compute_bytes = s.reduce_bytes = 8;
  s.optimizer_states = 0;  // plain SGD
  return estimate_model_memory(s);
}

struct Seen {
  int64_t g = 0, d = 0;  // shard bytes allocated at one optimizer update
};

struct RealRun {
  std::vector<Seen> updates;
  ModelMemoryEstimate g, d;
};

// Two steps of `c` on `comm`; records the shards allocated at every optimizer update.
RealRun run_real(MpiCommunicator& comm, const Case& c) {
  const int64_t micro = 2;
  const test_util::StepData data = test_util::make_step_data(2, micro);
  BigGanFamily fam(test_util::tiny_biggan());
  const ShardingConfig sc = test_util::sharding(c.stage);
  auto g = build_sharded_model(fam.generator(comm), comm, sc, 11, at::kDouble);
  auto d = build_sharded_model(fam.discriminator(comm), comm, sc, 12, at::kDouble);
  OptimizerConfig sgd;
  sgd.type = OptimizerType::kSgd;
  sgd.lr = 0.01;
  auto og = make_optimizer(*g, sgd);
  auto od = make_optimizer(*d, sgd);
  DynamicLossScaler sg(LossScalerConfig{}, at::kDouble), sd(LossScalerConfig{}, at::kDouble);
  GanObjective obj("hinge", c.d_steps, micro, 0.0, comm);
  obj.set_simultaneous(c.simultaneous);
  obj.set_shared_d_forward(c.shared_d_forward);
  RealRun r;
  obj.set_before_update([&] { r.updates.push_back({shard_bytes_now(*g), shard_bytes_now(*d)}); });
  const int64_t w = comm.world_size(), per = data.global / micro / w;
  auto gen = at::detail::createCPUGenerator(5);
  int64_t t = 0;
  StepInputs in;
  in.local = [&](const at::Tensor& a, int64_t j) { return a.narrow(0, (j * w + comm.rank()) * per, per); };
  in.real = [&](int64_t j) { return TensorList{in.local(data.x[t], j), in.local(data.y[t], j)}; };
  in.latents = [&] { return TensorList{fam.sample_latents(data.global, gen, at::kDouble), data.y[t]}; };
  for (t = 0; t < 2; ++t) obj.step({g.get(), og.get(), &sg}, {d.get(), od.get(), &sd}, in);
  r.g = estimate_of(*g, c.stage);
  r.d = estimate_of(*d, c.stage);
  return r;
}

// The phases that end in an optimizer update, in order (one per before-update call).
std::vector<StepPhase> update_phases(const PhaseShape& s) {
  std::vector<StepPhase> out;
  for (const StepPhase& p : step_phases(s)) {
    if (p.source.rfind("GanObjective::finish_update", 0) == 0) out.push_back(p);
  }
  return out;
}

TEST(AliveBuffers, PhasesMatchTheShardsOfARealStep) {
  MpiCommunicator comm(MPI_COMM_WORLD, 120.0);
  int control_differs = 0, both_cases = 0;
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name() + " at N = " + std::to_string(comm.world_size()));
    const RealRun real = run_real(comm, c);
    const std::vector<StepPhase> phases = step_phases(c.shape());
    const std::vector<StepPhase> updates = update_phases(c.shape());
    ASSERT_EQ(real.updates.size(), 2 * updates.size()) << describe(phases);  // two steps
    ASSERT_GT(real.g.grad_released_bytes, 0);
    ASSERT_GT(real.d.grad_released_bytes, 0);
    int64_t most_seen = 0;
    for (size_t i = 0; i < real.updates.size(); ++i) {
      const StepPhase& p = updates[i % updates.size()];
      const Seen& s = real.updates[i];
      EXPECT_EQ(s.g, p.g.grad_shard ? real.g.grad_released_bytes : 0) << "G's shards at " << p.name;
      EXPECT_EQ(s.d, p.d.grad_shard ? real.d.grad_released_bytes : 0) << "D's shards at " << p.name;
      most_seen = std::max(most_seen, s.g + s.d);
    }
    // The pre-flight's state: the largest phase, both persistents with the shards it holds.
    const int64_t state = step_peak(phases, real.g, real.d, /*transient=*/false).bytes;
    const int64_t without_shards =
        real.g.persistent_bytes() - real.g.grad_released_bytes + real.d.persistent_bytes() - real.d.grad_released_bytes;
    EXPECT_EQ(state - without_shards, most_seen) << describe(phases);
    const int64_t old_count = gan_state_bytes(real.g, real.d);  // the control: the larger shard only
    if (c.both_alive()) {
      ++both_cases;
      EXPECT_EQ(most_seen, real.g.grad_released_bytes + real.d.grad_released_bytes);
      EXPECT_EQ(state - old_count, std::min(real.g.grad_released_bytes, real.d.grad_released_bytes));
      if (old_count - without_shards != most_seen) ++control_differs;
    } else {
      EXPECT_EQ(state, old_count) << "no phase holds both shards: the two counts agree";
    }
  }
  EXPECT_EQ(both_cases, 6);
  EXPECT_EQ(control_differs, both_cases) << "the old count matched a real step that holds both shards";
}

// The description itself, by arithmetic at N = 2 and 4 (the ranks only divide the shards).
TEST(AliveBuffers, EstimateCountsBothShardsAtN2AndN4) {
  for (int n : {2, 4}) {
    for (int stage : {2, 3}) {
      ModelMemorySpec gs, ds;
      gs.unit_numels = {1000, 30000, 50000, 20000};  // G larger than D
      ds.unit_numels = {800, 24000, 16000};
      gs.world_size = ds.world_size = n;
      gs.stage = ds.stage = stage;
      gs.ema = true;
      const ModelMemoryEstimate g = estimate_model_memory(gs), d = estimate_model_memory(ds);
      for (const Case& c : cases()) {
        if (c.stage != stage) continue;
        SCOPED_TRACE(c.name() + " N = " + std::to_string(n));
        const auto phases = step_phases(c.shape());
        const int64_t state = step_peak(phases, g, d, false).bytes;
        const int64_t both = g.persistent_bytes() + d.persistent_bytes();
        EXPECT_EQ(state, c.both_alive() ? both : gan_state_bytes(g, d));
        if (c.both_alive()) EXPECT_EQ(state - gan_state_bytes(g, d), d.grad_released_bytes);  // D's is smaller
      }
    }
  }
}

TEST(AliveBuffers, SharedDForwardAndR1GatherDWholeAtStage3) {
  Case c{true, true, 1, 3};
  PhaseShape s = c.shape();
  auto phases = step_phases(s);
  ASSERT_FALSE(phases.empty());
  EXPECT_EQ(phases[0].d.gathered, Gathered::kWhole) << describe(phases);
  EXPECT_EQ(phases[0].g.gathered, Gathered::kWindow);
  EXPECT_TRUE(phases[0].g.grad_buffers && phases[0].d.grad_buffers);
  s.g_stage = s.d_stage = 2;  // nothing gathered below stage 3
  for (const StepPhase& p : step_phases(s)) EXPECT_EQ(p.d.gathered, Gathered::kNone) << p.name;
  PhaseShape alt = Case{false, false, 1, 3}.shape();
  EXPECT_EQ(step_phases(alt)[0].d.gathered, Gathered::kWindow);
  alt.r1 = true;
  EXPECT_EQ(step_phases(alt)[0].d.gathered, Gathered::kWhole);
  // The estimate: whole D is every unit's P * compute bytes.
  ModelMemorySpec ds;
  ds.unit_numels = {10, 20, 30, 40, 50};
  ds.world_size = 2;
  const ModelMemoryEstimate d = estimate_model_memory(ds);
  EXPECT_EQ(d.whole_gathered_bytes, (10 + 20 + 30 + 40 + 50) * 4);
  EXPECT_EQ(d.gathered_peak_bytes, (50 + 40 + 30) * 4);
}

// StyleGAN2's separate regularization updates (ModelFamily::separate_regularization): D reg
// and G reg each gather their model whole with its gradients, after D's and G's updates;
// D's main update is then a plain one (R1 is not folded into it).
TEST(AliveBuffers, SeparateRegularizationUpdatesGatherTheirModelWhole) {
  PhaseShape s = Case{false, false, 1, 3}.shape();
  s.r1_update = s.pl_update = true;
  const std::vector<StepPhase> phases = step_phases(s);
  std::vector<std::string> names;
  for (const StepPhase& p : phases) names.push_back(p.name);
  const std::vector<std::string> want = {"D update 1", "D update 1: optimizer step", "D reg (R1)",
                                         "D reg: optimizer step", "G pass", "G update", "G reg (path length)",
                                         "G reg: optimizer step"};
  EXPECT_EQ(names, want) << describe(phases);
  ASSERT_EQ(phases.size(), want.size());
  EXPECT_EQ(phases[0].d.gathered, Gathered::kWindow);
  EXPECT_EQ(phases[2].d.gathered, Gathered::kWhole);
  EXPECT_TRUE(phases[2].d.grad_buffers && phases[2].d.grad_shard);
  EXPECT_EQ(phases[2].g.gathered, Gathered::kNone);
  EXPECT_EQ(phases[6].g.gathered, Gathered::kWhole);
  EXPECT_TRUE(phases[6].g.grad_buffers && phases[6].g.grad_shard);
  EXPECT_EQ(phases[6].d.gathered, Gathered::kNone);
  s.g_stage = s.d_stage = 2;  // nothing gathered below stage 3
  for (const StepPhase& p : step_phases(s)) EXPECT_NE(p.g.gathered, Gathered::kWhole) << p.name;
}

TEST(AliveBuffers, SplitRanksHoldOneModel) {
  for (bool simultaneous : {false, true}) {
    for (int64_t d_steps : {1, 2}) {
      PhaseShape s = Case{simultaneous, simultaneous, d_steps, 3}.shape();
      s.placement = PhaseShape::Placement::kSplitGenerator;
      for (const StepPhase& p : step_phases(s)) EXPECT_FALSE(p.d.held) << p.name;
      s.placement = PhaseShape::Placement::kSplitDiscriminator;
      const auto d_phases = step_phases(s);
      for (const StepPhase& p : d_phases) EXPECT_FALSE(p.g.held) << p.name;
      // D's ranks keep the micro-batches of images received from G's ranks in each D update
      // (d_update's `given`), but not in the shared D forward, which takes them one by one.
      const bool kept = std::any_of(d_phases.begin(), d_phases.end(),
                                    [](const StepPhase& p) { return p.kept_image_micro_batches == 2; });
      EXPECT_EQ(kept, !(simultaneous && d_steps == 1)) << describe(d_phases);
    }
  }
  PhaseShape bad;
  bad.step.d_steps = 0;
  EXPECT_THROW(step_phases(bad), std::invalid_argument);
}

}  // namespace

}  // namespace SHARDGAN_UNITY_ID
