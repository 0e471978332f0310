// StyleGAN2 (include/shardgan/models/stylegan2.h, src/models/stylegan2/). ctest stylegan2_model:
//  - the presets paper256 and cifar have the parameter counts of our plain-PyTorch peer
//    (benchmarks/peers/stylegan2.py: G 24,767,458 / D 24,001,089 and G 20,215,315 /
//    D 23,089,664), per unit too, and every parameter has the peer's name, shape and order
//    (the peer built on the meta device; that part skips without the Python);
//  - G and D through the sharding layer at float64: unit names, shapes, a backward;
//  - a sample's image does not depend on its batch (noise seeds in the latents), a cutoff of
//    num_ws is no mixing, w_avg follows the batch mean in training mode only;
//  - the resampling and demodulation match the peer's formulation, and the layers take a
//    double backward (R1, path length);
//  - bad model.* values are ConfigErrors naming the key.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "models/stylegan2/layers.h"
#include "shardgan/comm/local_communicator.h"
#include "shardgan/models/stylegan2.h"
#include "shardgan/sharding/deferred.h"
#include "shardgan/train/config.h"
#include "shardgan/util/config_reader.h"
#include "test_util.h"

// The gtest files compile together in batches (tests/CMakeLists.txt): this file's names
// live in a namespace of its own.
namespace SHARDGAN_UNITY_ID {

using namespace shardgan;

namespace {

namespace sg = shardgan::stylegan2;

// 32x32 (the smallest), 32/16/8/4 channels at 4/8/16/32, z and w 16, mapping 2.
StyleGan2Config tiny(int64_t classes, const std::string& d_arch = "resnet") {
  StyleGan2Config c;
  c.resolution = 32;
  c.channels = 3;
  c.z_dim = 16;
  c.w_dim = 16;
  c.num_classes = classes;
  c.channel_base = 128;
  c.channel_max = 32;
  c.mapping_layers = 2;
  c.d_arch = d_arch;
  c.mbstd_group = 4;
  c.style_mixing = 0.5;
  return c;
}

std::vector<std::string> names_of(const ModelSpec& s) {
  std::vector<std::string> v;
  for (const auto& u : s.units) v.push_back(u.name);
  return v;
}

std::map<std::string, int64_t> numels_by_unit(const ModelSpec& s) {
  const std::vector<int64_t> n = unit_numels(s);
  std::map<std::string, int64_t> m;
  for (size_t i = 0; i < n.size(); ++i) m[s.units[i].name] = n[i];
  return m;
}

int64_t total(const std::map<std::string, int64_t>& m) {
  int64_t t = 0;
  for (auto& kv : m) t += kv.second;
  return t;
}

// "<unit>.<param> <shape>" of every parameter of `s`, in flat order (units uninitialized).
std::vector<std::string> param_lines(const ModelSpec& s) {
  std::vector<std::string> out;
  for (const auto& u : s.units) {
    const BuiltUnit b = u.make(false);
    for (const auto& kv : b.module->named_parameters(true)) {
      std::string shape;
      for (int64_t d : kv.value().sizes()) shape += (shape.empty() ? "" : "x") + std::to_string(d);
      out.push_back(u.name + "." + kv.key() + " " + (shape.empty() ? "-" : shape));
    }
  }
  return out;
}

// The peer's parameter name in our units: G "blocks.i.*" -> "b<4 2^i>.*"; D "blocks.i.*" ->
// "b<R / 2^i>.*", "conv|fc|out.*" -> "b4.*"; "mapping.*" stays.
std::string our_name(const std::string& tag, const std::string& name, int64_t res) {
  if (name.rfind("blocks.", 0) == 0) {
    const size_t dot = name.find('.', 7);
    const int64_t i = std::stoll(name.substr(7, dot - 7));
    const int64_t r = tag == "G" ? (int64_t{4} << i) : (res >> i);
    return "b" + std::to_string(r) + name.substr(dot);
  }
  if (tag == "D" && name.rfind("mapping.", 0) != 0) return "b4." + name;
  return name;
}

std::string python_path() {
  const char* env = std::getenv("SHARDGAN_PYTHON");
  return env && *env ? env : SHARDGAN_PYTHON;
}

constexpr const char* kPeerShapes = R"(import sys
sys.path.insert(0, sys.argv[1])
import torch
import stylegan2 as sg
for spec in sys.argv[2:]:
    res, ch, z, w, base, cmax, maps, classes, arch = spec.split(",")
    res, ch, z, w, base, cmax, maps, classes = (int(v) for v in (res, ch, z, w, base, cmax, maps, classes))
    with torch.device("meta"):
        g = sg.Generator(res, z_dim=z, w_dim=w, c_dim=classes, img_channels=ch, mapping_layers=maps,
                         channel_base=base, channel_max=cmax)
        d = sg.Discriminator(res, c_dim=classes, img_channels=ch, channel_base=base, channel_max=cmax,
                             architecture=arch)
    print("case", spec)
    for tag, m in (("G", g), ("D", d)):
        for name, p in m.named_parameters():
            print(tag, name, "x".join(str(s) for s in p.shape) or "-")
print("end")
)";

// Sets every noise strength of G to `v` (stage 0: the modules' parameters are the flat ones).
void set_noise_strength(ShardedModel& g, double v) {
  torch::NoGradGuard no_grad;
  for (auto& u : g.units()) {
    for (auto& kv : u->module().named_parameters(true)) {
      const std::string& k = kv.key();
      if (k.size() >= 14 && k.compare(k.size() - 14, 14, "noise_strength") == 0) kv.value().fill_(v);
    }
  }
}

double rel_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>() / std::max(b.abs().max().item<double>(), 1e-300);
}

std::unique_ptr<ShardedModel> build_f64(const ModelSpec& spec, Communicator& comm, uint64_t seed) {
  return build_sharded_model(spec, comm, test_util::sharding(0), seed, at::kDouble);
}

}  // namespace

TEST(StyleGan2Model, PresetCountsEqualThePeer) {
  LocalCommunicator comm;
  EXPECT_EQ(stylegan2_num_ws(stylegan2_preset("paper256")), 14);
  EXPECT_EQ(stylegan2_num_ws(stylegan2_preset("cifar")), 8);
  {
    auto fam = make_stylegan2_family(stylegan2_preset("paper256"));
    const auto g = numels_by_unit(fam->generator(comm));
    const auto d = numels_by_unit(fam->discriminator(comm));
    EXPECT_EQ(total(g), 24767458);
    EXPECT_EQ(total(d), 24001089);
    const std::map<std::string, int64_t> g_want{{"mapping", 2101248}, {"b4", 2894852},   {"b8", 5509125},
                                                 {"b16", 5509125},    {"b32", 5509125},  {"b64", 2296069},
                                                 {"b128", 705669},    {"b256", 242245}};
    const std::map<std::string, int64_t> d_want{{"b256", 119232}, {"b128", 475520}, {"b64", 1901312},
                                                {"b32", 4981760}, {"b16", 4981760},  {"b8", 4981760},
                                                {"b4", 6559745}};
    EXPECT_EQ(g, g_want);
    EXPECT_EQ(d, d_want);
  }
  {
    auto fam = make_stylegan2_family(stylegan2_preset("cifar"));
    EXPECT_EQ(fam->num_classes(), 10);
    const auto g = numels_by_unit(fam->generator(comm));
    const auto d = numels_by_unit(fam->discriminator(comm));
    EXPECT_EQ(total(g), 20215315);
    EXPECT_EQ(total(d), 23089664);
    const std::map<std::string, int64_t> g_want{{"mapping", 5632 + 524800 + 262656},
                                                {"b4", 2894852},
                                                {"b8", 5509125},
                                                {"b16", 5509125},
                                                {"b32", 5509125}};
    const std::map<std::string, int64_t> d_want{
        {"b32", 4721664}, {"b16", 4719616}, {"b8", 4719616}, {"mapping", 2106880}, {"b4", 6821888}};
    EXPECT_EQ(g, g_want);
    EXPECT_EQ(d, d_want);
    EXPECT_EQ(names_of(fam->discriminator(comm)), (std::vector<std::string>{"b32", "b16", "b8", "mapping", "b4"}));
  }
  {  // paper256 conditional on 10 classes (the facts' variant)
    StyleGan2Config c = stylegan2_preset("paper256");
    c.num_classes = 10;
    auto fam = make_stylegan2_family(c);
    EXPECT_EQ(total(numels_by_unit(fam->generator(comm))), 25035234);
    EXPECT_EQ(total(numels_by_unit(fam->discriminator(comm))), 26370112);
  }
}

TEST(StyleGan2Model, EveryParameterAsThePeer) {
  const std::string py = python_path();
  if (access(py.c_str(), X_OK) != 0) GTEST_SKIP() << "no Python at " << py;
  std::vector<StyleGan2Config> cases{stylegan2_preset("paper256"), stylegan2_preset("cifar"), tiny(3, "orig"),
                                     tiny(0, "resnet")};
  cases.back().channels = 1;
  char script[] = "/tmp/stylegan2_peer_shapes_XXXXXX";
  const int fd = mkstemp(script);
  ASSERT_GE(fd, 0);
  close(fd);
  std::ofstream(script) << kPeerShapes;
  std::string cmd = py + " " + script + " " SHARDGAN_SOURCE_DIR "/benchmarks/peers";
  for (const StyleGan2Config& c : cases) {
    std::ostringstream s;
    s << c.resolution << "," << c.channels << "," << c.z_dim << "," << c.w_dim << "," << c.channel_base << ","
      << c.channel_max << "," << c.mapping_layers << "," << c.num_classes << "," << c.d_arch;
    cmd += " " + s.str();
  }
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr) << cmd;
  std::vector<std::vector<std::string>> g_peer, d_peer;  // per case
  bool ended = false;
  char line[512];
  while (std::fgets(line, sizeof line, p)) {
    std::istringstream in(line);
    std::string tag, name, shape;
    in >> tag >> name >> shape;
    if (tag == "case") {
      g_peer.emplace_back();
      d_peer.emplace_back();
    } else if (tag == "end") {
      ended = true;
    } else if (!g_peer.empty() && (tag == "G" || tag == "D")) {
      const int64_t res = cases[g_peer.size() - 1].resolution;
      (tag == "G" ? g_peer : d_peer).back().push_back(our_name(tag, name, res) + " " + shape);
    }
  }
  const int rc = pclose(p);
  std::remove(script);
  ASSERT_EQ(rc, 0) << cmd;
  ASSERT_TRUE(ended) << cmd;
  ASSERT_EQ(g_peer.size(), cases.size());
  LocalCommunicator comm;
  for (size_t i = 0; i < cases.size(); ++i) {
    auto fam = make_stylegan2_family(cases[i]);
    EXPECT_EQ(param_lines(fam->generator(comm)), g_peer[i]) << "G, case " << i;
    EXPECT_EQ(param_lines(fam->discriminator(comm)), d_peer[i]) << "D, case " << i;
  }
}

TEST(StyleGan2Model, ShapesAndBackwardAtFloat64) {
  LocalCommunicator comm;
  for (int64_t classes : {0, 3}) {
    for (const char* arch : {"resnet", "orig"}) {
      auto fam = make_stylegan2_family(tiny(classes, arch));
      auto g = build_f64(fam->generator(comm), comm, 1);
      auto d = build_f64(fam->discriminator(comm), comm, 2);
      std::vector<std::string> g_units, d_units;
      for (auto& u : g->units()) g_units.push_back(u->name());
      for (auto& u : d->units()) d_units.push_back(u->name());
      EXPECT_EQ(g_units, (std::vector<std::string>{"mapping", "b4", "b8", "b16", "b32"}));
      EXPECT_EQ(d_units, classes > 0 ? (std::vector<std::string>{"b32", "b16", "b8", "mapping", "b4"})
                                     : (std::vector<std::string>{"b32", "b16", "b8", "b4"}));
      at::Generator gen = at::detail::createCPUGenerator(7);
      const at::Tensor z = fam->sample_latents(4, gen, at::kDouble);
      const at::Tensor y = fam->sample_labels(4, gen);
      EXPECT_EQ(z.sizes(), (std::vector<int64_t>{4, 2 * 16 + 3}));
      EXPECT_EQ(y.defined(), classes > 0);
      const at::Tensor img = g->forward(TensorList{z, y}).at(0);
      EXPECT_EQ(img.sizes(), (std::vector<int64_t>{4, 3, 32, 32}));
      EXPECT_EQ(img.scalar_type(), at::kDouble);
      EXPECT_TRUE(torch::isfinite(img).all().item<bool>());
      const at::Tensor logits = d->forward(TensorList{img, y}).at(0);
      EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{4}));
      EXPECT_EQ(logits.scalar_type(), at::kDouble);
      torch::nn::functional::softplus(-logits).mean().backward();  // G's non-saturating loss
      for (ShardedModel* m : {g.get(), d.get()}) {
        for (auto& u : m->units()) {
          // Stage 0 keeps the whole gradient in grad_shard() (no reduce-scatter to flag).
          EXPECT_TRUE(torch::isfinite(u->grad_shard()).all().item<bool>()) << m->name() << " " << u->name();
          EXPECT_GT(u->grad_shard().abs().sum().item<double>(), 0.0) << m->name() << " " << u->name();
        }
      }
    }
  }
}

TEST(StyleGan2Model, SampleIndependentOfItsBatch) {
  LocalCommunicator comm;
  const StyleGan2Config cfg = tiny(3);
  auto fam = make_stylegan2_family(cfg);
  auto g = build_f64(fam->generator(comm), comm, 3);
  set_noise_strength(*g, 0.7);  // 0 at init: the noise would not show
  const int64_t num_ws = stylegan2_num_ws(cfg), zc = 2 * cfg.z_dim;
  at::Generator gen = at::detail::createCPUGenerator(11);
  at::Tensor z = fam->sample_latents(3, gen, at::kDouble);
  const at::Tensor y = fam->sample_labels(3, gen);
  z.index_put_({0, zc}, static_cast<double>(num_ws));  // no mixing
  z.index_put_({1, zc}, 3.0);                          // ws 3.. from the mixing latent
  z.index_put_({2, zc}, 5.0);
  torch::NoGradGuard no_grad;
  const at::Tensor batch = g->forward(TensorList{z, y}).at(0);
  EXPECT_TRUE(at::equal(batch, g->forward(TensorList{z, y}).at(0))) << "not deterministic";
  for (int64_t i = 0; i < 3; ++i) {
    const at::Tensor alone = g->forward(TensorList{z.narrow(0, i, 1), y.narrow(0, i, 1)}).at(0);
    EXPECT_LE(rel_diff(alone, batch.narrow(0, i, 1)), 1e-12) << "sample " << i;
  }
  // The noise matters, and comes from the seed column alone.
  at::Tensor z2 = z.clone();
  z2.index_put_({0, zc + 1}, z.index({0, zc + 1}).item<double>() == 7.0 ? 8.0 : 7.0);
  const at::Tensor reseeded = g->forward(TensorList{z2, y}).at(0);
  EXPECT_GT(rel_diff(reseeded.narrow(0, 0, 1), batch.narrow(0, 0, 1)), 1e-6);
  EXPECT_LE(rel_diff(reseeded.narrow(0, 1, 2), batch.narrow(0, 1, 2)), 1e-13);
  // The same ws without noise strength: the seed does not matter.
  set_noise_strength(*g, 0.0);
  EXPECT_TRUE(at::equal(g->forward(TensorList{z2, y}).at(0), g->forward(TensorList{z, y}).at(0)));
}

TEST(StyleGan2Model, CutoffNumWsIsNoMixing) {
  LocalCommunicator comm;
  const StyleGan2Config cfg = tiny(0);
  auto fam = make_stylegan2_family(cfg);
  auto g = build_f64(fam->generator(comm), comm, 4);
  set_noise_strength(*g, 0.5);
  const int64_t num_ws = stylegan2_num_ws(cfg), zd = cfg.z_dim;
  at::Generator gen = at::detail::createCPUGenerator(13);
  at::Tensor z = fam->sample_latents(1, gen, at::kDouble);
  torch::NoGradGuard no_grad;
  auto image = [&](double cutoff, const at::Tensor& mixing_latent) {
    at::Tensor zz = z.clone();
    zz.index_put_({0, 2 * zd}, cutoff);
    zz.narrow(1, zd, zd).copy_(mixing_latent);
    return g->forward(TensorList{zz}).at(0);
  };
  const at::Tensor main = z.narrow(1, 0, zd), other = torch::randn({1, zd}, torch::kDouble);
  const at::Tensor plain = image(num_ws, other);
  EXPECT_TRUE(at::equal(plain, image(num_ws, torch::randn({1, zd}, torch::kDouble))));  // z2 ignored
  EXPECT_LE(rel_diff(image(1, main), plain), 1e-12);  // mixing with itself
  EXPECT_GT(rel_diff(image(3, other), plain), 1e-6);
  // The mapping unit: ws[:, l] from the mixing latent exactly for l >= cutoff.
  const at::Tensor z1 = torch::randn({2, zd}, torch::kDouble), z2 = torch::randn({2, zd}, torch::kDouble);
  const at::Tensor cutoff = torch::tensor({int64_t{2}, num_ws}, torch::kLong);
  const at::Tensor ws = g->unit("mapping").forward(TensorList{z1, at::Tensor(), z2, cutoff}).at(0);
  const at::Tensor w1 = g->unit("mapping").forward(TensorList{z1}).at(0);
  const at::Tensor w2 = g->unit("mapping").forward(TensorList{z2}).at(0);
  ASSERT_EQ(ws.sizes(), (std::vector<int64_t>{2, num_ws, zd}));
  EXPECT_LE(rel_diff(ws.narrow(0, 0, 1).narrow(1, 0, 2), w1.narrow(0, 0, 1).narrow(1, 0, 2)), 1e-12);
  EXPECT_LE(rel_diff(ws.narrow(0, 0, 1).narrow(1, 2, num_ws - 2), w2.narrow(0, 0, 1).narrow(1, 2, num_ws - 2)), 1e-12);
  EXPECT_LE(rel_diff(ws.narrow(0, 1, 1), w1.narrow(0, 1, 1)), 1e-12);
  // z from elsewhere (a plain Gaussian row) is refused, not misread.
  EXPECT_THROW(g->forward(TensorList{torch::randn({2, 2 * zd + 3}, torch::kDouble)}), std::invalid_argument);
}

TEST(StyleGan2Model, WAvgFollowsTheBatchMeanInTraining) {
  LocalCommunicator comm;
  const StyleGan2Config cfg = tiny(0);
  auto fam = make_stylegan2_family(cfg);
  auto g = build_f64(fam->generator(comm), comm, 5);
  at::Tensor w_avg;
  for (auto& [name, b] : g->named_buffers()) {
    if (name == "mapping.w_avg") w_avg = b;
  }
  ASSERT_TRUE(w_avg.defined());
  EXPECT_EQ(w_avg.abs().max().item<double>(), 0.0);
  torch::NoGradGuard no_grad;
  const at::Tensor z = torch::randn({5, cfg.z_dim}, torch::kDouble);
  const at::Tensor w = g->unit("mapping").forward(TensorList{z}).at(0).select(1, 0);
  const at::Tensor want = w.mean(0) * (1 - cfg.w_avg_beta);  // lerp(mean, 0, beta)
  EXPECT_LE(rel_diff(w_avg, want), 1e-12);
  const at::Tensor before = w_avg.clone();
  g->unit("mapping").forward(TensorList{z, at::Tensor(), torch::randn({5, cfg.z_dim}, torch::kDouble),
                                        torch::full({5}, 2, torch::kLong)});
  const at::Tensor want2 = w.mean(0) + cfg.w_avg_beta * (before - w.mean(0));  // the mixing w takes no part
  EXPECT_LE(rel_diff(w_avg, want2), 1e-12);
  g->train(false);
  const at::Tensor kept = w_avg.clone();
  g->unit("mapping").forward(TensorList{z});
  EXPECT_TRUE(at::equal(w_avg, kept));
}

TEST(StyleGan2Model, LatentLayout) {
  auto fam = make_stylegan2_family(tiny(0));
  EXPECT_FALSE(fam->gaussian_latents());
  at::Generator gen = at::detail::createCPUGenerator(17);
  const at::Tensor z = fam->sample_latents(2000, gen, at::kFloat);
  ASSERT_EQ(z.sizes(), (std::vector<int64_t>{2000, 35}));
  EXPECT_TRUE(z.select(1, 34).eq(1).all().item<bool>());  // psi 1: no truncation
  const at::Tensor cutoff = z.select(1, 32).to(at::kDouble), seed = z.select(1, 33).to(at::kDouble);
  EXPECT_TRUE(at::equal(cutoff, cutoff.round()));
  EXPECT_GE(cutoff.min().item<double>(), 1);
  EXPECT_LE(cutoff.max().item<double>(), 8);
  const double mixing = cutoff.lt(8).to(at::kDouble).mean().item<double>();
  EXPECT_NEAR(mixing, 0.5, 0.05);
  EXPECT_TRUE(at::equal(seed, seed.round()));
  EXPECT_GE(seed.min().item<double>(), 0);
  EXPECT_LT(seed.max().item<double>(), 16777216.0);
  EXPECT_GT(seed.max().item<double>(), 1e6);  // spread over the range
  EXPECT_NEAR(z.narrow(1, 0, 32).std().item<double>(), 1.0, 0.02);
  EXPECT_THROW(fam->sample_latents(2, gen, at::kBFloat16), std::invalid_argument);
  auto cifar = make_stylegan2_family(stylegan2_preset("cifar"));  // no mixing
  const at::Tensor zc = cifar->sample_latents(50, gen, at::kDouble);
  EXPECT_TRUE(zc.select(1, 1024).eq(8).all().item<bool>());
}

// Truncation psi in W: sample_truncated_latents sets z's psi column; G (evaluation mode, so
// w_avg stays) gives ws = w_avg + psi (ws at psi 1 - w_avg) per row, and psi 0 gives w_avg
// itself; eval.truncation is accepted for stylegan2.
TEST(StyleGan2Model, TruncationPsiInW) {
  LocalCommunicator self;
  auto fam = make_stylegan2_family(tiny(0));
  EXPECT_TRUE(fam->truncation_applies());
  auto g = build_f64(fam->generator(self), self, 5);
  at::Generator gen = at::detail::createCPUGenerator(9);
  g->forward(TensorList{fam->sample_latents(4, gen, at::kDouble)});  // training mode: w_avg moves off 0
  at::Tensor w_avg;
  for (auto& [name, b] : g->named_buffers()) {
    if (name == "mapping.w_avg") w_avg = b.clone();
  }
  ASSERT_TRUE(w_avg.defined());
  ASSERT_GT(w_avg.abs().max().item<double>(), 0.0);
  g->train(false);
  at::Generator g1 = at::detail::createCPUGenerator(10), g2 = at::detail::createCPUGenerator(10);
  const at::Tensor z = fam->sample_latents(3, g1, at::kDouble);
  const at::Tensor zt = fam->sample_truncated_latents(3, g2, at::kDouble, 0.5);
  const int64_t col = z.size(1) - 1;
  EXPECT_TRUE(zt.select(1, col).eq(0.5).all().item<bool>());
  EXPECT_TRUE(at::equal(zt.narrow(1, 0, col), z.narrow(1, 0, col)));  // the same draw otherwise
  const at::Tensor ws = g->forward(TensorList{z}).at(1), wst = g->forward(TensorList{zt}).at(1);
  const at::Tensor avg = w_avg.view({1, 1, -1});
  EXPECT_LE((wst - (avg + 0.5 * (ws - avg))).abs().max().item<double>(), 1e-12);
  at::Tensor z0 = z.clone();
  z0.select(1, col).fill_(0.0);
  EXPECT_LE((g->forward(TensorList{z0}).at(1) - avg).abs().max().item<double>(), 1e-12);
  at::Tensor bad = z.clone();
  bad.index_put_({0, col}, INFINITY);
  EXPECT_THROW(g->forward(TensorList{bad}), std::invalid_argument);
  EXPECT_THROW(fam->sample_truncated_latents(2, gen, at::kDouble, 0.01), std::invalid_argument);
  EXPECT_NO_THROW(parse_config("model: {arch: stylegan2}\neval: {truncation: 0.7}\n", "test.yaml", {}));
}

TEST(StyleGan2Layers, ResamplingAndDemodulationAsThePeer) {
  torch::manual_seed(3);
  const auto f64 = torch::TensorOptions().dtype(at::kDouble);
  const at::Tensor x = torch::randn({2, 3, 5, 6}, f64);
  // upsample2d: the peer's strided assignment of x into zeros, then the filter x4.
  using at::indexing::None;
  using at::indexing::Slice;
  at::Tensor zeros = torch::zeros({2, 3, 10, 12}, f64);
  zeros.index_put_({Slice(), Slice(), Slice(None, None, 2), Slice(None, None, 2)}, x);
  EXPECT_TRUE(at::equal(sg::upsample2d(x), sg::blur(zeros, 2, 1, 4.0)));
  EXPECT_EQ(sg::downsample2d(torch::randn({2, 3, 8, 8}, f64)).sizes(), (std::vector<int64_t>{2, 3, 4, 4}));
  // Constants stay constant away from the borders.
  const at::Tensor up = sg::upsample2d(torch::ones({1, 1, 6, 6}, f64));
  EXPECT_LE((up.narrow(2, 3, 6).narrow(3, 3, 6) - 1).abs().max().item<double>(), 1e-15);
  const at::Tensor down = sg::downsample2d(torch::ones({1, 1, 8, 8}, f64));
  EXPECT_LE((down.narrow(2, 1, 2).narrow(3, 1, 2) - 1).abs().max().item<double>(), 1e-15);
  // Demodulation: the peer's per-sample weights, summed.
  const at::Tensor w = torch::randn({4, 3, 3, 3}, f64), s = torch::randn({2, 3}, f64);
  const at::Tensor d = ((w.unsqueeze(0) * s.view({2, 1, 3, 1, 1})).square().sum({2, 3, 4}) + 1e-8).rsqrt();
  const at::Tensor plain = at::conv2d(x * s.view({2, 3, 1, 1}), w, {}, {1, 1}, {1, 1});
  EXPECT_LE(rel_diff(sg::modulated_conv2d(x, w, s, true, false), plain * d.view({2, 4, 1, 1})), 1e-13);
  EXPECT_TRUE(at::equal(sg::modulated_conv2d(x, w, s, false, false), plain));
  EXPECT_EQ(sg::modulated_conv2d(x, w, s, true, true).sizes(), (std::vector<int64_t>{2, 4, 10, 12}));
  // Noise: per sample and layer, whatever the batch.
  const at::Tensor seeds = torch::tensor({5, 9, 5}, torch::kLong);
  const at::Tensor n = sg::draw_noise(seeds, 2, 8, f64);
  EXPECT_TRUE(at::equal(n[0], n[2]));
  EXPECT_FALSE(at::equal(n[0], n[1]));
  EXPECT_TRUE(at::equal(n.narrow(0, 1, 1), sg::draw_noise(seeds.narrow(0, 1, 1), 2, 8, f64)));
  EXPECT_FALSE(at::equal(n[0], sg::draw_noise(seeds, 3, 8, f64)[0]));
  // Minibatch stddev: groups of min(G, N) consecutive samples, sample j in group j / G, so
  // a sample's group is the same when the batch is split over ranks in multiples of G.
  const at::Tensor a = torch::randn({4, 2, 3, 3}, f64);
  const at::Tensor m = sg::minibatch_stddev(a, 2, 1);
  ASSERT_EQ(m.sizes(), (std::vector<int64_t>{4, 3, 3, 3}));
  const at::Tensor pair = torch::stack({a[2], a[3]});  // group 1
  const double want = ((pair - pair.mean(0)).square().mean(0) + 1e-8).sqrt().mean().item<double>();
  EXPECT_NEAR(m.index({3, 2, 0, 0}).item<double>(), want, 1e-14);
  EXPECT_NEAR(m.index({2, 2, 2, 1}).item<double>(), want, 1e-14);
  EXPECT_TRUE(at::equal(sg::minibatch_stddev(a.narrow(0, 2, 2), 2, 1), m.narrow(0, 2, 2)));  // group 1 alone
  EXPECT_EQ(sg::minibatch_stddev(torch::randn({3, 2, 4, 4}, f64), 4, 1).sizes(), (std::vector<int64_t>{3, 3, 4, 4}));
  EXPECT_THROW(sg::minibatch_stddev(torch::randn({6, 2, 4, 4}, f64), 4, 1), std::invalid_argument);
}

TEST(StyleGan2Layers, DoubleBackward) {
  torch::manual_seed(4);
  const auto f64 = torch::TensorOptions().dtype(at::kDouble);
  {  // path length: d(sum(img * r)) / d(ws), then the backward of its square
    sg::SynthesisBlock b(8, 4, 16, 16, 3);
    sg::initialize(*b);
    b->to(at::kDouble);
    {
      torch::NoGradGuard no_grad;
      b->conv0->noise_strength.fill_(0.3);
    }
    const at::Tensor x = torch::randn({2, 8, 8, 8}, f64), img = torch::randn({2, 3, 8, 8}, f64);
    const at::Tensor ws = torch::randn({2, 3, 16}, f64).requires_grad_();
    const at::Tensor seeds = torch::tensor({1, 2}, torch::kLong);
    auto [h, out] = b->forward(x, img, ws, {sg::draw_noise(seeds, 1, 16, f64), sg::draw_noise(seeds, 2, 16, f64)});
    const at::Tensor grad = torch::autograd::grad({(out * torch::randn_like(out)).sum()}, {ws}, {}, true, true)[0];
    (grad.square().sum() + out.sum() * 0).backward();  // * 0: torgb's bias is not in the gradient
    for (const auto& kv : b->named_parameters(true)) {
      ASSERT_TRUE(kv.value().grad().defined()) << kv.key();
      EXPECT_TRUE(torch::isfinite(kv.value().grad()).all().item<bool>()) << kv.key();
    }
  }
  {  // R1: d(sum(D(x))) / dx, then the backward of its square
    sg::DiscriminatorBlock blk(true, 4, 8, 3, true);
    sg::DiscriminatorEpilogue epi(8, 8, 2, 1);
    sg::MappingNetwork cmap(0, 3, 8, 2, 0.01, 0.0, nullptr);
    for (torch::nn::Module* m : {static_cast<torch::nn::Module*>(blk.get()), static_cast<torch::nn::Module*>(epi.get()),
                                 static_cast<torch::nn::Module*>(cmap.get())}) {
      sg::initialize(*m);
      m->to(at::kDouble);
    }
    const at::Tensor x = torch::randn({4, 3, 8, 8}, f64).requires_grad_();
    const at::Tensor labels = torch::tensor({0, 1, 2, 1}, torch::kLong);
    const at::Tensor logits = epi->forward(blk->forward(x), cmap->forward({}, labels, false));
    ASSERT_EQ(logits.sizes(), (std::vector<int64_t>{4}));
    const at::Tensor grad = torch::autograd::grad({logits.sum()}, {x}, {}, true, true)[0];
    (grad.square().sum() + logits.sum() * 0).backward();  // * 0: out's bias is not in the gradient
    for (torch::nn::Module* m : {static_cast<torch::nn::Module*>(blk.get()), static_cast<torch::nn::Module*>(epi.get()),
                                 static_cast<torch::nn::Module*>(cmap.get())}) {
      for (const auto& kv : m->named_parameters(true)) {
        ASSERT_TRUE(kv.value().grad().defined()) << kv.key();
        EXPECT_TRUE(torch::isfinite(kv.value().grad()).all().item<bool>()) << kv.key();
      }
    }
  }
}

TEST(StyleGan2Config, BadValuesNameTheKey) {
  const std::vector<std::pair<std::string, std::string>> bad{
      {"model.image_size", "48"},   {"model.image_size", "16"},   {"model.image_size", "2048"},
      {"model.channels", "2"},      {"model.z_dim", "0"},         {"model.w_dim", "0"},
      {"model.n_classes", "-1"},    {"model.channel_base", "16"}, {"model.channel_max", "0"},
      {"model.mapping_layers", "0"}, {"model.d_arch", "skip"},    {"model.mbstd_group", "0"},
      {"model.style_mixing", "1.5"}, {"model.preset", "paper512"}};
  for (const auto& [key, value] : bad) {
    ConfigReader r({{"model.arch", "stylegan2"}, {key, value}}, "test.yaml");
    try {
      make_family(r);
      ADD_FAILURE() << key << " " << value << " accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("'" + key + "'"), std::string::npos) << e.what();
    }
  }
  // From YAML, through the trainer's parser.
  try {
    parse_config("model: {arch: stylegan2, image_size: 48}\n", "test.yaml", {});
    ADD_FAILURE() << "model.image_size 48 accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model.image_size"), std::string::npos) << e.what();
  }
  // Presets set the defaults; keys override them.
  ConfigReader r({{"model.arch", "stylegan2"}, {"model.preset", "cifar"}}, "test.yaml");
  auto cifar = make_family(r);
  EXPECT_STREQ(cifar->arch(), "stylegan2");
  EXPECT_EQ(cifar->num_classes(), 10);
  EXPECT_EQ(cifar->image_shape().channels, 3);
  EXPECT_EQ(cifar->image_shape().height, 32);
  ConfigReader r2({{"model.arch", "stylegan2"}, {"model.preset", "paper256"}, {"model.image_size", "128"}},
                  "test.yaml");
  EXPECT_EQ(make_family(r2)->image_shape().height, 128);
  const TrainConfig def = parse_config("model: {arch: stylegan2}\n", "test.yaml", {});
  EXPECT_STREQ(def.family->arch(), "stylegan2");
  EXPECT_EQ(def.family->image_shape().channels, 1);  // preset fmnist by default
  EXPECT_THROW(stylegan2_preset("paper512"), std::invalid_argument);
  StyleGan2Config c = tiny(0);
  c.mbstd_channels = 3;  // does not divide 32
  EXPECT_THROW(make_stylegan2_family(c), std::invalid_argument);
}

}  // namespace SHARDGAN_UNITY_ID
