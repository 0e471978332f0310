#include "shardgan/models/stylegan2.h"

#include <cmath>
#include <functional>
#include <stdexcept>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "models/stylegan2/layers.h"

namespace shardgan {
namespace stylegan2 {
namespace {

using Require = std::function<void(bool, const std::string&, const std::string&)>;

constexpr int64_t kMaxDim = int64_t{1} << 16;
constexpr int64_t kSeedLimit = int64_t{1} << 24;  // noise seeds, exact in float32

bool is_pow2(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

// The checks of the keys make_stylegan2_family(ConfigReader&) reads.
void validate_keys(const StyleGan2Config& c, const Require& require) {
  require(c.resolution >= 32 && c.resolution <= 1024 && is_pow2(c.resolution), "model.image_size",
          "must be a power of two from 32 to 1024 for model.arch stylegan2");
  require(c.channels == 1 || c.channels == 3, "model.channels", "must be 1 or 3");
  require(c.z_dim > 0 && c.z_dim <= kMaxDim, "model.z_dim", "must be 1 to 65536 (keeps element counts in int64)");
  require(c.w_dim > 0 && c.w_dim <= kMaxDim, "model.w_dim", "must be 1 to 65536");
  require(c.num_classes >= 0 && c.num_classes <= (1 << 20), "model.n_classes",
          "must be 0 (unconditional) to 1048576 for model.arch stylegan2");
  require(c.channel_base >= c.resolution && c.channel_base <= (int64_t{1} << 30), "model.channel_base",
          "must be model.image_size (one channel at the image resolution) to 2^30");
  require(c.channel_max > 0 && c.channel_max <= kMaxDim, "model.channel_max", "must be 1 to 65536");
  require(c.mapping_layers >= 1 && c.mapping_layers <= 64, "model.mapping_layers", "must be 1 to 64");
  require(c.d_arch == "resnet" || c.d_arch == "orig", "model.d_arch", "must be resnet or orig");
  require(c.mbstd_group >= 1 && c.mbstd_group <= kMaxDim, "model.mbstd_group", "must be 1 to 65536");
  require(c.style_mixing >= 0 && c.style_mixing <= 1, "model.style_mixing", "must be in [0, 1]");
}

// Every field: the keyed ones, then those without a key (named as fields).
void validate_all(const StyleGan2Config& c) {
  auto fail = [](bool ok, const std::string& key, const std::string& what) {
    if (!ok) throw std::invalid_argument("StyleGAN2: `" + key + "` " + what);
  };
  validate_keys(c, fail);
  const int64_t c4 = stylegan2_channels(c, 4);
  fail(c.mbstd_channels >= 1 && c.mbstd_channels <= c4 && c4 % c.mbstd_channels == 0, "mbstd_channels",
       "must divide the channels at 4x4 (" + std::to_string(c4) + ")");
  fail(c.w_avg_beta >= 0 && c.w_avg_beta < 1, "w_avg_beta", "must be in [0, 1) (0: no w_avg)");
  fail(c.mapping_lr_mult > 0 && c.mapping_lr_mult <= 1, "mapping_lr_mult", "must be in (0, 1]");
  fail(c.d_mapping_layers >= 1 && c.d_mapping_layers <= 64, "d_mapping_layers", "must be 1 to 64");
}

// A unit whose module is `make_module()`, given the authors' initialization when asked.
template <typename Holder, typename MakeModule, typename Run>
UnitSpec sg2_unit(std::string name, MakeModule make_module, Run run) {
  return UnitSpec{std::move(name), [=](bool init) {
                    Holder m = make_module();
                    if (init) stylegan2::initialize(*m);
                    return BuiltUnit{m.ptr(), [m, run](const TensorList& in) mutable { return run(m, in); }};
                  }};
}

at::Tensor input_or_none(const TensorList& in, size_t i) { return in.size() > i ? in[i] : at::Tensor(); }

// Truncation in W (Karras et al. 2019, StyleGAN, Sec. 4 and Appendix B): w_avg + psi (w -
// w_avg) per sample, psi [B]; w unchanged without psi.
at::Tensor truncate_w(MappingNetworkImpl& m, const at::Tensor& w, const at::Tensor& psi) {
  if (!psi.defined()) return w;
  if (!m.w_avg.defined()) throw std::invalid_argument("StyleGAN2 mapping: truncation psi needs the tracked w_avg");
  const at::Tensor avg = m.w_avg.to(w.dtype()).unsqueeze(0);
  return avg + psi.to(w.dtype()).view({-1, 1}) * (w - avg);
}

// G's "mapping" unit: {z, y, z mixing, cutoff, psi} -> ws [B, num_ws, w_dim] (see stylegan2.h).
at::Tensor mapping_ws(MappingNetworkImpl& m, const TensorList& in, int64_t num_ws) {
  const at::Tensor y = input_or_none(in, 1), z2 = input_or_none(in, 2), cutoff = input_or_none(in, 3);
  const at::Tensor psi = input_or_none(in, 4);
  // w_avg first takes this batch's mean (training mode), then truncation uses it, as the
  // authors' mapping network does.
  const at::Tensor w = truncate_w(m, m.forward(input_or_none(in, 0), y, /*update_w_avg=*/true), psi);
  if (!z2.defined()) return w.unsqueeze(1).expand({-1, num_ws, -1});
  if (!cutoff.defined()) throw std::invalid_argument("StyleGAN2 mapping: a mixing latent needs its cutoff");
  // The mixing latent's w takes no part in w_avg (as the authors' second mapping call).
  const at::Tensor w2 = truncate_w(m, m.forward(z2, y, /*update_w_avg=*/false), psi);
  const at::Tensor layer = at::arange(num_ws, cutoff.options().dtype(at::kLong)).view({1, num_ws, 1});
  const at::Tensor mixed = layer >= cutoff.to(at::kLong).view({-1, 1, 1});
  return at::where(mixed, w2.unsqueeze(1), w.unsqueeze(1));
}

struct SynthesisStep {
  std::string name;
  int64_t w_index;   // the first ws the block takes (= the noise layer of its first conv)
  int64_t num_conv;  // it takes num_conv + 1 ws
};

ModelSpec generator_spec(const StyleGan2Config& c, Communicator* comm) {
  ModelSpec spec;
  spec.name = "generator";
  const int64_t num_ws = stylegan2_num_ws(c), z_dim = c.z_dim;
  spec.units.push_back(sg2_unit<MappingNetwork>(
      "mapping",
      [=] {
        return MappingNetwork(c.z_dim, c.num_classes, c.w_dim, c.mapping_layers, c.mapping_lr_mult, c.w_avg_beta,
                              comm);
      },
      [num_ws](MappingNetwork& m, const TensorList& in) { return TensorList{mapping_ws(*m, in, num_ws)}; }));
  std::vector<SynthesisStep> steps;
  int64_t w_index = 0;
  for (int64_t res = 4; res <= c.resolution; res *= 2) {
    const int64_t in = res == 4 ? 0 : stylegan2_channels(c, res / 2), out = stylegan2_channels(c, res);
    const int64_t nc = res == 4 ? 1 : 2, w_dim = c.w_dim, channels = c.channels;
    const std::string name = std::string("b").append(std::to_string(res));  // (GCC 12 warns on "b" + to_string)
    spec.units.push_back(sg2_unit<SynthesisBlock>(
        name, [=] { return SynthesisBlock(in, out, w_dim, res, channels); },
        [w_index, nc, res](SynthesisBlock& b, const TensorList& x) {
          const at::Tensor& ws = x.at(2);
          const at::Tensor seeds = input_or_none(x, 3);
          std::vector<at::Tensor> noise(static_cast<size_t>(nc));
          if (seeds.defined()) {
            for (int64_t j = 0; j < nc; ++j) noise[j] = draw_noise(seeds, w_index + j, res, ws.options());
          }
          auto [h, img] = b->forward(x.at(0), x.at(1), ws, noise);
          return TensorList{h, img};
        }));
    steps.push_back({name, w_index, nc});
    w_index += nc;
  }
  const bool conditional = c.num_classes > 0;
  const int64_t latent_dim = stylegan2_latent_dim(c);  // 2 z_dim + 3: the columns below
  spec.program = [steps, num_ws, z_dim, latent_dim, conditional](ShardedModel& model,
                                                                 const TensorList& in) -> TensorList {
    if (in.empty() || !in[0].defined()) {
      throw std::invalid_argument("StyleGAN2 G: expects {z [B, 2 z_dim + 3], y}");
    }
    const at::Tensor& z = in[0];
    if (z.dim() != 2 || z.size(1) != latent_dim || !z.is_floating_point()) {
      throw std::invalid_argument("StyleGAN2 G: z must be floating [B, " + std::to_string(latent_dim) +
                                  "] (sample_latents), not " + c10::str(z.sizes()));
    }
    at::Tensor y = input_or_none(in, 1);
    if (conditional && !y.defined()) throw std::invalid_argument("StyleGAN2 G: a conditional G needs y int64 [B]");
    if (!conditional) y = at::Tensor();
    // The control columns, read exactly (in the program, before a unit casts z to a 16-bit
    // compute dtype).
    const at::Tensor ctrl = z.narrow(1, 2 * z_dim, 3).to(at::kDouble);
    const at::Tensor ints = ctrl.narrow(1, 0, 2);
    const at::Tensor cutoff_f = ctrl.select(1, 0), seed_f = ctrl.select(1, 1), psi_f = ctrl.select(1, 2);
    // Every verdict on the control columns in one host read: the integer columns' range,
    // psi's finiteness, whether any row mixes, and whether any row is truncated (psi != 1).
    const at::Tensor flags =
        at::stack({(ints != ints.round()).any().logical_or(cutoff_f.lt(1).any()).logical_or(cutoff_f.gt(num_ws).any())
                       .logical_or(seed_f.lt(0).any()).logical_or(seed_f.ge(static_cast<double>(kSeedLimit)).any()),
                   psi_f.isfinite().all().logical_not(), cutoff_f.lt(num_ws).any(), psi_f.ne(1).any()})
            .to(at::kCPU)
            .contiguous();
    const bool* f = flags.data_ptr<bool>();
    if (f[0]) {
      throw std::invalid_argument("StyleGAN2 G: z's column " + std::to_string(2 * z_dim) +
                                  " must hold integer mixing cutoffs in [1, " + std::to_string(num_ws) +
                                  "] and column " + std::to_string(2 * z_dim + 1) +
                                  " integer noise seeds in [0, 2^24) (sample_latents)");
    }
    if (f[1]) {
      throw std::invalid_argument("StyleGAN2 G: z's column " + std::to_string(2 * z_dim + 2) +
                                  " must hold finite truncation psi values (1: none)");
    }
    const at::Tensor cutoff = cutoff_f.to(at::kLong), seeds = seed_f.to(at::kLong);
    const bool mixing = f[2];
    // Truncation psi (column 2 z_dim + 2; 1 = none): passed on only when some row has it, so
    // that an untruncated batch takes no lerp at all.
    const at::Tensor psi = f[3] ? psi_f.contiguous() : at::Tensor();
    const at::Tensor ws =
        model.unit("mapping")
            .forward(TensorList{z.narrow(1, 0, z_dim), y, mixing ? z.narrow(1, z_dim, z_dim) : at::Tensor(),
                                mixing ? cutoff : at::Tensor(), psi})
            .at(0);
    at::Tensor x, img;
    for (const SynthesisStep& s : steps) {
      TensorList out = model.unit(s.name).forward(TensorList{x, img, ws.narrow(1, s.w_index, s.num_conv + 1), seeds});
      x = out.at(0);
      img = out.at(1);
    }
    return {img, ws};
  };
  return spec;
}

ModelSpec discriminator_spec(const StyleGan2Config& c) {
  ModelSpec spec;
  spec.name = "discriminator";
  const bool resnet = c.d_arch == "resnet";
  std::vector<std::string> order;
  for (int64_t res = c.resolution; res >= 8; res /= 2) {
    const bool first = res == c.resolution;
    const int64_t tmp = stylegan2_channels(c, res), out = stylegan2_channels(c, res / 2), channels = c.channels;
    order.push_back(std::string("b").append(std::to_string(res)));
    spec.units.push_back(sg2_unit<DiscriminatorBlock>(
        order.back(), [=] { return DiscriminatorBlock(first, tmp, out, channels, resnet); },
        [](DiscriminatorBlock& b, const TensorList& x) { return TensorList{b->forward(x.at(0))}; }));
  }
  const int64_t c4 = stylegan2_channels(c, 4), classes = c.num_classes;
  const int64_t cmap_dim = classes > 0 ? c4 : 0;
  if (classes > 0) {
    const int64_t layers = c.d_mapping_layers;
    const double lr_mult = c.mapping_lr_mult;
    spec.units.push_back(sg2_unit<MappingNetwork>(
        "mapping", [=] { return MappingNetwork(0, classes, cmap_dim, layers, lr_mult, 0.0, nullptr); },
        [](MappingNetwork& m, const TensorList& x) {
          return TensorList{m->forward(at::Tensor(), x.at(0), /*update_w_avg=*/false)};
        }));
  }
  const int64_t group = c.mbstd_group, mbstd_channels = c.mbstd_channels;
  spec.units.push_back(sg2_unit<DiscriminatorEpilogue>(
      "b4", [=] { return DiscriminatorEpilogue(c4, cmap_dim, group, mbstd_channels); },
      [](DiscriminatorEpilogue& e, const TensorList& x) {
        return TensorList{e->forward(x.at(0), input_or_none(x, 1))};
      }));
  const int64_t res = c.resolution, channels = c.channels;
  spec.program = [order, res, channels, classes](ShardedModel& model, const TensorList& in) -> TensorList {
    if (in.empty() || !in[0].defined() || in[0].dim() != 4 || in[0].size(1) != channels || in[0].size(2) != res ||
        in[0].size(3) != res) {
      throw std::invalid_argument("StyleGAN2 D: expects {x [B, " + std::to_string(channels) + ", " +
                                  std::to_string(res) + ", " + std::to_string(res) + "], y}");
    }
    const at::Tensor y = input_or_none(in, 1);
    if (classes > 0 && !y.defined()) throw std::invalid_argument("StyleGAN2 D: a conditional D needs y int64 [B]");
    at::Tensor h = in[0];
    for (const std::string& name : order) h = model.unit(name).forward(TensorList{h}).at(0);
    const at::Tensor cmap = classes > 0 ? model.unit("mapping").forward(TensorList{y}).at(0) : at::Tensor();
    return {model.unit("b4").forward(TensorList{h, cmap}).at(0)};
  };
  return spec;
}

class StyleGan2Family final : public ModelFamily {
 public:
  explicit StyleGan2Family(StyleGan2Config cfg) : cfg_(std::move(cfg)) { validate_all(cfg_); }
  const char* arch() const override { return "stylegan2"; }
  ModelSpec generator(Communicator& comm) const override { return generator_spec(cfg_, &comm); }
  ModelSpec discriminator(Communicator& /*comm*/) const override { return discriminator_spec(cfg_); }
  ImageShape image_shape() const override { return {cfg_.channels, cfg_.resolution, cfg_.resolution}; }
  int64_t num_classes() const override { return cfg_.num_classes; }
  bool gaussian_latents() const override { return false; }
  bool truncation_applies() const override { return true; }
  /// See stylegan2.h: sample_latents with the psi column set to `truncation` (> 0).
  at::Tensor sample_truncated_latents(int64_t n, at::Generator& gen, at::ScalarType dtype,
                                      double truncation) const override {
    at::Tensor z = sample_latents(n, gen, dtype);
    if (truncation <= 0) return z;
    if (truncation < 0.05 || !std::isfinite(truncation)) {
      throw std::invalid_argument("truncation psi " + std::to_string(truncation) + " is below 0.05 or not finite");
    }
    z.select(1, 2 * cfg_.z_dim + 2).fill_(truncation);
    return z;
  }
  bool separate_regularization() const override { return true; }
  bool generator_returns_styles() const override { return true; }
  /// See stylegan2.h: [n, 2 z_dim + 3], float32 or float64 (std::invalid_argument otherwise).
  at::Tensor sample_latents(int64_t n, at::Generator& gen, at::ScalarType dtype) const override {
    if (dtype != at::kFloat && dtype != at::kDouble) {
      throw std::invalid_argument("StyleGAN2: latents are float32 or float64 (their noise seeds must be exact)");
    }
    const int64_t num_ws = stylegan2_num_ws(cfg_);
    const auto opts = torch::TensorOptions().dtype(dtype);
    const at::Tensor z = at::randn({n, 2 * cfg_.z_dim}, gen, opts);
    at::Tensor cutoff = at::full({n}, num_ws, torch::TensorOptions().dtype(at::kLong));
    if (cfg_.style_mixing > 0) {  // as the authors' loss: a layer in [1, num_ws), kept with the probability
      const at::Tensor keep = at::rand({n}, gen, torch::TensorOptions().dtype(at::kDouble)).lt(cfg_.style_mixing);
      cutoff = at::where(keep, at::randint(1, num_ws, {n}, gen, at::kLong), cutoff);
    }
    const at::Tensor seeds = at::randint(0, kSeedLimit, {n}, gen, at::kLong);
    return at::cat({z, cutoff.to(dtype).unsqueeze(1), seeds.to(dtype).unsqueeze(1), at::ones({n, 1}, opts)}, 1);
  }

 private:
  StyleGan2Config cfg_;
};

}  // namespace
}  // namespace stylegan2

StyleGan2Config stylegan2_preset(const std::string& name) {
  StyleGan2Config c;
  if (name == "none") return c;
  if (name == "paper256") {  // FFHQ / LSUN Cat at 256: fmaps 0.5, map 8, mbstd 8
    c.resolution = 256;
    c.channels = 3;
    c.channel_base = 16384;
    c.mapping_layers = 8;
    c.d_arch = "resnet";
    c.mbstd_group = 8;
    c.style_mixing = 0.9;
    return c;
  }
  if (name == "cifar") {  // CIFAR-10, conditional: fmaps 1, map 2, mbstd 32, D orig, no mixing
    c.resolution = 32;
    c.channels = 3;
    c.num_classes = 10;
    c.channel_base = 32768;
    c.mapping_layers = 2;
    c.d_arch = "orig";
    c.mbstd_group = 32;
    c.style_mixing = 0;
    return c;
  }
  if (name == "fmnist") {  // ours: Fashion-MNIST at 32x32, 128 channels throughout
    c.resolution = 32;
    c.channels = 1;
    c.channel_base = 8192;
    c.channel_max = 128;
    c.mapping_layers = 2;
    c.d_arch = "resnet";
    c.mbstd_group = 4;
    c.style_mixing = 0.9;
    return c;
  }
  throw std::invalid_argument("StyleGAN2: no preset '" + name + "' (paper256, cifar, fmnist or none)");
}

int64_t stylegan2_channels(const StyleGan2Config& cfg, int64_t res) {
  return std::min(cfg.channel_base / res, cfg.channel_max);
}

int64_t stylegan2_num_ws(const StyleGan2Config& cfg) {
  int64_t log2 = 0;
  while ((int64_t{1} << (log2 + 1)) <= cfg.resolution) ++log2;
  return 2 * log2 - 2;
}

int64_t stylegan2_latent_dim(const StyleGan2Config& cfg) { return 2 * cfg.z_dim + 3; }

std::unique_ptr<ModelFamily> make_stylegan2_family(const StyleGan2Config& cfg) {
  return std::make_unique<stylegan2::StyleGan2Family>(cfg);
}

std::unique_ptr<ModelFamily> make_stylegan2_family(ConfigReader& r) {
  // fmnist by default: the project's default data (Fashion-MNIST, 1 channel, 32x32), as the
  // other families' defaults.
  const std::string preset = r.get<std::string>("model.preset", "fmnist",
      "StyleGAN2: the configuration that sets the defaults of the other model.* keys: paper256, cifar "
      "(StyleGAN2-ADA's --cfg), fmnist (ours: 32x32, 1 channel, 128 channels) or none (the authors' network "
      "defaults at 32x32, 3 channels)");
  r.require(preset == "paper256" || preset == "cifar" || preset == "fmnist" || preset == "none", "model.preset",
            "must be paper256, cifar, fmnist or none");
  StyleGan2Config c = stylegan2_preset(preset);
  c.resolution = r.get<int64_t>("model.image_size", c.resolution,
      "image side in pixels; DCGAN: 32 to 256, pix2pix: 8 to 1024 (powers of two)");
  c.channels = r.get<int64_t>("model.channels", c.channels, "image channels, 1 or 3");
  c.z_dim = r.get<int64_t>("model.z_dim", c.z_dim, "latent size (BigGAN: divisible by the number of G resolutions)");
  c.w_dim = r.get<int64_t>("model.w_dim", c.w_dim,
      "StyleGAN2: size of the intermediate latent w (the mapping's output)");
  c.num_classes = r.get<int64_t>("model.n_classes", c.num_classes, "BigGAN: number of classes");
  c.channel_base = r.get<int64_t>("model.channel_base", c.channel_base,
      "StyleGAN2: the channels at resolution r are min(channel_base / r, channel_max) (the authors: fmaps x 32768)");
  c.channel_max = r.get<int64_t>("model.channel_max", c.channel_max, "StyleGAN2: the most channels of any layer");
  c.mapping_layers = r.get<int64_t>("model.mapping_layers", c.mapping_layers,
      "StyleGAN2: fully connected layers of G's mapping network (the authors: 8; cifar: 2)");
  c.d_arch = r.get<std::string>("model.d_arch", c.d_arch,
      "StyleGAN2: D's architecture, resnet (1x1 skips, the authors' default) or orig (no skips, cifar)");
  c.mbstd_group = r.get<int64_t>("model.mbstd_group", c.mbstd_group,
      "StyleGAN2: minibatch-stddev group size of D (min(group, per-rank batch) must divide the per-rank batch)");
  c.style_mixing = r.get<double>("model.style_mixing", c.style_mixing,
      "StyleGAN2: probability that a latent mixes the ws of two latents from a random layer on (cifar: 0)");
  stylegan2::validate_keys(c, [&r](bool ok, const std::string& key, const std::string& what) {
    r.require(ok, key, what);
  });
  return make_stylegan2_family(c);
}

}  // namespace shardgan
