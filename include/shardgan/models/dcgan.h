#pragma once
/// DCGAN generator and discriminator for 32x32 images (Radford et al. 2016), one sharding
/// unit per conv block, as the `dcgan` model family (model.arch: dcgan; unconditional).
#include <cstdint>
#include <memory>

#include <ATen/core/Tensor.h>

#include "shardgan/models/family.h"
#include "shardgan/sharding/sharded_model.h"

namespace shardgan {

struct DcganConfig {
  int64_t z_dim = 64;     ///< model.z_dim: latent size; G's input is [B, z_dim, 1, 1]
  int64_t g_width = 32;   ///< model.g_width: channels of G's last hidden block (4w, 2w, w)
  int64_t d_width = 32;   ///< model.d_width: channels of D's first block (w, 2w, 4w)
  int64_t channels = 1;   ///< model.channels: image channels (1 or 3)
  at::ScalarType dtype = at::kFloat;  ///< parameter dtype (float32 or float64)
};

/// The family for `cfg` (its dtype field is not used: the trainer passes model.dtype).
std::unique_ptr<ModelFamily> make_dcgan_family(const DcganConfig& cfg);

/// Reads model.{z_dim,g_width,d_width,channels} (ConfigError naming the key if < 1, or
/// channels not 1 or 3).
std::unique_ptr<ModelFamily> make_dcgan_family(ConfigReader& r);

/// G: [B, z_dim, 1, 1] -> [B, channels, 32, 32] in [-1, 1]. Four units: three
/// ConvTranspose+SyncBatchNorm+ReLU blocks ("block0".."block2"), then ConvTranspose+Tanh
/// ("out"). DCGAN init: N(0, 0.02) convs, N(1, 0.02) BatchNorm scales, drawn per unit from
/// `seed` (deferred.h), identically on every rank. Local (no collectives).
std::unique_ptr<ShardedModel> build_generator(const DcganConfig& cfg, Communicator& comm,
                                              ShardingConfig sharding, uint64_t seed);

/// D: [B, channels, 32, 32] -> logits [B, 1]. Four units: Conv+LeakyReLU(0.2), two
/// Conv+SyncBatchNorm+LeakyReLU blocks, and a final 4x4 Conv. Local (no collectives).
std::unique_ptr<ShardedModel> build_discriminator(const DcganConfig& cfg, Communicator& comm,
                                                  ShardingConfig sharding, uint64_t seed);

}  // namespace shardgan
