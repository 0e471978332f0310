// train.d_joint_pass (GanObjective::set_d_joint_pass): D sees cat([fake, real]) in one forward
// and one backward per micro-batch, as BigGAN-PyTorch's G_D does, instead of a real and a
// fake pass with a backward each. Under mpirun with 1 and 2 ranks, at ZeRO stages 3 and 0:
//  - One training step (one D update over 2 micro-batches, then the G update) in float64
//    with plain SGD equals the one with separate passes. The step runs under a
//    PowerIterationPause, so that every SN layer's sigma comes from the same stored u in
//    every pass (unpaused, the separate fake pass computes sigma one power iteration further
//    than the real pass, which the joint pass shares: a real difference of about 1e-8 here,
//    which is what BigGAN-PyTorch computes). The loss is then the same function of the
//    parameters in both modes. What differs is the order of float64 additions: the gradient of a parameter is summed as g_fake + g_real
//    by autograd instead of in two reductions, and the batch of 2B goes through each layer
//    in one call. Each is a relative error of a few ulps (2^-52) per addition; a parameter's
//    gradient is a sum over at most 4096 products here, so the bound is 1e-9 of the largest
//    update (lr x gradient) of the model, far above 4096 x 2^-52 = 1e-12 and far below
//    any real difference (the negative control below). SGD makes the update proportional
//    to the gradient, which Adam's first step (about lr x sign(g)) would hide.
//  - The collectives: per micro-batch the joint pass gathers each D unit 2 times instead of
//    4 and reduce-scatters it once instead of twice (stage 3).
//  - Unpaused, every SN layer of D advances u once per D micro-batch in both modes.
//  - A micro-batch whose D update takes R1 keeps the separate passes (the penalty ran).
// Negative control, run once by hand: the joint pass with the fake half's loss left out of
// its backward fails the parameter check of D and G (by up to a quarter of the largest
// update; the bound is 1e-9).
#include <algorithm>
#include <optional>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "models/biggan/layers.h"
#include "shardgan/comm/mpi_communicator.h"
#include "shardgan/models/biggan.h"
#include "shardgan/nn/power_iteration.h"
#include "shardgan/optim/factory.h"
#include "shardgan/optim/loss_scaler.h"
#include "shardgan/train/objective.h"
#include "test_util.h"
#include "tiny_biggan.h"

// The gtest files compile together in batches (tests/CMakeLists.txt): this file's names
// live in a namespace of its own.
namespace SHARDGAN_UNITY_ID {

using namespace shardgan;

namespace {

using Named = std::vector<std::pair<std::string, at::Tensor>>;

struct Result {
  StepMetrics step;
  Named g_params, d_params, g_init, d_init;
  int64_t gathers = 0, reduce_scatters = 0;
  int64_t d_units = 0;
  std::vector<int64_t> d_sn_advances;
};

Result train(MpiCommunicator& comm, int stage, bool joint, double r1_gamma, bool pause = true) {
  BigGanFamily fam(test_util::tiny_biggan());
  ShardingConfig sc = test_util::sharding(stage);
  auto g = build_sharded_model(fam.generator(comm), comm, sc, 11, at::kDouble);
  auto d = build_sharded_model(fam.discriminator(comm), comm, sc, 12, at::kDouble);
  OptimizerConfig sgd;
  sgd.type = OptimizerType::kSgd;
  sgd.lr = 0.1;
  auto og = make_optimizer(*g, sgd);
  auto od = make_optimizer(*d, sgd);
  DynamicLossScaler sg(LossScalerConfig{}, at::kDouble), sd(LossScalerConfig{}, at::kDouble);
  const int64_t micro = 2, global = 4 * comm.world_size() * micro;
  GanObjective obj("hinge", /*d_steps=*/1, micro, 0.0, comm, r1_gamma, /*r1_every=*/1);
  obj.set_d_joint_pass(joint);
  torch::manual_seed(3);
  const at::Tensor x = torch::randn({global, 1, 32, 32}, torch::kDouble).tanh();
  const at::Tensor y = torch::randint(0, 3, {global}, torch::kLong);
  const int64_t per = global / micro / comm.world_size();
  auto gen = at::detail::createCPUGenerator(5);
  StepInputs in;
  in.local = [&](const at::Tensor& t, int64_t j) { return t.narrow(0, (j * comm.world_size() + comm.rank()) * per, per); };
  in.real = [&](int64_t j) { return TensorList{in.local(x, j), in.local(y, j)}; };
  in.latents = [&] { return TensorList{fam.sample_latents(global, gen, at::kDouble), y}; };
  Result r;
  r.g_init = g->gather_full_parameters();
  r.d_init = d->gather_full_parameters();
  comm.reset_stats();
  {
    std::optional<PowerIterationPause> paused;
    if (pause) paused.emplace();
    r.step = obj.step({g.get(), og.get(), &sg}, {d.get(), od.get(), &sd}, in);
  }
  r.d_sn_advances = test_util::sn_advances(*d);
  r.gathers = comm.stats().all_gather_calls;
  r.reduce_scatters = comm.stats().reduce_scatter_calls;
  r.g_params = g->gather_full_parameters();
  r.d_params = d->gather_full_parameters();
  r.d_units = static_cast<int64_t>(d->units().size());
  return r;
}

// Every parameter's update under `joint` against `separate`, within 1e-9 of the largest
// update of the model (header).
void expect_same_updates(const Named& init, const Named& separate, const Named& joint, const std::string& what) {
  ASSERT_EQ(separate.size(), joint.size());
  double largest = 0;
  for (size_t i = 0; i < init.size(); ++i) largest = std::max(largest, (separate[i].second - init[i].second).abs().max().item<double>());
  ASSERT_GT(largest, 0.0) << what << ": nothing was updated";
  for (size_t i = 0; i < init.size(); ++i) {
    const double diff = (joint[i].second - separate[i].second).abs().max().item<double>();
    EXPECT_LE(diff, 1e-9 * largest) << what << " " << separate[i].first << ": " << diff / largest
                                    << " of the largest update";
  }
}

class DJointPass : public ::testing::TestWithParam<int> {};

TEST_P(DJointPass, EqualsSeparatePassesAndHalvesDsCollectives) {
  MpiCommunicator comm(MPI_COMM_WORLD, 120.0);
  const int stage = GetParam();
  const Result sep = train(comm, stage, false, 0.0), joint = train(comm, stage, true, 0.0);
  EXPECT_NEAR(joint.step.loss_d, sep.step.loss_d, 1e-9 * std::abs(sep.step.loss_d));
  EXPECT_NEAR(joint.step.loss_g, sep.step.loss_g, 1e-9 * std::abs(sep.step.loss_g));
  EXPECT_NEAR(joint.step.d_real, sep.step.d_real, 1e-9);
  EXPECT_NEAR(joint.step.d_fake, sep.step.d_fake, 1e-9);
  expect_same_updates(sep.d_init, sep.d_params, joint.d_params, "D");
  expect_same_updates(sep.g_init, sep.g_params, joint.g_params, "G");
  if (stage == 3) {
    const int64_t micro = 2;
    EXPECT_EQ(sep.gathers - joint.gathers, micro * 2 * joint.d_units) << "D all-gathers saved";
    EXPECT_EQ(sep.reduce_scatters - joint.reduce_scatters, micro * joint.d_units) << "D reduce-scatters saved";
  }
}

TEST_P(DJointPass, PowerIterationAdvancesOncePerMicroBatchInBothModes) {
  MpiCommunicator comm(MPI_COMM_WORLD, 120.0);
  const Result sep = train(comm, GetParam(), false, 0.0, false), joint = train(comm, GetParam(), true, 0.0, false);
  ASSERT_FALSE(joint.d_sn_advances.empty());
  EXPECT_EQ(joint.d_sn_advances, sep.d_sn_advances);
  // 2 D micro-batches, then the G step's 2 forwards of the frozen D (one per micro-batch).
  for (int64_t a : joint.d_sn_advances) EXPECT_EQ(a, 4);
}

TEST_P(DJointPass, R1UpdatesKeepTheSeparatePasses) {
  MpiCommunicator comm(MPI_COMM_WORLD, 120.0);
  const Result joint = train(comm, GetParam(), true, 1.0), sep = train(comm, GetParam(), false, 1.0);
  EXPECT_GT(joint.step.r1, 0.0) << "the R1 pass ran";
  EXPECT_EQ(joint.step.r1, sep.step.r1);
  EXPECT_EQ(joint.step.loss_d, sep.step.loss_d);
  EXPECT_EQ(joint.gathers, sep.gathers);
}

INSTANTIATE_TEST_SUITE_P(Stages, DJointPass, ::testing::Values(3, 0),
                         [](const ::testing::TestParamInfo<int>& i) { return "stage" + std::to_string(i.param); });

}  // namespace

}  // namespace SHARDGAN_UNITY_ID
