// Activation checkpointing (issue 21; include/shardgan/sharding/activation_checkpoint.h):
// whole GAN training steps with sharding.<model>.activation_checkpointing on equal the same
// steps with it off, bit for bit, under mpirun with 1 and 2 ranks:
//  - BigGAN (spectral norm in G and D, SyncBatchNorm with running statistics in G's
//    class-conditional BN, self-attention), d_steps 2, 2 micro-batches, the frozen D of the
//    G step, and R1 on every other D update (its double-backward pass runs unchecked, the
//    other D passes of the same step are checkpointed);
//  - DCGAN (SyncBatchNorm in G and D, whose running statistics D updates on real and fake);
//  - at ZeRO stages 0, 2 and 3, and at stage 3 with reshard_after_forward off;
//  - BigGAN with checkpoint segments (checkpoint_segments: its blocks' residual and shortcut
//    paths nest inside the unit's replay), at stages 3 and 0, with and without R1;
//  - BigGAN with model.fused_upsample and model.channels_last (the transposed convolution
//    of the fused up-blocks in the replay), with segments and R1, at stage 3.
// Checked exactly (no tolerance: the replay runs the same kernels on the same values in the
// same order, so any difference is a bug): every step's losses and R1 term, every parameter
// of G and D, every buffer (running statistics, spectral norm's u) and the number of power
// iterations each SN layer ran. The number of replays must equal the number of unit
// forwards that had a backward: d_steps * micro * (2 * |D|) + micro * (|G| + |D|) per step
// without R1.
// Negative controls, each run once by hand at 2 ranks: without the replay's buffer restore,
// all 7 cases fail (DCGAN's running statistics; BigGAN's u, which the replay then advances
// from the updated value, so sigma and the gradients change too); with spectral norm
// ignoring recomputing_activations(), the 5 BigGAN cases fail on the power-iteration counts.
// Without the buffer restore in a segment's replay (no scope modules), the 3 segment cases
// fail (G's parameters differ by up to 1.6e-4 after 3 steps).
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "models/biggan/layers.h"
#include "shardgan/comm/mpi_communicator.h"
#include "shardgan/models/biggan.h"
#include "shardgan/models/dcgan.h"
#include "shardgan/optim/factory.h"
#include "shardgan/optim/loss_scaler.h"
#include "shardgan/sharding/activation_checkpoint.h"
#include "shardgan/sharding/deferred.h"
#include "shardgan/train/objective.h"
#include "test_util.h"
#include "tiny_biggan.h"

// The gtest files compile together in batches (tests/CMakeLists.txt): this file's names
// live in a namespace of its own.
namespace SHARDGAN_UNITY_ID {

using namespace shardgan;

namespace {

using Named = std::vector<std::pair<std::string, at::Tensor>>;

struct Case {
  std::string arch;  // "biggan" or "dcgan"
  int stage;
  bool reshard_after_forward;
  double r1_gamma;
  bool segments = false;  // ShardingConfig::checkpoint_segments with checkpointing on
  bool fused = false;     // BigGAN with model.fused_upsample and model.channels_last
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.arch << " stage " << c.stage << " reshard_after_forward " << c.reshard_after_forward << " r1 " << c.r1_gamma
      << " segments " << c.segments << " fused " << c.fused;
}

struct Result {
  std::vector<StepMetrics> steps;
  Named g_params, d_params, g_buffers, d_buffers;
  std::vector<int64_t> sn_advances;
  int64_t recomputes = 0;
  int64_t g_units = 0, d_units = 0;
};

std::unique_ptr<ModelFamily> family(const Case& c) {
  if (c.arch == "biggan") {
    BigGanConfig b = test_util::tiny_biggan();
    b.fused_upsample = b.channels_last = c.fused;
    return std::make_unique<BigGanFamily>(b);
  }
  DcganConfig d;
  d.z_dim = 8;
  d.g_width = 4;
  d.d_width = 4;
  return make_dcgan_family(d);
}

Named copy(const Named& in) {
  Named out;
  for (auto& [k, v] : in) out.emplace_back(k, v.clone());
  return out;
}

Result train(Communicator& comm, const Case& c, bool checkpointing) {
  auto fam = family(c);
  ShardingConfig sc = test_util::sharding(c.stage);
  sc.reshard_after_forward = c.reshard_after_forward;
  sc.activation_checkpointing = checkpointing;
  sc.checkpoint_segments = checkpointing && c.segments;
  auto g = build_sharded_model(fam->generator(comm), comm, sc, 11, at::kFloat);
  auto d = build_sharded_model(fam->discriminator(comm), comm, sc, 12, at::kFloat);
  auto og = make_optimizer(*g, OptimizerConfig::biggan_generator());
  auto od = make_optimizer(*d, OptimizerConfig::biggan_discriminator());
  DynamicLossScaler sg(LossScalerConfig{}, at::kFloat), sd(LossScalerConfig{}, at::kFloat);
  const int64_t d_steps = 2, micro = 2, global = 4 * comm.world_size() * micro;
  GanObjective obj("hinge", d_steps, micro, 0.0, comm, c.r1_gamma, /*r1_every=*/2);
  torch::manual_seed(3);
  const at::Tensor x = torch::randn({global, 1, 32, 32}).tanh();
  const at::Tensor y = torch::randint(0, 3, {global}, torch::kLong);
  const int64_t per = global / micro / comm.world_size();
  auto gen = at::detail::createCPUGenerator(5);
  StepInputs in;
  in.local = [&](const at::Tensor& t, int64_t j) { return t.narrow(0, (j * comm.world_size() + comm.rank()) * per, per); };
  const bool conditional = fam->num_classes() > 0;
  in.real = [&](int64_t j) {
    return TensorList{in.local(x, j), conditional ? in.local(y, j) : at::Tensor()};
  };
  in.latents = [&] {
    at::Tensor z = fam->sample_latents(global, gen, at::kFloat);
    return TensorList{z, conditional ? y : at::Tensor()};
  };
  Result r;
  const int64_t before = activation_recomputes();
  for (int step = 0; step < 3; ++step) r.steps.push_back(obj.step({g.get(), og.get(), &sg}, {d.get(), od.get(), &sd}, in));
  r.recomputes = activation_recomputes() - before;
  r.g_params = g->gather_full_parameters();
  r.d_params = d->gather_full_parameters();
  r.g_buffers = copy(g->named_buffers());
  r.d_buffers = copy(d->named_buffers());
  r.sn_advances = test_util::sn_advances(*g);
  for (int64_t a : test_util::sn_advances(*d)) r.sn_advances.push_back(a);
  r.g_units = static_cast<int64_t>(g->units().size());
  r.d_units = static_cast<int64_t>(d->units().size());
  return r;
}

void expect_equal(const Named& a, const Named& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_TRUE(torch::equal(a[i].second, b[i].second))
        << what << " " << a[i].first << " differs: max |diff| "
        << (a[i].second - b[i].second).abs().max().item<double>();
  }
}

class ActivationCheckpointing : public ::testing::TestWithParam<Case> {};

TEST_P(ActivationCheckpointing, BitIdenticalToUncheckpointedTraining) {
  MpiCommunicator comm(MPI_COMM_WORLD, 120.0);
  const Case c = GetParam();
  const Result off = train(comm, c, false), on = train(comm, c, true);
  ASSERT_EQ(off.steps.size(), on.steps.size());
  for (size_t s = 0; s < on.steps.size(); ++s) {
    EXPECT_EQ(off.steps[s].loss_d, on.steps[s].loss_d) << "step " << s;
    EXPECT_EQ(off.steps[s].loss_g, on.steps[s].loss_g) << "step " << s;
    EXPECT_EQ(off.steps[s].r1, on.steps[s].r1) << "step " << s;
  }
  if (c.r1_gamma > 0) {
    EXPECT_GT(on.steps[0].r1, 0.0) << "the R1 pass ran";
  }
  expect_equal(on.g_params, off.g_params, "G parameter");
  expect_equal(on.d_params, off.d_params, "D parameter");
  expect_equal(on.g_buffers, off.g_buffers, "G buffer");
  expect_equal(on.d_buffers, off.d_buffers, "D buffer");
  EXPECT_EQ(on.sn_advances, off.sn_advances) << "power iterations per SN layer";
  EXPECT_EQ(off.recomputes, 0);
  const int64_t d_steps = 2, micro = 2, steps = 3;
  const int64_t unit_replays = steps * (d_steps * micro * 2 * on.d_units + micro * (on.g_units + on.d_units));
  if (c.segments) {
    EXPECT_GT(on.recomputes, unit_replays) << "segments replayed inside the units' replays";
  } else if (c.r1_gamma == 0) {
    EXPECT_EQ(on.recomputes, unit_replays);
  } else {
    EXPECT_GT(on.recomputes, 0);
  }
  if (comm.rank() == 0) {
    std::printf("%s stage %d reshard %d r1 %g segments %d: %lld unit and segment forwards replayed in 3 steps\n",
                c.arch.c_str(), c.stage, c.reshard_after_forward ? 1 : 0, c.r1_gamma, c.segments ? 1 : 0,
                static_cast<long long>(on.recomputes));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Models, ActivationCheckpointing,
    ::testing::Values(Case{"biggan", 3, true, 1.0}, Case{"biggan", 3, true, 0.0}, Case{"biggan", 3, false, 1.0},
                      Case{"biggan", 0, true, 1.0}, Case{"biggan", 2, true, 0.0}, Case{"dcgan", 3, true, 0.0},
                      Case{"dcgan", 0, true, 0.0}, Case{"biggan", 3, true, 1.0, true},
                      Case{"biggan", 3, true, 0.0, true}, Case{"biggan", 0, true, 0.0, true},
                      Case{"biggan", 3, true, 1.0, true, true}),
    [](const ::testing::TestParamInfo<Case>& i) {
      return i.param.arch + "_stage" + std::to_string(i.param.stage) + (i.param.reshard_after_forward ? "" : "_keep") +
             (i.param.r1_gamma > 0 ? "_r1" : "") + (i.param.segments ? "_segments" : "") +
             (i.param.fused ? "_fused_upsample" : "");
    });

// A double backward through a checkpointed unit outside begin_higher_order() is refused with
// a message that says what to do; inside it, the unit is not checkpointed and the penalty's
// gradient equals the one without checkpointing. Negative control, run once: without the
// refusal, autograd still throws later, with a c10::Error that does not name
// begin_higher_order, and this test fails.
TEST(ActivationCheckpointingHigherOrder, RefusedOutsideAndExactInside) {
  MpiCommunicator comm(MPI_COMM_WORLD, 60.0);
  auto run = [&](bool checkpointing, bool higher_order) {
    torch::manual_seed(7);
    auto lin = torch::nn::Linear(4, 3);
    lin->to(at::kDouble);
    ShardingConfig sc = test_util::sharding(3);
    sc.activation_checkpointing = checkpointing;
    ShardedModel m("d", comm, sc);
    m.add_unit("lin", lin.ptr(), [lin](const at::Tensor& x) mutable { return torch::tanh(lin->forward(x)); });
    at::Tensor x = torch::randn({5, 4}, torch::kDouble).requires_grad_(true);
    if (higher_order) m.begin_higher_order();
    at::Tensor y = m.forward(x);
    at::Tensor gx = torch::autograd::grad({y.sum()}, {x}, {}, true, true)[0];
    gx.pow(2).sum().backward();
    if (higher_order) m.end_higher_order();
    return m.unit("lin").grad_shard().clone();
  };
  EXPECT_THROW(
      {
        try {
          run(true, false);
        } catch (const c10::Error& e) {
          EXPECT_NE(std::string(e.what()).find("begin_higher_order"), std::string::npos) << e.what();
          throw;
        }
      },
      c10::Error);
  EXPECT_TRUE(torch::equal(run(true, true), run(false, true)));
}

using Storage = c10::weak_intrusive_ptr<c10::StorageImpl>;

// What a hook inside a checkpointed backward found: how many times it ran, and how many of
// those times a tensor that should have been freed by then was still allocated.
struct HookCount {
  int runs = 0;
  int alive = 0;
};

// One unit, y = 2 * lin(x) (addmm saves x and the weight, not its output h; the product with
// a scalar saves nothing, and is the first node of the unit's backward), at stage 3 with
// checkpointing on or off, differentiated once from (y^2).sum() in float64. In the
// checkpointed replay, a hook on h's gradient, which runs after y's node, checks whether a
// storage is freed by then and counts in `count`. The storage is the replayed y's, or with
// `watch_incoming` the gradient arriving at the unit (recorded by a hook on the model's
// output). Returns the unit's gradient shard and x's gradient.
std::pair<at::Tensor, at::Tensor> hooked_unit_backward(bool checkpointing, HookCount* count, bool watch_incoming) {
  MpiCommunicator comm(MPI_COMM_WORLD, 60.0);
  torch::manual_seed(7);
  auto lin = torch::nn::Linear(64, 256);
  lin->to(at::kDouble);
  ShardingConfig sc = test_util::sharding(3);
  sc.activation_checkpointing = checkpointing;
  ShardedModel m("g", comm, sc);
  auto incoming = std::make_shared<std::optional<Storage>>();  // recorded by the output's hook
  m.add_unit("lin", lin.ptr(), [lin, count, incoming, watch_incoming](const at::Tensor& x) mutable {
    at::Tensor h = lin->forward(x);
    at::Tensor y = h * 2.0;
    if (recomputing_activations() && at::GradMode::is_enabled()) {
      const std::optional<Storage> replayed = y.storage().getWeakStorageImpl();
      h.register_hook([count, incoming, replayed, watch_incoming](const at::Tensor& g) {
        ++count->runs;
        const std::optional<Storage>& w = watch_incoming ? *incoming : replayed;
        if (!w.has_value() || !w->expired()) ++count->alive;  // an unrecorded storage counts as alive
        return g;
      });
    }
    return y;
  });
  at::Tensor x = torch::randn({8, 64}, torch::kDouble).requires_grad_(true);
  at::Tensor out = m.forward(x);
  out.register_hook([incoming](const at::Tensor& g) {
    incoming->emplace(g.storage().getWeakStorageImpl());
    return g;
  });
  out.pow(2).sum().backward();
  return std::make_pair(m.unit("lin").grad_shard().clone(), x.grad().clone());
}

// A checkpointed unit's backward differentiates its replayed graph from the outputs'
// gradient edges, so the replayed outputs' data, which no node saved, is freed before that
// backward runs (one output-sized buffer less at the peak). Checked from inside the
// backward: the hook on the replay's hidden tensor runs after the output's node, when the
// output's storage must already be gone. The gradients equal the uncheckpointed ones.
// Negative control, run once: with torch::autograd::grad on the output tensors (the
// earlier code), the storage is still alive in the hook and this test fails.
TEST(ActivationCheckpointingMemory, ReplayedOutputIsFreedBeforeItsBackward) {
  HookCount count;
  const auto on = hooked_unit_backward(true, &count, /*watch_incoming=*/false);
  const auto off = hooked_unit_backward(false, &count, /*watch_incoming=*/false);
  EXPECT_EQ(count.runs, 1) << "the replay's backward ran once, through the hook";
  EXPECT_EQ(count.alive, 0) << "the replayed output was still allocated while its graph was differentiated";
  EXPECT_TRUE(torch::equal(on.first, off.first));
  EXPECT_TRUE(torch::equal(on.second, off.second));
}

// The gradient arriving at a checkpointed unit is freed once the replayed graph's first node
// has used it, not held until the unit's whole backward ends (one output-sized buffer less
// through the rest of it; in BigGAN's 64x64 block, through the replay and backward of its
// second convolution). Checked from inside the backward: the model's output records a weak
// reference to its gradient, and the hook on the replay's hidden tensor, whose gradient the
// first node makes from it, finds it gone. Negative control, run once: without the release
// (the checkpoint holding the gradient for its whole backward), the test fails.
TEST(ActivationCheckpointingMemory, IncomingGradientIsFreedOnceUsed) {
  HookCount count;
  const auto on = hooked_unit_backward(true, &count, /*watch_incoming=*/true);
  const auto off = hooked_unit_backward(false, &count, /*watch_incoming=*/true);
  EXPECT_EQ(count.runs, 1) << "the replay's backward ran once, through the hook";
  EXPECT_EQ(count.alive, 0) << "the unit's incoming gradient was still allocated after the replay's first node used it";
  EXPECT_TRUE(torch::equal(on.first, off.first));
  EXPECT_TRUE(torch::equal(on.second, off.second));
}

}  // namespace

}  // namespace SHARDGAN_UNITY_ID
