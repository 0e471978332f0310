// train.aux_class_weight (GanObjective::set_aux_class_weight; AC-GAN, Odena et al. 2017)
// with BigGAN's model.d_class_head, against a plain-autograd reference of the losses
//   L_D = hinge(D(x)) + hinge(-D(G(z))) + w CE(C(x), y_x)
//   L_G = -D(G(z)) + w CE(C(G(z)), y_z)
// (C: D's class head), under mpirun with 1, 2 and 4 ranks, at ZeRO stages 0 and 3: the
// tiny conditional BigGAN in float64, plain SGD (lr 0.1), 2 micro-batches per update, 5
// steps, w = 0.7. Every path of the objective that computes one of the terms is run: the
// alternating update with separate real and fake passes, with the joint pass and with R1
// on real images (lazy, every 2nd D update); the simultaneous update with G's own pass,
// with one shared D forward on the fakes, and with the real images joining it. The
// reference runs on every rank alone (MPI_COMM_SELF, stage 0, every unit as a plain
// module) and shares no code with the objective, the sharding or the optimizer. Spectral
// norm runs paused so that both use the same sigma. The bound is the float64 one of
// test_simultaneous_update.cpp: 1e-9 of the largest parameter change.
// Negative controls (in the test): the reference without the class terms (w = 0), and the
// reference whose D classifier also trains on G's images (Odena et al.'s L_C), must leave
// the bound.
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
namespace F = torch::nn::functional;
constexpr int kSteps = 5;
constexpr int64_t kMicro = 2;
constexpr double kLr = 0.1;
constexpr double kWeight = 0.7;
constexpr int64_t kR1Every = 2;
constexpr double kR1Gamma = 0.5;

BigGanConfig with_head() {
  BigGanConfig c = test_util::tiny_biggan();
  c.d_class_head = true;
  return c;
}

Data make_data() { return test_util::make_step_data(kSteps, kMicro); }

struct Trained : test_util::TrainedParams {
  double class_real = 0, class_fake = 0;  // the last step's metrics
};

struct Path {
  bool simultaneous = false, shared_d_forward = false, joint = false, r1 = false;
};

// The objective: kSteps steps on `comm` at `stage`.
Trained train(MpiCommunicator& comm, int stage, const Data& data, Path p) {
  Trained r;
  static_cast<test_util::TrainedParams&>(r) = test_util::run_objective(
      comm, with_head(), stage, data, kMicro, kLr,
      [&] {
        auto obj = std::make_unique<GanObjective>("hinge", /*d_steps=*/1, kMicro, 0.0, comm, p.r1 ? kR1Gamma : 0.0,
                                                  kR1Every);
        obj->set_simultaneous(p.simultaneous);
        obj->set_shared_d_forward(p.shared_d_forward);
        obj->set_d_joint_pass(p.joint);
        obj->set_aux_class_weight(kWeight);
        return obj;
      },
      [&](const StepMetrics& m) {
        r.class_real = m.class_real;
        r.class_fake = m.class_fake;
      });
  return r;
}

struct RefOptions {
  bool simultaneous = false, r1 = false;
  double weight = kWeight;
  bool d_classifies_fakes = false;  // negative control: Odena et al.'s L_C on G's images too
};

// The reference on this rank alone. Alternating: D's update on G_t's images of a first
// latent draw, then G's against D_{t+1} on a second draw. Simultaneous: one draw, both
// gradients at (G_t, D_t).
Trained reference(const Data& data, RefOptions o) {
  test_util::PlainGan pg(with_head());
  auto &g = pg.g, &d = pg.d;
  const std::vector<at::Tensor>&gp = pg.gp, &dp = pg.dp;
  BigGanFamily& fam = pg.fam;
  auto gen = at::detail::createCPUGenerator(5);
  const int64_t m = data.global / kMicro;
  const auto add = test_util::accumulate;
  auto apply = [](const std::vector<at::Tensor>& p, const std::vector<at::Tensor>& gr) {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < p.size(); ++i) p[i].sub_(kLr * gr[i]);
  };
  PowerIterationPause paused;
  int64_t d_updates = 0;
  for (int t = 0; t < kSteps; ++t) {
    const at::Tensor y = data.y[t];
    auto g_grad = [&](const at::Tensor& z) {
      std::vector<at::Tensor> acc;
      for (int64_t j = 0; j < kMicro; ++j) {
        const at::Tensor zj = z.narrow(0, j * m, m), yj = y.narrow(0, j * m, m);
        const TensorList out = d->forward(TensorList{g->forward(TensorList{zj, yj}).at(0), yj});
        const at::Tensor lg = -out.at(0).mean() + o.weight * F::cross_entropy(out.at(1), yj);
        add(acc, torch::autograd::grad({lg / kMicro}, gp));
      }
      return acc;
    };
    auto d_grad = [&](const at::Tensor& z) {
      std::vector<at::Tensor> acc;
      const bool r1 = o.r1 && d_updates % kR1Every == 0;
      for (int64_t j = 0; j < kMicro; ++j) {
        const at::Tensor zj = z.narrow(0, j * m, m), yj = y.narrow(0, j * m, m);
        at::Tensor fake;
        {
          torch::NoGradGuard no_grad;
          fake = g->forward(TensorList{zj, yj}).at(0);
        }
        const at::Tensor xj = data.x[t].narrow(0, j * m, m).clone().requires_grad_(r1);
        const TensorList real = d->forward(TensorList{xj, yj});
        const TensorList fk = d->forward(TensorList{fake, yj});
        at::Tensor ld = torch::relu(1.0 - real.at(0)).mean() + torch::relu(1.0 + fk.at(0)).mean() +
                        o.weight * F::cross_entropy(real.at(1), yj);
        if (o.d_classifies_fakes) ld = ld + o.weight * F::cross_entropy(fk.at(1), yj);
        if (r1) {
          const at::Tensor gx = torch::autograd::grad({real.at(0).sum()}, {xj}, {}, true, true)[0];
          ld = ld + gx.pow(2).flatten(1).sum(1).mean() * (0.5 * kR1Gamma * kR1Every);
        }
        add(acc, torch::autograd::grad({ld / kMicro}, dp));
      }
      ++d_updates;
      return acc;
    };
    if (o.simultaneous) {
      const at::Tensor z = fam.sample_latents(data.global, gen, at::kDouble);
      const auto gg = g_grad(z), dg = d_grad(z);
      apply(dp, dg);
      apply(gp, gg);
    } else {
      const at::Tensor zd = fam.sample_latents(data.global, gen, at::kDouble);
      apply(dp, d_grad(zd));
      const at::Tensor zg = fam.sample_latents(data.global, gen, at::kDouble);
      apply(gp, g_grad(zg));
    }
  }
  Trained r;
  static_cast<test_util::TrainedParams&>(r) = pg.result();
  return r;
}

const auto worst = test_util::worst_relative;

void expect_match(const char* what, const Trained& ref, const Trained& got) {
  ASSERT_EQ(got.g.size(), ref.g.size());
  ASSERT_EQ(got.d.size(), ref.d.size());
  const double eg = worst(ref.g_init, ref.g, got.g), ed = worst(ref.d_init, ref.d, got.d);
  std::printf("[ aux class ] %s: max |objective - reference| / largest change: G %.3g, D %.3g\n", what, eg, ed);
  EXPECT_LE(eg, 1e-9) << what;
  EXPECT_LE(ed, 1e-9) << what;
  // The metrics: cross-entropies of a 3-class head near its start, finite and positive.
  EXPECT_TRUE(std::isfinite(got.class_real) && got.class_real > 0) << what;
  EXPECT_TRUE(std::isfinite(got.class_fake) && got.class_fake > 0) << what;
}

class AuxClass : public ::testing::TestWithParam<int> {};

TEST_P(AuxClass, EqualsThePlainAutogradLosses) {
  MpiCommunicator comm(MPI_COMM_WORLD, 120.0);
  const Data data = make_data();
  const int stage = GetParam();
  const Trained alt_ref = reference(data, {});
  expect_match("alternating, separate passes", alt_ref, train(comm, stage, data, {}));
  expect_match("alternating, joint pass", alt_ref, train(comm, stage, data, {false, false, true, false}));
  const Trained sim_ref = reference(data, {true});
  const Trained sim = train(comm, stage, data, {true});
  expect_match("simultaneous, G's own pass", sim_ref, sim);
  expect_match("simultaneous, shared D forward", sim_ref, train(comm, stage, data, {true, true}));
  expect_match("simultaneous, shared D forward with the reals", sim_ref, train(comm, stage, data, {true, true, true}));
  RefOptions r1;
  r1.r1 = true;
  expect_match("alternating with R1", reference(data, r1), train(comm, stage, data, {false, false, false, true}));

  // Negative controls: without the class terms, or with D's classifier trained on G's
  // images as well, the reference leaves the bound.
  RefOptions off;
  off.simultaneous = true;
  off.weight = 0;
  const Trained plain = reference(data, off);
  const double pg = worst(sim_ref.g_init, plain.g, sim.g), pd = worst(sim_ref.d_init, plain.d, sim.d);
  std::printf("[ aux class ] against a reference without the class terms: G %.3g, D %.3g\n", pg, pd);
  EXPECT_GT(pg, 1e-6);
  EXPECT_GT(pd, 1e-6);
  RefOptions both;
  both.simultaneous = true;
  both.d_classifies_fakes = true;
  const double bd = worst(sim_ref.d_init, reference(data, both).d, sim.d);
  std::printf("[ aux class ] against a reference whose D also classifies G's images: D %.3g\n", bd);
  EXPECT_GT(bd, 1e-6);
}

TEST(AuxClassRefusals, NeedsClassLogitsAndSharedPlacement) {
  MpiCommunicator comm(MPI_COMM_WORLD, 120.0);
  GanObjective obj("hinge", 1, 1, 0.0, comm);
  EXPECT_THROW(obj.set_aux_class_weight(-1), std::invalid_argument);
  obj.set_aux_class_weight(1.0);
  EXPECT_THROW(obj.set_paired(true, 100.0), std::invalid_argument);
  // A D without the head: the first step names the key.
  BigGanFamily fam(test_util::tiny_biggan());
  auto g = build_sharded_model(fam.generator(comm), comm, test_util::sharding(0), 11, at::kDouble);
  auto d = build_sharded_model(fam.discriminator(comm), comm, test_util::sharding(0), 12, at::kDouble);
  OptimizerConfig sgd;
  sgd.type = OptimizerType::kSgd;
  auto og = make_optimizer(*g, sgd);
  auto od = make_optimizer(*d, sgd);
  DynamicLossScaler sg(LossScalerConfig{}, at::kDouble), sd(LossScalerConfig{}, at::kDouble);
  const int64_t n = 4 * comm.world_size();
  auto gen = at::detail::createCPUGenerator(5);
  const at::Tensor x = torch::zeros({n, 1, 32, 32}, torch::kDouble), y = torch::zeros({n}, torch::kLong);
  StepInputs in;
  in.local = [&](const at::Tensor& a, int64_t) { return a.narrow(0, comm.rank() * 4, 4); };
  in.real = [&](int64_t j) { return TensorList{in.local(x, j), in.local(y, j)}; };
  in.latents = [&] { return TensorList{fam.sample_latents(n, gen, at::kDouble), y}; };
  try {
    obj.step({g.get(), og.get(), &sg}, {d.get(), od.get(), &sd}, in);
    ADD_FAILURE() << "a D without class logits trained with the class loss";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("model.d_class_head"), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, AuxClass, ::testing::Values(0, 3),
                         [](const ::testing::TestParamInfo<int>& i) { return "stage" + std::to_string(i.param); });

}  // namespace

}  // namespace SHARDGAN_UNITY_ID
