// The stylegan2 family (include/shardgan/models/stylegan2.h) against an independent
// plain-LibTorch re-implementation (tests/stylegan2_plain_reference.h, which shares no code
// with src/models/stylegan2), at float64 on one rank (stage 0, MPI_COMM_SELF), on tiny
// 32x32 nets (channels 8/8/8/4 at 4/8/16/32, z and w 8) built through make_family from a
// parsed config, with every parameter perturbed (so biases and noise strengths are not 0):
//  - paper256-shaped (unconditional, mapping 8, D resnet, mbstd group 2 of a batch of 4, so
//    two consecutive groups): images, ws (G's second output; style mixing with cutoffs < num_ws and = num_ws, noise seeds varied and
//    repeated) and logits agree within 1e-12 relative; so does w_avg after training-mode
//    forwards;
//  - cifar-shaped (3 classes, mapping 2, D orig with the projection head, no mixing): same;
//  - gradients (paper256-shaped): the R1 gradient d(sum logits)/dx and D's parameter
//    gradients of sum(gx^2), and the path-length-like gradient d(sum(img * r))/d(ws) and G's
//    parameter gradients of its sum of squares, all through begin/end_higher_order as the
//    trainer's regularizers do (src/train/regularization.cpp), agree with plain autograd within 1e-10 relative.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "shardgan/comm/mpi_communicator.h"
#include "shardgan/models/family.h"
#include "shardgan/sharding/deferred.h"
#include "shardgan/sharding/sharded_model.h"
#include "shardgan/util/config_reader.h"
#include "stylegan2_plain_reference.h"
#include "test_util.h"

// The gtest files compile together in batches (tests/CMakeLists.txt): this file's names
// live in a namespace of its own.
namespace SHARDGAN_UNITY_ID {

using namespace shardgan;

namespace {

using RefNamed = std::vector<std::pair<std::string, at::Tensor>>;

constexpr int64_t kRefBatch = 4;
constexpr double kRefForwardTol = 1e-12, kRefGradTol = 1e-10;

// The family's configuration keys and the reference's Shape of the same nets.
struct RefCase {
  std::map<std::string, std::string> keys;
  sg2_plain::Shape shape;
};

// paper256's preset, shrunk: 32x32, z/w 8, channels min(128 / r, 8), mbstd group 2.
RefCase ref_paper256_case() {
  RefCase c;
  c.keys = {{"model.arch", "stylegan2"},      {"model.preset", "paper256"},  {"model.image_size", "32"},
            {"model.z_dim", "8"},             {"model.w_dim", "8"},          {"model.channel_base", "128"},
            {"model.channel_max", "8"},       {"model.mbstd_group", "2"}};
  sg2_plain::Shape& s = c.shape;
  s.resolution = 32;
  s.channels = 3;
  s.z_dim = 8;
  s.w_dim = 8;
  s.num_classes = 0;
  s.channel_base = 128;
  s.channel_max = 8;
  s.mapping_layers = 8;
  s.mbstd_group = 2;
  s.d_arch = "resnet";
  return c;
}

// cifar's preset, shrunk: 3 classes, 32x32, z/w 8, channels min(128 / r, 8) (mapping 2, D
// orig, mbstd group 32, no style mixing from the preset; D's label mapping keeps 8 layers).
RefCase ref_cifar_case() {
  RefCase c;
  c.keys = {{"model.arch", "stylegan2"}, {"model.preset", "cifar"},       {"model.n_classes", "3"},
            {"model.z_dim", "8"},        {"model.w_dim", "8"},            {"model.channel_base", "128"},
            {"model.channel_max", "8"}};
  sg2_plain::Shape& s = c.shape;
  s.resolution = 32;
  s.channels = 3;
  s.z_dim = 8;
  s.w_dim = 8;
  s.num_classes = 3;
  s.channel_base = 128;
  s.channel_max = 8;
  s.mapping_layers = 2;
  s.mbstd_group = 32;
  s.d_arch = "orig";
  return c;
}

struct RefModels {
  std::unique_ptr<ModelFamily> family;
  std::unique_ptr<ShardedModel> g, d;
};

// Adds scale * N(0, 1) to every parameter through the master shard (stage 0, one rank: the
// shard is the whole flat parameter, aliased by the modules).
void ref_perturb(ShardedModel& m, uint64_t seed, double scale) {
  torch::NoGradGuard no_grad;
  at::Generator gen = at::detail::createCPUGenerator(seed);
  for (auto& u : m.units()) {
    ASSERT_EQ(u->shard_offset(), 0) << u->name();
    ASSERT_EQ(u->shard_numel(), u->padded_numel()) << u->name();
    at::Tensor& shard = u->shard();
    for (const auto& s : u->slots()) {
      at::Tensor part = shard.narrow(0, s.offset, s.numel);
      part.add_(at::randn({s.numel}, gen, part.options()) * scale);
    }
  }
  m.after_optimizer_step();
}

RefModels ref_build(const RefCase& c, Communicator& comm) {
  ConfigReader r(c.keys, "test.yaml");
  RefModels m;
  m.family = make_family(r);
  m.g = build_sharded_model(m.family->generator(comm), comm, test_util::sharding(0), 21, at::kDouble);
  m.d = build_sharded_model(m.family->discriminator(comm), comm, test_util::sharding(0), 22, at::kDouble);
  ref_perturb(*m.g, 31, 0.3);
  ref_perturb(*m.d, 32, 0.3);
  return m;
}

RefNamed ref_full_params(ShardedModel& m) {
  RefNamed out;
  for (auto& [name, t] : m.gather_full_parameters()) out.emplace_back(name, t.detach().clone());
  return out;
}

at::Tensor ref_w_avg(ShardedModel& g) {
  for (auto& [name, b] : g.named_buffers()) {
    if (name == "mapping.w_avg") return b;
  }
  return {};
}

double ref_rel(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>() / std::max(b.abs().max().item<double>(), 1e-300);
}

// Stage 0, one rank: each unit's gradient shard is its whole flat gradient.
RefNamed ref_family_grads(ShardedModel& m) {
  RefNamed out;
  for (auto& u : m.units()) {
    const at::Tensor& g = u->grad_shard();
    EXPECT_EQ(g.numel(), u->padded_numel()) << u->name();
    for (const auto& s : u->slots()) {
      out.emplace_back(u->name() + "." + s.name, g.narrow(0, s.offset, s.numel).view(s.shape).clone());
    }
  }
  return out;
}

// d(loss)/d(each parameter), in the order of `order` (zeros where loss does not depend on it).
RefNamed ref_plain_grads(const at::Tensor& loss, const sg2_plain::Params& p, const RefNamed& order) {
  std::vector<at::Tensor> inputs;
  for (const auto& kv : order) inputs.push_back(sg2_plain::param(p, kv.first));
  const std::vector<at::Tensor> grads =
      torch::autograd::grad({loss}, inputs, {}, /*retain_graph=*/false, /*create_graph=*/false, /*allow_unused=*/true);
  RefNamed out;
  for (size_t i = 0; i < inputs.size(); ++i) {
    out.emplace_back(order[i].first, grads[i].defined() ? grads[i].detach() : at::zeros_like(inputs[i]).detach());
  }
  return out;
}

// Latents: the family's sampler, then cutoffs and noise seeds set per row.
at::Tensor ref_latents(const RefModels& m, const sg2_plain::Shape& s, uint64_t seed,
                       const std::vector<double>& cutoffs, const std::vector<double>& seeds) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  at::Tensor z = m.family->sample_latents(kRefBatch, gen, at::kDouble);
  for (int64_t i = 0; i < kRefBatch; ++i) {
    if (!cutoffs.empty()) z.index_put_({i, 2 * s.z_dim}, cutoffs[static_cast<size_t>(i)]);
    if (!seeds.empty()) z.index_put_({i, 2 * s.z_dim + 1}, seeds[static_cast<size_t>(i)]);
  }
  return z;
}

// G and D of `c` through the family and the reference on the same inputs; two
// training-mode G forwards (w_avg after each).
void ref_check_forward(const RefCase& c, const std::vector<double>& cutoffs, const std::vector<double>& cutoffs2,
                       const at::Tensor& labels) {
  MpiCommunicator comm(MPI_COMM_SELF, 60.0);
  RefModels m = ref_build(c, comm);
  const sg2_plain::Shape& s = c.shape;
  const int64_t nws = sg2_plain::num_ws(s);
  const sg2_plain::Params pg = sg2_plain::to_params(ref_full_params(*m.g));
  const sg2_plain::Params pd = sg2_plain::to_params(ref_full_params(*m.d));
  at::Tensor w_avg = ref_w_avg(*m.g);
  ASSERT_TRUE(w_avg.defined());
  at::Tensor ref_avg = w_avg.clone();
  torch::NoGradGuard no_grad;

  // Seeds varied, and one repeated (rows 0 and 2). G returns {images, ws}.
  const at::Tensor z = ref_latents(m, s, 41, cutoffs, {5.0, 123456.0, 5.0, 16777215.0});
  const TensorList out = m.g->forward(TensorList{z, labels});
  ASSERT_EQ(out.size(), 2u);
  const at::Tensor img = out.at(0), ws = out.at(1);
  const sg2_plain::GOut ref = sg2_plain::generator(pg, s, z, labels, &ref_avg);
  ASSERT_EQ(img.sizes(), ref.images.sizes());
  EXPECT_LE(ref_rel(ref.images, img), kRefForwardTol);
  ASSERT_EQ(ws.sizes(), (std::vector<int64_t>{kRefBatch, nws, s.w_dim}));
  ASSERT_EQ(ref.ws.sizes(), ws.sizes());
  EXPECT_LE(ref_rel(ref.ws, ws), kRefForwardTol);
  EXPECT_LE(ref_rel(ref_avg, w_avg), kRefForwardTol);
  EXPECT_GT(w_avg.abs().max().item<double>(), 0.0);

  // A second training-mode forward: w_avg moves on from where it was, and rows 1 and 3 are
  // truncated in W (psi 0.7 and 0.3, on the w_avg this batch has just updated).
  at::Tensor z2 = ref_latents(m, s, 42, cutoffs2, {});
  z2.index_put_({1, 2 * s.z_dim + 2}, 0.7);
  z2.index_put_({3, 2 * s.z_dim + 2}, 0.3);
  const TensorList out2 = m.g->forward(TensorList{z2, labels});
  const at::Tensor img2 = out2.at(0);
  const sg2_plain::GOut ref2 = sg2_plain::generator(pg, s, z2, labels, &ref_avg);
  EXPECT_LE(ref_rel(ref2.images, img2), kRefForwardTol);
  EXPECT_LE(ref_rel(ref2.ws, out2.at(1)), kRefForwardTol);
  EXPECT_LE(ref_rel(ref_avg, w_avg), kRefForwardTol);

  // D on G's images and on Gaussian images.
  at::Generator gen = at::detail::createCPUGenerator(43);
  for (const at::Tensor& x : {img, at::randn(img.sizes(), gen, img.options())}) {
    const at::Tensor logits = m.d->forward(TensorList{x, labels}).at(0);
    const at::Tensor ref_logits = sg2_plain::discriminator(pd, s, x, labels);
    ASSERT_EQ(logits.sizes(), (std::vector<int64_t>{kRefBatch}));
    ASSERT_EQ(ref_logits.sizes(), logits.sizes());
    EXPECT_LE(ref_rel(ref_logits, logits), kRefForwardTol);
  }
}

}  // namespace

TEST(StyleGan2Reference, Paper256ShapedForwardAndWAvg) {
  const RefCase c = ref_paper256_case();
  const double nws = static_cast<double>(sg2_plain::num_ws(c.shape));
  ASSERT_EQ(nws, 8.0);
  // Mixing from ws 3 and from ws 1 in rows 0 and 2, none in rows 1 and 3; then a batch
  // without any mixing (the mixing mapping does not run).
  ref_check_forward(c, {3.0, nws, 1.0, nws}, {nws, nws, nws, nws}, at::Tensor());
}

TEST(StyleGan2Reference, CifarShapedConditionalForwardAndWAvg) {
  const RefCase c = ref_cifar_case();
  const double nws = static_cast<double>(sg2_plain::num_ws(c.shape));
  // The preset samples no mixing (cutoff num_ws); the second batch mixes in one row.
  ref_check_forward(c, {}, {nws, 6.0, nws, nws}, torch::tensor({0, 2, 1, 2}, torch::kLong));
}

TEST(StyleGan2Reference, R1AndPathLengthGradients) {
  MpiCommunicator comm(MPI_COMM_SELF, 60.0);
  const RefCase c = ref_paper256_case();
  const sg2_plain::Shape& s = c.shape;
  RefModels m = ref_build(c, comm);
  const int64_t nws = sg2_plain::num_ws(s), zd = s.z_dim, res = s.resolution;
  const RefNamed g_params = ref_full_params(*m.g), d_params = ref_full_params(*m.d);
  const sg2_plain::Params pg = sg2_plain::to_params(g_params, /*requires_grad=*/true);
  const sg2_plain::Params pd = sg2_plain::to_params(d_params, /*requires_grad=*/true);
  const double nws_d = static_cast<double>(nws);
  const at::Tensor z = ref_latents(m, s, 51, {2.0, nws_d, 5.0, nws_d}, {7.0, 8.0, 7.0, 99.0});
  at::Generator gen = at::detail::createCPUGenerator(52);
  const at::Tensor x = at::randn({kRefBatch, s.channels, res, res}, gen, z.options());
  const at::Tensor pl_noise = at::randn({kRefBatch, s.channels, res, res}, gen, z.options()) /
                              std::sqrt(static_cast<double>(res * res));

  // R1 through the sharded D: gx = d(sum logits)/dx with create_graph, then sum(gx^2)'s
  // backward, between begin_higher_order and end_higher_order.
  at::Tensor gx;
  {
    m.d->begin_higher_order();
    const at::Tensor xf = x.clone().requires_grad_(true);
    const at::Tensor logits = m.d->forward(TensorList{xf, at::Tensor()}).at(0);
    gx = torch::autograd::grad({logits.sum()}, {xf}, {}, /*retain_graph=*/true, /*create_graph=*/true)[0];
    gx.square().sum().backward();
    m.d->end_higher_order();
  }
  const RefNamed d_got = ref_family_grads(*m.d);
  {
    const at::Tensor xr = x.clone().requires_grad_(true);
    const at::Tensor logits = sg2_plain::discriminator(pd, s, xr, at::Tensor());
    const at::Tensor gx_ref = torch::autograd::grad({logits.sum()}, {xr}, {}, true, true)[0];
    EXPECT_LE(ref_rel(gx_ref.detach(), gx.detach()), kRefGradTol) << "R1 gradient d(sum logits)/dx";
    const RefNamed d_want = ref_plain_grads(gx_ref.square().sum(), pd, d_params);
    const double worst = test_util::max_rel_diff(d_got, d_want, "D, R1 parameter gradient", kRefGradTol);
    std::printf("[stylegan2 reference] R1: dx %.3g, D parameters %.3g (tolerance %.0e)\n",
                ref_rel(gx_ref.detach(), gx.detach()), worst, kRefGradTol);
  }

  // Path length through the sharded G (as src/train/regularization.cpp): G's forward returns
  // {images, ws}; gw = d(sum(img * r))/d(ws) with create_graph, then sum(gw^2)'s backward.
  at::Tensor img, gw;
  {
    ASSERT_TRUE(z.narrow(1, 2 * zd, 1).lt(static_cast<double>(nws)).any().item<bool>());  // some rows mix
    m.g->begin_higher_order();
    const TensorList out = m.g->forward(TensorList{z, at::Tensor()});
    img = out.at(0);
    const at::Tensor ws = out.at(1);
    gw = torch::autograd::grad({(img * pl_noise).sum()}, {ws}, {}, /*retain_graph=*/true, /*create_graph=*/true)[0];
    gw.square().sum().backward();
    m.g->end_higher_order();
  }
  const RefNamed g_got = ref_family_grads(*m.g);
  {
    const sg2_plain::GOut out = sg2_plain::generator(pg, s, z, at::Tensor(), nullptr);
    EXPECT_LE(ref_rel(out.images.detach(), img.detach()), kRefForwardTol) << "images";
    const at::Tensor gw_ref = torch::autograd::grad({(out.images * pl_noise).sum()}, {out.ws}, {}, true, true)[0];
    EXPECT_LE(ref_rel(gw_ref.detach(), gw.detach()), kRefGradTol) << "path-length gradient d(sum(img r))/d(ws)";
    const RefNamed g_want = ref_plain_grads(gw_ref.square().sum(), pg, g_params);
    const double worst = test_util::max_rel_diff(g_got, g_want, "G, path-length parameter gradient", kRefGradTol);
    std::printf("[stylegan2 reference] path length: d/dws %.3g, G parameters %.3g (tolerance %.0e)\n",
                ref_rel(gw_ref.detach(), gw.detach()), worst, kRefGradTol);
    // The regularizer reaches the mapping network (through ws) and the noise strengths.
    for (const auto& [name, grad] : g_want) {
      if (name == "mapping.fcs.0.weight" || name == "b32.conv1.noise_strength") {
        EXPECT_GT(grad.abs().max().item<double>(), 0.0) << name;
      }
    }
  }
}

}  // namespace SHARDGAN_UNITY_ID
