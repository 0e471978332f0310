#include "shardgan/models/pix2pix.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include <torch/torch.h>

#include "shardgan/nn/layers.h"
#include "shardgan/nn/sync_batchnorm.h"
#include "shardgan/util/splitmix64.h"

namespace shardgan {
namespace {

namespace nn = torch::nn;

// The authors' init_weights('normal', 0.02): convs N(0, 0.02), norm scales N(1, 0.02),
// biases 0.
void normal_init(nn::Module& m) {
  torch::NoGradGuard g;
  for (auto& kv : m.named_parameters(true)) {
    at::Tensor p = kv.value();
    if (kv.key().find("weight") == std::string::npos) {
      p.zero_();
    } else if (p.dim() == 1) {
      p.normal_(1.0, 0.02);
    } else {
      p.normal_(0.0, 0.02);
    }
  }
}

// Dropout whose mask for sample b comes from a generator seeded with (seeds[b], salt), so
// that it follows the sample and not the rank (see the header). Inverted dropout, as
// torch.nn.Dropout: kept values are scaled by 1 / (1 - p).
at::Tensor seeded_dropout(const at::Tensor& h, const at::Tensor& seeds, uint64_t salt, double p) {
  if (p <= 0) return h;
  if (!seeds.defined() || seeds.scalar_type() != at::kLong || seeds.dim() != 1 || seeds.size(0) != h.size(0)) {
    throw std::invalid_argument("pix2pix G: dropout needs z, int64 [B] seeds (one per sample)");
  }
  const at::Tensor s = seeds.to(at::kCPU).contiguous();
  const int64_t* sp = s.data_ptr<int64_t>();
  at::Tensor mask = torch::empty(h.sizes(), torch::TensorOptions().dtype(at::kFloat));
  for (int64_t b = 0; b < h.size(0); ++b) {
    auto gen = at::detail::createCPUGenerator(splitmix64(static_cast<uint64_t>(sp[b]) ^ splitmix64(salt)));
    mask[b].bernoulli_(1.0 - p, gen);
  }
  return h * mask.to(h.device(), h.scalar_type()) * (1.0 / (1.0 - p));
}

Conv2d conv(int64_t in, int64_t out, int64_t stride, bool bias) {
  return Conv2d(nn::Conv2dOptions(in, out, 4).stride(stride).padding(1).bias(bias));
}

ConvTranspose2d convt(int64_t in, int64_t out, bool bias) {
  return ConvTranspose2d(nn::ConvTranspose2dOptions(in, out, 4).stride(2).padding(1).bias(bias));
}

nn::LeakyReLU leaky_relu_02() { return nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(0.2)); }

UnitSpec seq_unit(std::string name, std::function<nn::Sequential()> build,
                  std::function<TensorList(nn::Sequential&, const TensorList&)> run) {
  return {name, [build, run](bool initialize) {
            nn::Sequential seq = build();
            if (initialize) normal_init(*seq);
            return BuiltUnit{seq.ptr(), [seq, run](const TensorList& in) mutable { return run(seq, in); }};
          }};
}

int64_t levels(const Pix2PixConfig& c) {
  int64_t L = 0;
  while ((int64_t{1} << L) < c.image_size) ++L;
  return L;
}

int64_t enc_width(const Pix2PixConfig& c, int64_t i) { return c.g_width * std::min<int64_t>(int64_t{1} << i, 8); }

ModelSpec generator_spec(const Pix2PixConfig& c, Communicator* comm) {
  const int64_t L = levels(c);
  ModelSpec s{"generator", {}, {}};
  for (int64_t i = 0; i < L; ++i) {
    const int64_t in = i == 0 ? c.in_channels : enc_width(c, i - 1), out = enc_width(c, i);
    const bool norm = i > 0 && i < L - 1;
    s.units.push_back(seq_unit(
        "enc" + std::to_string(i),
        [=] {
          nn::Sequential q;
          if (i > 0) q->push_back(leaky_relu_02());
          q->push_back(conv(in, out, 2, false));
          if (norm) q->push_back(SyncBatchNorm2d(out, comm));
          return q;
        },
        [](nn::Sequential& q, const TensorList& x) { return TensorList{q->forward(x.at(0))}; }));
  }
  for (int64_t i = L - 1; i >= 0; --i) {
    const bool innermost = i == L - 1, outermost = i == 0;
    const int64_t in = innermost ? enc_width(c, i) : 2 * enc_width(c, i);
    const int64_t out = outermost ? c.channels : enc_width(c, i - 1);
    const double p = (L - 1 - i) < c.dropout_blocks && !outermost ? c.dropout : 0.0;
    const auto salt = static_cast<uint64_t>(i);
    const bool at_test = c.test_dropout;
    s.units.push_back(seq_unit(
        "dec" + std::to_string(i),
        [=] {
          nn::Sequential q(nn::ReLU(), convt(in, out, outermost));
          if (outermost) {
            q->push_back(nn::Tanh());
          } else {
            q->push_back(SyncBatchNorm2d(out, comm));
          }
          return q;
        },
        [p, salt, innermost, at_test](nn::Sequential& q, const TensorList& x) {
          // x = {e_i, u_{i+1}, z}; the innermost unit gets {e_i, undefined, z}.
          at::Tensor h = innermost ? x.at(0) : at::cat({x.at(0), x.at(1)}, 1);
          h = q->forward(h);
          const bool drop = p > 0 && (at_test || q->is_training());
          return TensorList{drop ? seeded_dropout(h, x.at(2), salt, p) : h};
        }));
  }
  const int64_t size = c.image_size, cin = c.in_channels;
  s.program = [L, size, cin](ShardedModel& model, const TensorList& in) -> TensorList {
    if (in.size() < 2 || !in[1].defined() || in[1].dim() != 4 || in[1].size(1) != cin || in[1].size(2) != size ||
        in[1].size(3) != size) {
      throw std::invalid_argument("pix2pix G: expects {z int64 [B], A [B, " + std::to_string(cin) + ", " +
                                  std::to_string(size) + ", " + std::to_string(size) + "]}");
    }
    const at::Tensor z = in[0];
    std::vector<at::Tensor> e(static_cast<size_t>(L));
    at::Tensor h = in[1];
    for (int64_t i = 0; i < L; ++i) {
      h = model.unit("enc" + std::to_string(i)).forward(TensorList{h})[0];
      e[static_cast<size_t>(i)] = h;
    }
    at::Tensor u;
    for (int64_t i = L - 1; i >= 0; --i) {
      u = model.unit("dec" + std::to_string(i)).forward(TensorList{e[static_cast<size_t>(i)], u, z})[0];
    }
    return {u};
  };
  return s;
}

ModelSpec discriminator_spec(const Pix2PixConfig& c, Communicator* comm) {
  ModelSpec s{"discriminator", {}, {}};
  const int64_t in0 = c.in_channels + c.channels;
  s.units.push_back(seq_unit(
      "block0", [=] { return nn::Sequential(conv(in0, c.d_width, 2, true), leaky_relu_02()); },
      [](nn::Sequential& q, const TensorList& x) { return TensorList{q->forward(x.at(0))}; }));
  int64_t width = c.d_width;
  for (int64_t k = 1; k <= c.d_layers; ++k) {
    const int64_t out = c.d_width * std::min<int64_t>(int64_t{1} << k, 8), in = width;
    const int64_t stride = k < c.d_layers ? 2 : 1;
    s.units.push_back(seq_unit(
        "block" + std::to_string(k),
        [=] { return nn::Sequential(conv(in, out, stride, false), SyncBatchNorm2d(out, comm), leaky_relu_02()); },
        [](nn::Sequential& q, const TensorList& x) { return TensorList{q->forward(x.at(0))}; }));
    width = out;
  }
  s.units.push_back(seq_unit(
      "out", [=] { return nn::Sequential(conv(width, 1, 1, true)); },
      [](nn::Sequential& q, const TensorList& x) { return TensorList{q->forward(x.at(0))}; }));
  const int64_t n = c.d_layers, cin = c.in_channels, cx = c.channels;
  s.program = [n, cin, cx](ShardedModel& model, const TensorList& in) -> TensorList {
    if (in.size() < 2 || !in[0].defined() || !in[1].defined() || in[0].dim() != 4 || in[1].dim() != 4 ||
        in[0].size(1) != cx || in[1].size(1) != cin || in[0].size(0) != in[1].size(0)) {
      throw std::invalid_argument("pix2pix D: expects {x [B, " + std::to_string(cx) + ", H, W], A [B, " +
                                  std::to_string(cin) + ", H, W]}");
    }
    // (A, B) in the authors' order; A comes from the host when D is on a GPU.
    at::Tensor h = at::cat({in[1].to(in[0].device(), in[0].scalar_type()), in[0]}, 1);
    for (int64_t k = 0; k <= n; ++k) h = model.unit("block" + std::to_string(k)).forward(TensorList{h})[0];
    return {model.unit("out").forward(TensorList{h})[0]};
  };
  return s;
}

class Pix2PixFamily final : public ModelFamily {
 public:
  explicit Pix2PixFamily(Pix2PixConfig cfg) : cfg_(cfg) {}
  const char* arch() const override { return "pix2pix"; }
  ModelSpec generator(Communicator& comm) const override { return generator_spec(cfg_, &comm); }
  ModelSpec discriminator(Communicator& comm) const override { return discriminator_spec(cfg_, &comm); }
  ImageShape image_shape() const override { return {cfg_.channels, cfg_.image_size, cfg_.image_size}; }
  int64_t num_classes() const override { return 0; }
  int64_t condition_channels() const override { return cfg_.in_channels; }
  bool gaussian_latents() const override { return false; }
  /// One dropout seed per sample, int64 [n] (the dtype is not used).
  at::Tensor sample_latents(int64_t n, at::Generator& gen, at::ScalarType /*dtype*/) const override {
    return at::randint(int64_t{1} << 62, {n}, gen, torch::TensorOptions().dtype(at::kLong));
  }

 private:
  Pix2PixConfig cfg_;
};

}  // namespace

std::unique_ptr<ModelFamily> make_pix2pix_family(const Pix2PixConfig& cfg) {
  return std::make_unique<Pix2PixFamily>(cfg);
}

std::unique_ptr<ModelFamily> make_pix2pix_family(ConfigReader& r) {
  Pix2PixConfig c;
  c.image_size = r.get<int64_t>("model.image_size", c.image_size,
      "pix2pix: image side in pixels, a power of two (G has log2 of it U-Net levels: 32 -> 5, 256 -> 8)");
  const bool pow2 = c.image_size >= 8 && c.image_size <= 1024 && (c.image_size & (c.image_size - 1)) == 0;
  r.require(pow2, "model.image_size", "must be a power of two from 8 to 1024 for model.arch pix2pix");
  c.g_width = r.get<int64_t>("model.g_width", c.g_width, "DCGAN: G's base channel width; pix2pix: ngf");
  r.require(c.g_width > 0 && c.g_width <= 65536, "model.g_width", "must be 1 to 65536 (keeps element counts in int64)");
  c.d_width = r.get<int64_t>("model.d_width", c.d_width, "DCGAN: D's base channel width; pix2pix: ndf");
  r.require(c.d_width > 0 && c.d_width <= 65536, "model.d_width", "must be 1 to 65536 (keeps element counts in int64)");
  c.d_layers = r.get<int64_t>("model.d_layers", c.d_layers,
      "pix2pix: PatchGAN D's strided blocks (3: 70x70 patches; 1: 16x16)");
  int64_t L = 0;
  while ((int64_t{1} << L) < c.image_size) ++L;
  r.require(c.d_layers >= 1 && c.d_layers <= L - 2, "model.d_layers",
            "must be 1 to log2(model.image_size) - 2 (D's output must be at least 1 pixel)");
  c.in_channels = r.get<int64_t>("model.in_channels", c.in_channels, "pix2pix: channels of the input image A, 1 or 3");
  r.require(c.in_channels == 1 || c.in_channels == 3, "model.in_channels", "must be 1 or 3");
  c.channels = r.get<int64_t>("model.channels", c.channels, "image channels, 1 or 3");
  r.require(c.channels == 1 || c.channels == 3, "model.channels", "must be 1 or 3");
  c.dropout = r.get<double>("model.dropout", c.dropout, "pix2pix: dropout rate of G's first decoder units");
  r.require(c.dropout >= 0 && c.dropout < 1, "model.dropout", "must be in [0, 1)");
  c.dropout_blocks = r.get<int64_t>("model.dropout_blocks", c.dropout_blocks,
      "pix2pix: G decoder units with dropout, from the innermost (the paper: 3)");
  r.require(c.dropout_blocks >= 0 && c.dropout_blocks < L, "model.dropout_blocks",
            "must be 0 to log2(model.image_size) - 1 (the decoder units but the last)");
  c.test_dropout = r.get<bool>("model.test_dropout", c.test_dropout,
      "pix2pix: dropout also when G runs in eval mode (the paper's test-time noise)");
  return make_pix2pix_family(c);
}

}  // namespace shardgan
