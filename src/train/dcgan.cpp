#include "shardgan/train/dcgan.h"

#include <torch/torch.h>

#include "shardgan/train/layers.h"
#include "shardgan/train/sync_batchnorm.h"

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

ShardedUnit::Forward seq_forward(nn::Sequential seq) {
  return [seq](const at::Tensor& x) mutable { return seq->forward(x); };
}

void add(ShardedModel& model, const std::string& name, nn::Sequential seq, at::ScalarType dt) {
  seq->to(dt);
  dcgan_init(*seq);
  model.add_unit(name, seq.ptr(), seq_forward(seq));
}

ConvTranspose2d up(int64_t in, int64_t out, int64_t stride, int64_t pad) {
  return ConvTranspose2d(nn::ConvTranspose2dOptions(in, out, 4).stride(stride).padding(pad).bias(false));
}

nn::Conv2d down(int64_t in, int64_t out, int64_t stride, int64_t pad) {
  return nn::Conv2d(nn::Conv2dOptions(in, out, 4).stride(stride).padding(pad).bias(false));
}

nn::LeakyReLU lrelu() { return nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(0.2)); }

}  // namespace

std::unique_ptr<ShardedModel> build_generator(const DcganConfig& cfg, Communicator& comm,
                                              ShardingConfig sharding, uint64_t seed) {
  torch::manual_seed(seed);
  auto g = std::make_unique<ShardedModel>("generator", comm, sharding);
  const int64_t w = cfg.g_width;
  Communicator* c = &comm;
  add(*g, "block0", nn::Sequential(up(cfg.z_dim, 4 * w, 1, 0), SyncBatchNorm2d(4 * w, c), nn::ReLU()), cfg.dtype);
  add(*g, "block1", nn::Sequential(up(4 * w, 2 * w, 2, 1), SyncBatchNorm2d(2 * w, c), nn::ReLU()), cfg.dtype);
  add(*g, "block2", nn::Sequential(up(2 * w, w, 2, 1), SyncBatchNorm2d(w, c), nn::ReLU()), cfg.dtype);
  add(*g, "out", nn::Sequential(up(w, 1, 2, 1), nn::Tanh()), cfg.dtype);
  return g;
}

std::unique_ptr<ShardedModel> build_discriminator(const DcganConfig& cfg, Communicator& comm,
                                                  ShardingConfig sharding, uint64_t seed) {
  torch::manual_seed(seed);
  auto d = std::make_unique<ShardedModel>("discriminator", comm, sharding);
  const int64_t w = cfg.d_width;
  Communicator* c = &comm;
  add(*d, "block0", nn::Sequential(down(1, w, 2, 1), lrelu()), cfg.dtype);
  add(*d, "block1", nn::Sequential(down(w, 2 * w, 2, 1), SyncBatchNorm2d(2 * w, c), lrelu()), cfg.dtype);
  add(*d, "block2", nn::Sequential(down(2 * w, 4 * w, 2, 1), SyncBatchNorm2d(4 * w, c), lrelu()), cfg.dtype);
  add(*d, "out", nn::Sequential(down(4 * w, 1, 1, 0), nn::Flatten()), cfg.dtype);
  return d;
}

}  // namespace shardgan
