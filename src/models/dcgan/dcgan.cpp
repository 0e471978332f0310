#include "shardgan/models/dcgan.h"

#include <torch/torch.h>

#include "shardgan/nn/layers.h"
#include "shardgan/nn/sync_batchnorm.h"

namespace shardgan {
namespace {

namespace nn = torch::nn;

void dcgan_init(nn::Module& m) {
  torch::NoGradGuard g;
  for (auto& kv : m.named_parameters(true)) {
    const std::string& name = kv.key();
    at::Tensor p = kv.value();
    const bool is_bn = name.find("weight") != std::string::npos && p.dim() == 1;
    if (is_bn) {
      p.normal_(1.0, 0.02);
    } else if (name.find("weight") != std::string::npos) {
      p.normal_(0.0, 0.02);
    } else {
      p.zero_();
    }
  }
}

// A unit made of a Sequential that `build` returns.
UnitSpec seq_unit(std::string name, std::function<nn::Sequential()> build) {
  return {name, [build](bool initialize) {
            nn::Sequential seq = build();
            if (initialize) dcgan_init(*seq);
            return BuiltUnit{seq.ptr(), ShardedUnit::single([seq](const at::Tensor& x) mutable {
                               return seq->forward(x);
                             })};
          }};
}

ConvTranspose2d up(int64_t in, int64_t out, int64_t stride, int64_t pad) {
  return ConvTranspose2d(nn::ConvTranspose2dOptions(in, out, 4).stride(stride).padding(pad).bias(false));
}

Conv2d down(int64_t in, int64_t out, int64_t stride, int64_t pad) {
  return Conv2d(nn::Conv2dOptions(in, out, 4).stride(stride).padding(pad).bias(false));
}

nn::LeakyReLU lrelu() { return nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(0.2)); }

// Number of stride-2 blocks between 4x4 and the image: log2(image_size) - 2 (3 at 32).
int64_t up_blocks(const DcganConfig& cfg) {
  int64_t n = 0;
  while ((int64_t{4} << n) < cfg.image_size) ++n;
  return n;
}

ModelSpec generator_spec(const DcganConfig& cfg, Communicator* c) {
  const int64_t w = cfg.g_width, z = cfg.z_dim, ch = cfg.channels, L = up_blocks(cfg);
  ModelSpec s{"generator", {}, {}};
  // Widths w 2^(L-1), ..., 2w, w at 4x4, 8x8, ..., image_size / 2; then the image.
  const int64_t top = w << (L - 1);
  s.units.push_back(seq_unit("block0", [=] { return nn::Sequential(up(z, top, 1, 0), SyncBatchNorm2d(top, c), nn::ReLU()); }));
  for (int64_t i = 1; i < L; ++i) {
    const int64_t in = w << (L - i), out = w << (L - 1 - i);
    s.units.push_back(seq_unit("block" + std::to_string(i), [=] {
      return nn::Sequential(up(in, out, 2, 1), SyncBatchNorm2d(out, c), nn::ReLU());
    }));
  }
  s.units.push_back(seq_unit("out", [=] { return nn::Sequential(up(w, ch, 2, 1), nn::Tanh()); }));
  return s;
}

ModelSpec discriminator_spec(const DcganConfig& cfg, Communicator* c) {
  const int64_t w = cfg.d_width, ch = cfg.channels, L = up_blocks(cfg);
  ModelSpec s{"discriminator", {}, {}};
  s.units.push_back(seq_unit("block0", [=] { return nn::Sequential(down(ch, w, 2, 1), lrelu()); }));
  for (int64_t i = 1; i < L; ++i) {
    const int64_t in = w << (i - 1), out = w << i;
    s.units.push_back(seq_unit("block" + std::to_string(i), [=] {
      return nn::Sequential(down(in, out, 2, 1), SyncBatchNorm2d(out, c), lrelu());
    }));
  }
  const int64_t last = w << (L - 1);
  s.units.push_back(seq_unit("out", [=] { return nn::Sequential(down(last, 1, 1, 0), nn::Flatten()); }));
  return s;
}

class DcganFamily final : public ModelFamily {
 public:
  explicit DcganFamily(DcganConfig cfg) : cfg_(cfg) {}
  const char* arch() const override { return "dcgan"; }
  ModelSpec generator(Communicator& comm) const override { return generator_spec(cfg_, &comm); }
  ModelSpec discriminator(Communicator& comm) const override { return discriminator_spec(cfg_, &comm); }
  ImageShape image_shape() const override { return {cfg_.channels, cfg_.image_size, cfg_.image_size}; }
  int64_t num_classes() const override { return 0; }
  at::Tensor sample_latents(int64_t n, at::Generator& gen, at::ScalarType dtype) const override {
    return at::randn({n, cfg_.z_dim, 1, 1}, gen, torch::TensorOptions().dtype(dtype));
  }

 private:
  DcganConfig cfg_;
};

}  // namespace

std::unique_ptr<ModelFamily> make_dcgan_family(const DcganConfig& cfg) {
  return std::make_unique<DcganFamily>(cfg);
}

std::unique_ptr<ModelFamily> make_dcgan_family(ConfigReader& r) {
  DcganConfig c;
  c.z_dim = r.get<int64_t>("model.z_dim", c.z_dim, "latent size (BigGAN: divisible by the number of G resolutions)");
  r.require(c.z_dim > 0 && c.z_dim <= 65536, "model.z_dim", "must be 1 to 65536 (keeps element counts in int64)");
  c.g_width = r.get<int64_t>("model.g_width", c.g_width, "DCGAN: G's base channel width; pix2pix: ngf");
  r.require(c.g_width > 0 && c.g_width <= 65536, "model.g_width", "must be 1 to 65536 (keeps element counts in int64)");
  c.d_width = r.get<int64_t>("model.d_width", c.d_width, "DCGAN: D's base channel width; pix2pix: ndf");
  r.require(c.d_width > 0 && c.d_width <= 65536, "model.d_width", "must be 1 to 65536 (keeps element counts in int64)");
  c.channels = r.get<int64_t>("model.channels", c.channels, "image channels, 1 or 3");
  r.require(c.channels == 1 || c.channels == 3, "model.channels", "must be 1 or 3");
  c.image_size = r.get<int64_t>("model.image_size", c.image_size,
      "image side in pixels; DCGAN: 32 to 256, pix2pix: 8 to 1024 (powers of two)");
  const bool pow2 = c.image_size >= 32 && c.image_size <= 256 && (c.image_size & (c.image_size - 1)) == 0;
  r.require(pow2, "model.image_size", "must be 32, 64, 128 or 256 for model.arch dcgan");
  return make_dcgan_family(c);
}

std::unique_ptr<ShardedModel> build_generator(const DcganConfig& cfg, Communicator& comm,
                                              ShardingConfig sharding, uint64_t seed) {
  return build_sharded_model(generator_spec(cfg, &comm), comm, sharding, seed, cfg.dtype);
}

std::unique_ptr<ShardedModel> build_discriminator(const DcganConfig& cfg, Communicator& comm,
                                                  ShardingConfig sharding, uint64_t seed) {
  return build_sharded_model(discriminator_spec(cfg, &comm), comm, sharding, seed, cfg.dtype);
}

}  // namespace shardgan
