#pragma once
/// DCGAN generator and discriminator (Radford et al. 2016, arXiv:1511.06434, figure 1 and
/// section 3) for square images of 32 to 256 pixels, one sharding unit per conv block, as
/// the `dcgan` model family (model.arch: dcgan; unconditional). At 64 the layout is the
/// paper's 64x64 architecture as PyTorch's DCGAN example types it (ngf = g_width, ndf =
/// d_width, nz = z_dim: G 3,576,704 and D 2,765,568 parameters at 64/64/100 with 3
/// channels; tests/dcgan_reference.py re-types it).
#include <cstdint>
#include <memory>

#include <ATen/core/Tensor.h>

#include "shardgan/models/family.h"
#include "shardgan/sharding/sharded_model.h"

namespace shardgan {

struct DcganConfig {
  int64_t z_dim = 64;     ///< model.z_dim: latent size; G's input is [B, z_dim, 1, 1]
  int64_t g_width = 32;   ///< model.g_width: channels of G's last hidden block (..., 4w, 2w, w)
  int64_t d_width = 32;   ///< model.d_width: channels of D's first block (w, 2w, 4w, ...)
  int64_t channels = 1;   ///< model.channels: image channels (1 or 3)
  int64_t image_size = 32;  ///< model.image_size: 32, 64, 128 or 256 (L = log2(size) - 2 stride-2 blocks)
  at::ScalarType dtype = at::kFloat;  ///< parameter dtype (float32 or float64)
};

/// The family for `cfg` (its dtype field is not used: the trainer passes model.dtype).
std::unique_ptr<ModelFamily> make_dcgan_family(const DcganConfig& cfg);

/// Reads model.{z_dim,g_width,d_width,channels,image_size} (ConfigError naming the key if
/// < 1, channels not 1 or 3, or image_size not 32, 64, 128 or 256).
std::unique_ptr<ModelFamily> make_dcgan_family(ConfigReader& r);

/// G: [B, z_dim, 1, 1] -> [B, channels, S, S] in [-1, 1], S = image_size, L = log2(S) - 2.
/// L + 1 units: L ConvTranspose+SyncBatchNorm+ReLU blocks ("block0".."block{L-1}", widths
/// w 2^(L-1) at 4x4 down to 2w), then ConvTranspose+Tanh ("out"); at 32 (L = 3) the
/// widths are 4w, 2w, w. DCGAN init: N(0, 0.02) convs, N(1, 0.02) BatchNorm scales, drawn per unit from
/// `seed` (deferred.h), identically on every rank. Local (no collectives).
std::unique_ptr<ShardedModel> build_generator(const DcganConfig& cfg, Communicator& comm,
                                              ShardingConfig sharding, uint64_t seed);

/// D: [B, channels, S, S] -> logits [B, 1]. L + 1 units: Conv+LeakyReLU(0.2), L - 1
/// Conv+SyncBatchNorm+LeakyReLU blocks (widths w, 2w, ..., w 2^(L-1)), and a final 4x4 Conv. Local (no collectives).
std::unique_ptr<ShardedModel> build_discriminator(const DcganConfig& cfg, Communicator& comm,
                                                  ShardingConfig sharding, uint64_t seed);

}  // namespace shardgan
