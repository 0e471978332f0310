// BigGAN models (include/shardgan/models/biggan.h): G and D built through the sharding
// layer in float32, float64 and bfloat16 compute, stage 3 against stage 0, parameter counts
// (a configuration past 1e9 parameters, checked against a closed formula), and config
// errors naming their keys. Runs under mpirun with 1 and 2 ranks.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "shardgan/comm/mpi_communicator.h"
#include "shardgan/models/biggan.h"
#include "models/biggan/layers.h"
#include "shardgan/optim/factory.h"
#include "shardgan/optim/loss_scaler.h"
#include "shardgan/sharding/deferred.h"
#include "shardgan/train/objective.h"
#include "test_util.h"
#include "tiny_biggan.h"

// The gtest files compile together in batches (tests/CMakeLists.txt): this file's names
// live in a namespace of its own.
namespace SHARDGAN_UNITY_ID {

using namespace shardgan;

namespace {

const at::ScalarType kDtypes[] = {at::kFloat, at::kDouble, at::kBFloat16};

// ---- Models through the sharding layer ----

// tiny_biggan.h's model (G 16, 16, 16, 8 channels at 4, 8, 16, 32; D 8, 16, 16, 16 at 16,
// 8, 4, 4; z_dim 8 in 4 chunks of 2) with one extra block per resolution.
BigGanConfig tiny_config(int64_t channels) {
  BigGanConfig c = test_util::tiny_biggan();
  c.g_blocks_per_res = 1;
  c.d_blocks_per_res = 1;
  c.channels = channels;
  return c;
}

std::vector<std::string> unit_names(ShardedModel& m) {
  std::vector<std::string> names;
  for (auto& u : m.units()) names.push_back(u->name());
  return names;
}

TEST(BigGanModel, ShapesDtypesAndBackwardThroughShardedModel) {
  MpiCommunicator comm(MPI_COMM_WORLD, 60.0);
  for (int64_t channels : {1, 3}) {
    BigGanFamily fam(tiny_config(channels));
    const ImageShape shape = fam.image_shape();
    EXPECT_EQ(shape.channels, channels);
    EXPECT_EQ(shape.height, 32);
    EXPECT_EQ(shape.width, 32);
    for (auto dt : kDtypes) {
      ShardingConfig cfg = test_util::sharding(0);
      const at::ScalarType master = dt == at::kDouble ? at::kDouble : at::kFloat;
      if (dt == at::kBFloat16) cfg.compute_dtype = at::kBFloat16;
      auto g = build_sharded_model(fam.generator(comm), comm, cfg, 11, master);
      auto d = build_sharded_model(fam.discriminator(comm), comm, cfg, 12, master);
      EXPECT_EQ(unit_names(*g), (std::vector<std::string>{"shared", "linear", "block0", "block1",
                                                         "block2", "block3", "attn", "block4",
                                                         "block5", "out"}));
      EXPECT_EQ(unit_names(*d), (std::vector<std::string>{"block0", "block1", "attn", "block2",
                                                         "block3", "block4", "block5", "block6",
                                                         "block7", "out"}));
      at::Generator gen = at::detail::createCPUGenerator(5 + comm.rank());
      at::Tensor z = fam.sample_latents(4, gen, master);
      at::Tensor y = fam.sample_labels(4, gen);
      EXPECT_EQ(z.sizes(), (std::vector<int64_t>{4, 8}));
      at::Tensor img = g->forward(TensorList{z, y})[0];
      EXPECT_EQ(img.sizes(), (std::vector<int64_t>{4, channels, 32, 32}));
      EXPECT_EQ(img.scalar_type(), dt);
      EXPECT_TRUE(torch::isfinite(img).all().item<bool>()) << dt;
      EXPECT_LE(img.abs().max().item<double>(), 1.0);
      at::Tensor logits = d->forward(TensorList{img, y})[0];
      EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{4}));
      EXPECT_TRUE(torch::isfinite(logits).all().item<bool>()) << dt;
      logits.mean().backward();
      for (ShardedModel* m : {g.get(), d.get()}) {
        for (auto& u : m->units()) {
          EXPECT_TRUE(torch::isfinite(u->grad_shard()).all().item<bool>()) << u->name() << dt;
          EXPECT_GT(u->grad_shard().abs().sum().item<double>(), 0.0) << m->name() << "."
                                                                     << u->name() << " " << dt;
        }
        // The program ran the units in registration order.
        std::vector<size_t> order(m->units().size());
        for (size_t i = 0; i < order.size(); ++i) order[i] = i;
        EXPECT_EQ(m->execution_order(), order) << m->name();
        // Buffers (u, running statistics) stay in the master dtype under bfloat16 compute.
        for (auto& [name, b] : m->named_buffers()) EXPECT_EQ(b.scalar_type(), master) << name;
      }
      // Eval mode: running statistics, no u update, output in the compute dtype.
      g->train(false);
      torch::NoGradGuard no_grad;
      at::Tensor img_eval = g->forward(TensorList{z, y})[0];
      EXPECT_EQ(img_eval.scalar_type(), dt);
      EXPECT_TRUE(torch::isfinite(img_eval).all().item<bool>()) << dt;
    }
  }
}

// One forward and backward of the tiny 3-block BigGAN in float64 at stage 0: G's image, D's
// logits and every unit's gradient shard (G's, then D's).
struct TinyPass {
  at::Tensor img, logits;
  std::vector<at::Tensor> grads;
};

TinyPass tiny_pass(Communicator& comm, const BigGanConfig& c) {
  BigGanFamily fam(c);
  auto g = build_sharded_model(fam.generator(comm), comm, test_util::sharding(0), 11, at::kDouble);
  auto d = build_sharded_model(fam.discriminator(comm), comm, test_util::sharding(0), 12, at::kDouble);
  at::Generator gen = at::detail::createCPUGenerator(5 + comm.rank());
  at::Tensor z = fam.sample_latents(4, gen, at::kDouble);
  at::Tensor y = fam.sample_labels(4, gen);
  at::Tensor img = g->forward(TensorList{z, y})[0];
  at::Tensor out = d->forward(TensorList{img, y})[0];
  out.mean().backward();
  TinyPass p{img.detach(), out.detach(), {}};
  for (ShardedModel* m : {g.get(), d.get()}) {
    for (auto& u : m->units()) p.grads.push_back(u->grad_shard().clone());
  }
  return p;
}

// `b` (a model option on) equals `a` (off) within 1e-10 relative, image, logits and every
// gradient: only the summation order of convolutions and reductions differs, each ~1e-16
// relative, over a few dozen layers (a wrong layout, tap or channel would differ by O(1)).
void expect_same_function(const TinyPass& a, const TinyPass& b) {
  auto close = [](const at::Tensor& x, const at::Tensor& ref) {
    return (x - ref).abs().max().item<double>() <= 1e-10 * std::max(1.0, ref.abs().max().item<double>());
  };
  EXPECT_TRUE(close(b.img.contiguous(), a.img.contiguous()));
  EXPECT_TRUE(close(b.logits, a.logits));
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (size_t i = 0; i < a.grads.size(); ++i) EXPECT_TRUE(close(b.grads[i], a.grads[i])) << "gradient shard " << i;
}

// model.channels_last: the blocks compute in channels-last memory format, in float64 the
// same function as the default layout (expect_same_function). G's image comes out
// channels-last, which shows the option took effect. Negative control, run once: layout()
// ignoring the option fails the format check.
TEST(BigGanModel, ChannelsLastMatchesTheDefaultLayout) {
  MpiCommunicator comm(MPI_COMM_WORLD, 60.0);
  BigGanConfig c = tiny_config(3);
  const TinyPass a = tiny_pass(comm, c);
  c.channels_last = true;
  const TinyPass b = tiny_pass(comm, c);
  EXPECT_FALSE(a.img.is_contiguous(at::MemoryFormat::ChannelsLast) && !a.img.is_contiguous());
  EXPECT_TRUE(b.img.is_contiguous(at::MemoryFormat::ChannelsLast) && !b.img.is_contiguous());
  expect_same_function(a, b);
}

// model.fused_upsample: the up-blocks convolve the low-resolution input; in float64 the
// same function as upsampling first (expect_same_function), alone and with channels-last
// activations. The image is not bit-identical to the unfused one, which shows the option
// took effect (ignoring it would give the same bits). The layer itself is checked in
// test_biggan_layers (UpsampledConv).
TEST(BigGanModel, FusedUpsampleMatchesUpsampleThenConvolve) {
  MpiCommunicator comm(MPI_COMM_WORLD, 60.0);
  for (bool cl : {false, true}) {
    BigGanConfig c = tiny_config(3);
    c.channels_last = cl;
    const TinyPass a = tiny_pass(comm, c);
    c.fused_upsample = true;
    const TinyPass b = tiny_pass(comm, c);
    EXPECT_FALSE(torch::equal(a.img, b.img)) << "channels_last " << cl;
    expect_same_function(a, b);
  }
}

// Stage 3 (parameters sharded and gathered per unit) computes what stage 0 computes, in
// float64: the same outputs bit for bit (same parameters, same SyncBatchNorm all-reduces),
// and gradients that differ only in reduction order (reduce-scatter vs all-reduce).
TEST(BigGanModel, StageThreeMatchesStageZero) {
  MpiCommunicator comm(MPI_COMM_WORLD, 60.0);
  BigGanFamily fam(tiny_config(3));
  std::vector<at::Tensor> outs, grads;
  for (int stage : {0, 3}) {
    auto g = build_sharded_model(fam.generator(comm), comm, test_util::sharding(stage), 21,
                                 at::kDouble);
    auto d = build_sharded_model(fam.discriminator(comm), comm, test_util::sharding(stage), 22,
                                 at::kDouble);
    at::Generator gen = at::detail::createCPUGenerator(9 + comm.rank());
    at::Tensor z = fam.sample_latents(3, gen, at::kDouble), y = fam.sample_labels(3, gen);
    at::Tensor img = g->forward(TensorList{z, y})[0];
    at::Tensor logits = d->forward(TensorList{img, y})[0];
    logits.pow(2).mean().backward();
    outs.push_back(logits.detach().clone());
    // This rank's part of every unit's averaged gradient, in flat order.
    std::vector<at::Tensor> parts;
    for (ShardedModel* m : {g.get(), d.get()}) {
      for (auto& u : m->units()) {
        // Stage 3 owns flat elements [r S, r S + S) with S = ceil(T / N), the tail padding.
        const int64_t t = u->numel(), n = comm.world_size(), s = (t + n - 1) / n;
        const int64_t off = std::min(t, comm.rank() * s), len = std::min(s, t - off);
        const at::Tensor& gr = u->grad_shard();
        parts.push_back((stage == 0 ? gr.narrow(0, off, len) : gr.narrow(0, 0, len)).clone());
      }
    }
    grads.push_back(torch::cat(parts));
  }
  EXPECT_TRUE(torch::equal(outs[0], outs[1]));
  ASSERT_EQ(grads[0].sizes(), grads[1].sizes());
  const double scale = grads[0].abs().max().item<double>();
  EXPECT_LE((grads[0] - grads[1]).abs().max().item<double>(), 1e-12 * scale);
}

// ---- Parameter counts ----

int64_t conv(int64_t in, int64_t out, int64_t k, bool bias = true) {
  return out * in * k * k + (bias ? out : 0);
}

// G + D parameters of `c`, from the architecture (biggan.h).
std::pair<int64_t, int64_t> analytic_count(const BigGanConfig& c) {
  const int64_t L = static_cast<int64_t>(c.g_ch_mult.size()), chunk = c.z_dim / L;
  const int64_t cond = c.shared_dim + chunk;
  auto attn = [](int64_t ch) { return 2 * ch * (ch / 8) + 2 * ch * (ch / 2) + 1; };
  int64_t g = c.n_classes * c.shared_dim + conv(chunk, c.ch * c.g_ch_mult[0] * 16, 1);
  for (int64_t r = 0; r + 1 < L; ++r) {
    const int64_t in = c.ch * c.g_ch_mult[r], out = c.ch * c.g_ch_mult[r + 1];
    g += conv(in, out, 3) + conv(out, out, 3) + conv(in, out, 1) + 2 * cond * (in + out);
    g += c.g_blocks_per_res * (2 * conv(out, out, 3) + 4 * cond * out);
    if (c.g_attn == (int64_t{4} << (r + 1))) g += attn(out);
  }
  const int64_t c_last = c.ch * c.g_ch_mult.back();
  g += 2 * c_last + conv(c_last, c.channels, 3);
  int64_t d = 0, in = c.channels;
  const int64_t res = int64_t{4} << (L - 1);
  bool placed = false;
  for (int64_t k = 0; k < L; ++k) {
    const int64_t out = c.d_ch * c.d_ch_mult[k];
    const bool down = k + 1 < L;
    d += conv(in, out, 3) + conv(out, out, 3) + (down || in != out ? conv(in, out, 1) : 0);
    d += c.d_blocks_per_res * 2 * conv(out, out, 3);
    if (!placed && c.d_attn == (down ? res >> (k + 1) : 4)) {
      d += attn(out);
      placed = true;
    }
    in = out;
  }
  d += in + 1 + c.n_classes * in;
  return {g, d};
}

int64_t sum(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (int64_t x : v) s += x;
  return s;
}

// Issue 22: D's spectral-norm u advances once per D forward of BigGAN-PyTorch's training
// loop: once per D step and micro-batch (real and fake are one forward there, D(cat(G_z,
// x))), and once per micro-batch of the G step. With d_steps = 2 and 2 micro-batches that
// is 2 * 2 + 2 = 6 per training step; shardgan's separate real and fake forwards made it 10.
// G's u advances once per G forward: 2 * 2 in the D steps (no grad, training mode) + 2.
TEST(BigGanModel, SpectralNormAdvancesOncePerTrainingForwardOfD) {
  MpiCommunicator comm(MPI_COMM_WORLD, 60.0);
  BigGanFamily fam(tiny_config(1));
  auto g = build_sharded_model(fam.generator(comm), comm, test_util::sharding(3), 11, at::kFloat);
  auto d = build_sharded_model(fam.discriminator(comm), comm, test_util::sharding(3), 12, at::kFloat);
  auto og = make_optimizer(*g, OptimizerConfig::biggan_generator());
  auto od = make_optimizer(*d, OptimizerConfig::biggan_discriminator());
  DynamicLossScaler sg(LossScalerConfig{}, at::kFloat), sd(LossScalerConfig{}, at::kFloat);
  const int64_t d_steps = 2, micro = 2, global = 4 * comm.world_size() * micro;
  GanObjective obj("hinge", d_steps, micro, 0.0, comm);
  torch::manual_seed(3);
  const at::Tensor x = torch::randn({global, 1, 32, 32});
  const at::Tensor z = torch::randn({global, 8}), y = torch::randint(0, 3, {global}, torch::kLong);
  const int64_t per = global / micro / comm.world_size();
  StepInputs in;
  in.local = [&](const at::Tensor& t, int64_t j) { return t.narrow(0, (j * comm.world_size() + comm.rank()) * per, per); };
  in.real = [&](int64_t j) { return TensorList{in.local(x, j), in.local(y, j)}; };
  in.latents = [&] { return TensorList{z, y}; };
  auto advances = [](ShardedModel& m) {
    std::vector<int64_t> out;
    for (auto& u : m.units()) {
      for (auto& mod : u->module().modules()) {
        if (auto* sn = dynamic_cast<biggan::SNBase*>(mod.get())) out.push_back(sn->advances());
      }
    }
    return out;
  };
  for (int step = 1; step <= 2; ++step) {
    obj.step({g.get(), og.get(), &sg}, {d.get(), od.get(), &sd}, in);
    const auto ad = advances(*d), ag = advances(*g);
    ASSERT_FALSE(ad.empty());
    for (int64_t a : ad) EXPECT_EQ(a, step * (d_steps * micro + micro)) << "D's u, step " << step;
    for (int64_t a : ag) EXPECT_EQ(a, step * (d_steps * micro + micro)) << "G's u, step " << step;
  }
}

TEST(BigGanModel, ParameterCountsPassOneBillion) {
  MpiCommunicator comm(MPI_COMM_WORLD, 60.0);
  for (int64_t ch : {1, 3}) {  // the formula agrees with the built units on small models
    BigGanConfig c = tiny_config(ch);
    BigGanFamily fam(c);
    auto [g, d] = analytic_count(c);
    EXPECT_EQ(sum(unit_numels(fam.generator(comm))), g);
    EXPECT_EQ(sum(unit_numels(fam.discriminator(comm))), d);
  }
  BigGanConfig big;  // width 1024 at every resolution and 9 blocks per resolution
  big.ch = 128;
  big.d_ch = 128;
  big.g_ch_mult = {8, 8, 8, 8};
  big.d_ch_mult = {8, 8, 8, 8};
  big.g_blocks_per_res = 8;
  big.d_blocks_per_res = 8;
  BigGanFamily fam(big);
  auto [g, d] = analytic_count(big);
  const auto t0 = std::chrono::steady_clock::now();
  const auto g_units = unit_numels(fam.generator(comm));  // uninitialized, one unit at a time
  const auto d_units = unit_numels(fam.discriminator(comm));
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(sum(g_units), g);
  EXPECT_EQ(sum(d_units), d);
  EXPECT_GT(g + d, 1000000000);
  const int64_t largest = std::max(*std::max_element(g_units.begin(), g_units.end()),
                                   *std::max_element(d_units.begin(), d_units.end()));
  EXPECT_LT(largest, 25000000);  // one residual block per unit
  if (comm.rank() == 0) {
    std::printf("BigGAN big config: G %lld + D %lld = %lld parameters in %zu + %zu units, "
                "largest unit %lld, unit_numels %.2f s\n",
                static_cast<long long>(g), static_cast<long long>(d),
                static_cast<long long>(g + d), g_units.size(), d_units.size(),
                static_cast<long long>(largest), secs);
  }
}

// ---- Config ----

std::string config_error(std::map<std::string, std::string> values) {
  ConfigReader r(std::move(values), "test.yaml");
  try {
    make_biggan_family(r);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(BigGanConfig, ErrorsNameTheKey) {
  std::string e = config_error({{"model.z_dim", "121"}});
  EXPECT_NE(e.find("model.z_dim"), std::string::npos) << e;
  EXPECT_NE(e.find("4"), std::string::npos) << e;  // the number of chunks
  e = config_error({{"model.z_dim", "10"}, {"model.g_ch_mult", "[4, 4, 4]"},
                    {"model.d_ch_mult", "[4, 4, 4]"}, {"model.d_attn", "8"}});
  EXPECT_NE(e.find("model.z_dim"), std::string::npos) << e;
  EXPECT_NE(e.find("3"), std::string::npos) << e;
  e = config_error({{"model.ch", "-2"}});
  EXPECT_NE(e.find("model.ch"), std::string::npos) << e;
  e = config_error({{"model.init", "kaiming"}});
  EXPECT_NE(e.find("model.init"), std::string::npos) << e;
  e = config_error({{"model.g_ch_mult", "[4, 4]"}});
  EXPECT_NE(e.find("model.d_ch_mult"), std::string::npos) << e;
  e = config_error({{"model.g_attn", "12"}});
  EXPECT_NE(e.find("model.g_attn"), std::string::npos) << e;
  e = config_error({{"model.d_attn", "32"}});
  EXPECT_NE(e.find("model.d_attn"), std::string::npos) << e;
  e = config_error({{"model.channels", "2"}});
  EXPECT_NE(e.find("model.channels"), std::string::npos) << e;
  e = config_error({{"model.g_blocks_per_res", "-1"}});
  EXPECT_NE(e.find("model.g_blocks_per_res"), std::string::npos) << e;
}

TEST(BigGanConfig, ReadsKeysAndDefaults) {
  ConfigReader r({{"model.g_ch_mult", "[8, 4, 2]"}, {"model.d_ch_mult", "[1, 2, 4]"},
                  {"model.z_dim", "9"}, {"model.channels", "3"}, {"model.g_attn", "0"},
                  {"model.d_attn", "4"}, {"model.init", "N02"}},
                 "test.yaml");
  auto fam = make_biggan_family(r);
  r.check_all_known();
  EXPECT_STREQ(fam->arch(), "biggan");
  EXPECT_EQ(fam->image_shape().channels, 3);
  EXPECT_EQ(fam->image_shape().height, 16);
  EXPECT_EQ(fam->num_classes(), 10);
  at::Generator gen = at::detail::createCPUGenerator(1);
  EXPECT_EQ(fam->sample_latents(5, gen, at::kDouble).sizes(), (std::vector<int64_t>{5, 9}));
  BigGanConfig defaults;
  BigGanFamily def(defaults);
  EXPECT_EQ(def.image_shape().height, 32);
  EXPECT_EQ(def.image_shape().channels, 1);
  EXPECT_EQ(def.num_z_chunks(), 4);
}

// BigGAN's truncation trick (Brock et al. 2019, section 3.1): entries outside [-t, t] are
// redrawn, so the result is a normal truncated at t. Its variance, 1 - 2 t phi(t) / (2 Phi(t) - 1),
// tells a redraw (0.2911 at t = 1) from a clamp (0.5161) or the untruncated draw (1).
// Shown to fail once (2026-11-28): with a clamp in place of the redraw, "z.var() 0.5150,
// var 0.2911, exceeds 5e-3".
TEST(BigGanConfig, TruncatedLatentsAreATruncatedNormal) {
  BigGanFamily fam(BigGanConfig{});  // z_dim 120
  at::Generator g0 = at::detail::createCPUGenerator(7), g1 = at::detail::createCPUGenerator(7);
  at::Generator g2 = at::detail::createCPUGenerator(7);
  const at::Tensor plain = fam.sample_latents(2000, g0, at::kDouble);
  const at::Tensor z = fam.sample_truncated_latents(2000, g1, at::kDouble, 1.0);
  ASSERT_EQ(z.sizes(), plain.sizes());
  EXPECT_EQ(z.scalar_type(), at::kDouble);
  EXPECT_LE(z.abs().max().item<double>(), 1.0);
  // Entries already inside keep their values: the draw is redrawn where it fell outside, not rescaled.
  const at::Tensor inside = plain.abs().le(1.0);
  EXPECT_TRUE(z.masked_select(inside).equal(plain.masked_select(inside)));
  const double phi = std::exp(-0.5) / std::sqrt(2 * M_PI), mass = std::erf(1 / std::sqrt(2.0));
  const double var = 1 - 2 * phi / mass;  // 0.29112
  // 240,000 draws: the variance estimate's standard deviation is about 0.0006; bound 0.005.
  EXPECT_NEAR(z.var().item<double>(), var, 5e-3);
  EXPECT_NEAR(z.mean().item<double>(), 0.0, 5e-3);
  EXPECT_TRUE(fam.sample_truncated_latents(2000, g2, at::kDouble, 1.0).equal(z));  // same seed, same draw
  at::Generator g3 = at::detail::createCPUGenerator(7);
  EXPECT_TRUE(fam.sample_truncated_latents(2000, g3, at::kDouble, 0).equal(plain));  // 0: off
  at::Generator g4 = at::detail::createCPUGenerator(7);
  EXPECT_THROW(fam.sample_truncated_latents(4, g4, at::kDouble, 0.01), std::invalid_argument);
}

}  // namespace

}  // namespace SHARDGAN_UNITY_ID
