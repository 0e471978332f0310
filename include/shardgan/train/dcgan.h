#pragma once
/// DCGAN generator and discriminator for 32x32 single-channel images (Radford et al. 2016),
/// built as sharded models with one sharding unit per conv block.
#include <memory>

#include <ATen/core/Tensor.h>

#include "shardgan/sharding/sharded_model.h"

namespace shardgan {

struct DcganConfig {
  int64_t z_dim = 64;     ///< latent size; G's input is [B, z_dim, 1, 1]
  int64_t g_width = 32;   ///< channels of G's last hidden block (4w, 2w, w)
  int64_t d_width = 32;   ///< channels of D's first block (w, 2w, 4w)
  at::ScalarType dtype = at::kFloat;  ///< parameter and compute dtype (float32 or float64)
};

/// G: [B, z_dim, 1, 1] -> [B, 1, 32, 32] in [-1, 1]. Four units: three
/// ConvTranspose+SyncBatchNorm+ReLU blocks, then ConvTranspose+Tanh. Parameters are drawn
/// from torch's global generator seeded with `seed` (DCGAN init: N(0, 0.02) convs, N(1,
/// 0.02) BatchNorm scales), identically on every rank.
std::unique_ptr<ShardedModel> build_generator(const DcganConfig& cfg, Communicator& comm,
                                              ShardingConfig sharding, uint64_t seed);

/// D: [B, 1, 32, 32] -> logits [B]. Four units: Conv+LeakyReLU(0.2), two
/// Conv+SyncBatchNorm+LeakyReLU blocks, and a final 4x4 Conv.
std::unique_ptr<ShardedModel> build_discriminator(const DcganConfig& cfg, Communicator& comm,
                                                  ShardingConfig sharding, uint64_t seed);

}  // namespace shardgan
