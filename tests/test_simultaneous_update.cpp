// train.update: simultaneous (GanObjective::set_simultaneous; ParaGAN, Shi, Li and You 2024,
// Fig. 5) against a plain-autograd reference of its two equations,
//   G_{t+1} = G_t - lr grad_G L_G(G_t, D_t),   D_{t+1} = D_t - lr grad_D L_D(G_t, D_t),
// under mpirun with 1, 2 and 4 ranks, at ZeRO stages 0 and 3: the tiny conditional BigGAN
// in float64, plain SGD (lr 0.1, so the update is proportional to the gradient), hinge
// loss, 2 micro-batches per update, 5 steps. The reference runs on every rank alone
// (MPI_COMM_SELF, stage 0, every unit as a plain module: ShardedModel::begin_higher_order)
// and shares no code with the objective, the sharding or the optimizer: it computes both
// gradients with torch::autograd::grad over the global micro-batches and subtracts lr x
// gradient by hand. Spectral norm runs paused (PowerIterationPause), so every D forward
// uses the same sigma in both (the objective and the reference run different numbers of
// D forwards). SyncBatchNorm in G makes G's statistics those of the global micro-batch at
// any world size. What differs is the order of float64 additions (per-rank partial sums,
// reductions, micro-batch accumulation): a few ulps per addition over sums of at most a
// few thousand products, so the bound is 1e-9 of the largest parameter change of the
// model over the 5 steps.
// The objective's simultaneous paths are checked: G's pass and D's first update each
// running D on the fakes, one shared D forward (set_shared_d_forward), and that forward
// with the real images joined (set_d_joint_pass).
// With d_steps 2 (ParaGAN's rule with more than one D step) the reference runs G's pass
// against D_t, D's first update on G_t's images of the pass's latents, D's second update on
// G_t's images of a second latent draw and on the step's second real batch, then G's
// update; the objective is checked on each of its three paths above, at stage 3 only (the
// time the case adds). The bound's argument
// is unchanged: twice the D updates, each still a sum of at most a few thousand products,
// so 1e-9 of the largest change still leaves orders of magnitude for the rounding.
// Negative controls (in the test): the simultaneous run against a reference whose G step
// uses D_{t+1}, and the alternating update against the reference, must both leave the
// bound; with d_steps 2, a reference that updates G before D's second step (whose images
// then come from G_{t+1}) must leave it too.
// The reference's G forward runs twice per micro-batch (once with autograd for L_G, once
// under no_grad for D's images): the same values, since G's SyncBatchNorm normalizes with
// the batch statistics in both.
#include <algorithm>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "shardgan/comm/mpi_communicator.h"
#include "shardgan/models/biggan.h"
#include "shardgan/nn/power_iteration.h"
#include "shardgan/train/objective.h"
#include "float64_gan_reference.h"
#include "test_util.h"
#include "tiny_biggan.h"

// The gtest files compile together in batches (tests/CMakeLists.txt): this file's names
// live in a namespace of its own.
namespace SHARDGAN_UNITY_ID {

using namespace shardgan;

namespace {

using test_util::Named;
using Data = test_util::StepData;
constexpr int kSteps = 5;
constexpr int64_t kMicro = 2;
constexpr double kLr = 0.1;
constexpr int64_t kDSteps = 2;        // the d_steps > 1 case
constexpr double kBound = 1e-9;       // float64 summation order (see above)
constexpr double kControlGap = 1e-6;  // what a wrong order must exceed: 1000 x kBound

Data make_data() { return test_util::make_step_data(kSteps, kMicro); }

using Trained = test_util::TrainedParams;

// The objective: data.steps() steps on `comm` at `stage`.
Trained train(MpiCommunicator& comm, int stage, bool simultaneous, const Data& data, bool shared_d_forward = false,
              bool joint = false, int64_t d_steps = 1) {
  return test_util::run_objective(comm, test_util::tiny_biggan(), stage, data, kMicro, kLr, [&] {
    auto obj = std::make_unique<GanObjective>("hinge", d_steps, kMicro, 0.0, comm);
    obj->set_simultaneous(simultaneous);
    obj->set_shared_d_forward(shared_d_forward);
    obj->set_d_joint_pass(joint);
    return obj;
  });
}

// The reference's order of a step, and the negative controls' wrong orders.
enum class Order {
  kParaGan,         // G's gradient against D_t; every D step on images of G_t; G updated last
  kGAgainstNextD,   // control: G's gradient against D after its first update (the same latents)
  kGBeforeLaterD,   // control (d_steps > 1): G updated before D's second step, whose images
                    // then come from G_{t+1}
};

// The reference: the two equations with plain autograd, on this rank alone, with
// `d_steps` D updates per step. Step t draws G's latents first (G's pass, and D's first
// step on G's images of the same latents), then one draw per further D step, as the
// objective's single generator does; D step s trains on the real batch data.batch(t, s).
Trained reference(const Data& data, int64_t d_steps = 1, Order order = Order::kParaGan) {
  test_util::PlainGan p(test_util::tiny_biggan());  // every unit gathered, run as a plain module
  auto &g = p.g, &d = p.d;
  const std::vector<at::Tensor>&gp = p.gp, &dp = p.dp;
  BigGanFamily& fam = p.fam;
  auto gen = at::detail::createCPUGenerator(5);
  const int64_t m = data.global / kMicro;  // one global micro-batch
  const auto add = test_util::accumulate;
  PowerIterationPause paused;
  for (int64_t t = 0; t < data.steps(); ++t) {
    const at::Tensor y = data.y[data.batch(t, 0)];  // the labels G's latents are drawn for
    const at::Tensor z = fam.sample_latents(data.global, gen, at::kDouble);
    std::vector<at::Tensor> g_grad;
    auto g_pass = [&] {  // L_G(G_t, D) with the D of now: G's gradient only
      for (int64_t j = 0; j < kMicro; ++j) {
        const at::Tensor zj = z.narrow(0, j * m, m), yj = y.narrow(0, j * m, m);
        const at::Tensor lg = -d->forward(TensorList{g->forward(TensorList{zj, yj}).at(0), yj}).at(0).mean() / kMicro;
        add(g_grad, torch::autograd::grad({lg}, gp));
      }
    };
    // One D update: L_D on the images the G of now makes of `zs`, and D step s's reals.
    auto d_step = [&](const at::Tensor& zs, int64_t s) {
      const int64_t b = data.batch(t, s);
      std::vector<at::Tensor> d_grad;
      for (int64_t j = 0; j < kMicro; ++j) {
        const at::Tensor zj = zs.narrow(0, j * m, m), yj = y.narrow(0, j * m, m);
        const at::Tensor xj = data.x[b].narrow(0, j * m, m), yr = data.y[b].narrow(0, j * m, m);
        at::Tensor fake;
        {
          torch::NoGradGuard no_grad;
          fake = g->forward(TensorList{zj, yj}).at(0);
        }
        const at::Tensor real_logits = d->forward(TensorList{xj, yr}).at(0);
        const at::Tensor fake_logits = d->forward(TensorList{fake, yj}).at(0);
        const at::Tensor ld = (torch::relu(1.0 - real_logits).mean() + torch::relu(1.0 + fake_logits).mean()) / kMicro;
        add(d_grad, torch::autograd::grad({ld}, dp));
      }
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < dp.size(); ++i) dp[i].sub_(kLr * d_grad[i]);
    };
    auto update_g = [&] {
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < gp.size(); ++i) gp[i].sub_(kLr * g_grad[i]);
    };
    if (order != Order::kGAgainstNextD) g_pass();
    d_step(z, 0);  // D_t -> D_{t+1} (d_steps 1), on G_t's images of G's latents
    if (order == Order::kGAgainstNextD) g_pass();
    if (order == Order::kGBeforeLaterD) update_g();
    for (int64_t s = 1; s < d_steps; ++s) d_step(fam.sample_latents(data.global, gen, at::kDouble), s);
    if (order != Order::kGBeforeLaterD) update_g();
  }
  return p.result();
}

const auto worst = test_util::worst_relative;

class SimultaneousUpdate : public ::testing::TestWithParam<int> {};

TEST_P(SimultaneousUpdate, EqualsThePlainAutogradEquations) {
  MpiCommunicator comm(MPI_COMM_WORLD, 120.0);
  const Data data = make_data();
  const Trained ref = reference(data);
  const Trained sim = train(comm, GetParam(), true, data);
  ASSERT_EQ(sim.g.size(), ref.g.size());
  ASSERT_EQ(sim.d.size(), ref.d.size());
  for (size_t i = 0; i < ref.g_init.size(); ++i) ASSERT_TRUE(torch::equal(ref.g_init[i].second, sim.g_init[i].second));
  const double eg = worst(ref.g_init, ref.g, sim.g), ed = worst(ref.d_init, ref.d, sim.d);
  std::printf("[ simultaneous ] world %d stage %d: max |sim - ref| / largest change: G %.3g, D %.3g\n",
              comm.world_size(), GetParam(), eg, ed);
  EXPECT_LE(eg, kBound);
  EXPECT_LE(ed, kBound);
  // One D forward on the fakes serving L_G's image gradient and D's fake term
  // (set_shared_d_forward, train.shared_d_forward): the same equations.
  const Trained once = train(comm, GetParam(), true, data, true);
  const double og = worst(ref.g_init, ref.g, once.g), od = worst(ref.d_init, ref.d, once.d);
  std::printf("[ simultaneous ] one D forward on the fakes: G %.3g, D %.3g\n", og, od);
  EXPECT_LE(og, kBound);
  EXPECT_LE(od, kBound);
  // The same with the real images joining that forward (set_d_joint_pass): one D forward
  // per micro-batch in all (the tiny BigGAN's D has no batch-coupled layer).
  const Trained joint = train(comm, GetParam(), true, data, true, true);
  const double jg = worst(ref.g_init, ref.g, joint.g), jd = worst(ref.d_init, ref.d, joint.d);
  std::printf("[ simultaneous ] one D forward on fakes and reals: G %.3g, D %.3g\n", jg, jd);
  EXPECT_LE(jg, kBound);
  EXPECT_LE(jd, kBound);
  // Negative control: the same equations with G's gradient taken against D_{t+1} (what
  // the alternating order does) must leave the bound.
  const Trained late = reference(data, 1, Order::kGAgainstNextD);
  const double lg = worst(ref.g_init, late.g, sim.g);
  std::printf("[ simultaneous ] against a reference whose G trains on D_{t+1}: G %.3g\n", lg);
  EXPECT_GT(lg, kControlGap);
  // And the objective's alternating update (G against D_{t+1}, D on another latent draw).
  const Trained alt = train(comm, GetParam(), false, data);
  const double ag = worst(ref.g_init, ref.g, alt.g);
  std::printf("[ simultaneous ] the alternating update against the same reference: G %.3g\n", ag);
  EXPECT_GT(ag, kControlGap);
}

// d_steps 2 (ParaGAN's rule with more than one D step, SharedStepExecutor::step): G's pass
// against D_t, D's first update on the images of that pass, D's second update on G_t's
// images of a second latent draw and the step's second real batch, G's update after both.
// Each path the executor has for it: G's own pass keeping its images, the shared D forward
// making D's first update (D's second is d_update), and that with the real images joined.
// At stage 3 only (the added time stays under 30 s at 4 ranks on 2 cores): there G's
// gradient shards, reduce-scattered at the end of G's pass, must survive both D updates
// until G's update, and both models are gathered unit by unit for every forward.
TEST(SimultaneousTwoDSteps, EqualsThePlainAutogradEquationsAtStage3) {
  constexpr int kStage = 3;
  MpiCommunicator comm(MPI_COMM_WORLD, 120.0);
  const Data data = test_util::make_step_data(kSteps, kMicro, kDSteps);
  const Trained ref = reference(data, kDSteps);
  struct Path {
    const char* name;
    bool shared_d_forward, joint;
  };
  Trained sim;
  for (const Path& p : {Path{"G's pass keeps its images", false, false}, Path{"one D forward on the fakes", true, false},
                        Path{"one D forward on fakes and reals", true, true}}) {
    const Trained run = train(comm, kStage, true, data, p.shared_d_forward, p.joint, kDSteps);
    if (!p.shared_d_forward) sim = run;
    const double eg = worst(ref.g_init, ref.g, run.g), ed = worst(ref.d_init, ref.d, run.d);
    std::printf("[ simultaneous ] d_steps %d, world %d stage %d, %s: max |sim - ref| / largest change: G %.3g, D %.3g\n",
                static_cast<int>(kDSteps), comm.world_size(), kStage, p.name, eg, ed);
    EXPECT_LE(eg, kBound) << p.name;
    EXPECT_LE(ed, kBound) << p.name;
  }
  // Negative control: the reference with G updated before D's second step (so that step's
  // images come from G_{t+1}) must leave the bound, in D from the first step on.
  const Trained early = reference(data, kDSteps, Order::kGBeforeLaterD);
  const double cg = worst(early.g_init, early.g, sim.g), cd = worst(early.d_init, early.d, sim.d);
  std::printf("[ simultaneous ] d_steps %d, against a reference whose D step 2 trains on G_{t+1}: G %.3g, D %.3g\n",
              static_cast<int>(kDSteps), cg, cd);
  EXPECT_GT(cd, kControlGap);
  EXPECT_GT(cg, kControlGap);
}

INSTANTIATE_TEST_SUITE_P(Stages, SimultaneousUpdate, ::testing::Values(0, 3),
                         [](const ::testing::TestParamInfo<int>& i) { return "stage" + std::to_string(i.param); });

}  // namespace

}  // namespace SHARDGAN_UNITY_ID
