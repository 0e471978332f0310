#pragma once
/// BigGAN (Brock et al. 2019, "Large Scale GAN Training for High Fidelity Natural Image
/// Synthesis") as the `biggan` model family (model.arch: biggan; class-conditional), laid
/// out as BigGAN-PyTorch's BigGAN.py: residual G with class-conditional BatchNorm over the
/// global batch, a shared class embedding and hierarchical latents; residual D with
/// projection (Miyato & Koyama 2018); spectral norm (Miyato et al. 2018) on every conv,
/// linear and embedding weight of both, the shared embedding included (BigGAN-PyTorch
/// leaves G's embedding without SN); one SAGAN attention block in each (Zhang et al. 2019).
///
/// Width and depth are free, so that one model can pass 1e9 parameters: each residual
/// block is its own sharding unit, which bounds the largest gathered unit.
///
/// G units, in registration and program order:
///  - "shared": SN embedding n_classes -> shared_dim; {y int64 [B]} -> {e [B, shared_dim]}.
///  - "linear": SN linear z_chunk -> C0 * 4 * 4; {z_0 [B, z_chunk]} -> {[B, C0, 4, 4]}.
///  - "block<i>": GBlock; {h, cond} -> {h'}, cond = cat(e, z_{r+1}) [B, shared_dim + z_chunk]
///    for the up-block r of that resolution (its extra blocks share its chunk). cond is
///    built by the program, outside the units. Per resolution: one up-block, then
///    g_blocks_per_res non-resampling blocks.
///  - "attn": Attention, after the blocks of the resolution g_attn (absent when 0).
///  - "out": SyncBatchNorm (affine) -> relu -> SN conv 3x3 -> tanh; {h} -> {images}.
/// with C_i = ch * g_ch_mult[i], z split into len(g_ch_mult) chunks of z_dim / len(g_ch_mult).
///
/// D units: "block<i>" (DBlock; block j of resolution group k downsamples when j = 0 and
/// k < len(d_ch_mult) - 1; every block but block0 pre-activates), "attn" after the first
/// resolution group whose output resolution is d_attn, "out" ({h, y} -> {logits [B]}).
/// D_k = d_ch * d_ch_mult[k]; groups go 32 -> 16 -> 8 -> 4 then one more group at 4x4 for
/// the default 32x32 (BigGAN-PyTorch's D ends with a non-downsampling block as well).
/// With model.d_class_head "out" also returns AC-GAN's class logits: {h, y} -> {logits [B],
/// class logits [B, n_classes]}.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shardgan/models/family.h"

namespace shardgan {

/// BigGAN hyperparameters: the `model.*` keys (defaults for 32x32 Fashion-MNIST on CPUs).
struct BigGanConfig {
  int64_t ch = 32;    ///< model.ch: G base width (BigGAN-PyTorch's CIFAR setting is 64)
  int64_t d_ch = 32;  ///< model.d_ch: D base width
  /// model.g_ch_mult: channel multipliers from the 4x4 bottom upwards; L entries give L-1
  /// up-blocks and images of 4 * 2^(L-1) pixels (2 <= L <= 9).
  std::vector<int64_t> g_ch_mult{4, 4, 4, 4};
  /// model.d_ch_mult: D's multipliers from the input resolution downwards; must have as
  /// many entries as g_ch_mult (L-1 down-blocks to 4x4, then one block at 4x4).
  std::vector<int64_t> d_ch_mult{4, 4, 4, 4};
  int64_t g_blocks_per_res = 0;  ///< model.g_blocks_per_res: extra blocks per resolution
  int64_t d_blocks_per_res = 0;  ///< model.d_blocks_per_res: extra blocks per resolution
  /// model.g_attn: output resolution of the G blocks the attention follows (8 ..
  /// image size, a power of two), 0 = none. SAGAN/BigGAN put it at mid resolution.
  int64_t g_attn = 16;
  /// model.d_attn: output resolution of the D blocks the attention follows (4 .. image
  /// size / 2), 0 = none.
  int64_t d_attn = 16;
  int64_t z_dim = 120;      ///< model.z_dim: latent size, divisible by L (BigGAN: 120)
  int64_t shared_dim = 128; ///< model.shared_dim: shared class-embedding size (BigGAN: 128)
  int64_t n_classes = 10;   ///< model.n_classes
  int64_t channels = 1;     ///< model.channels: image channels, 1 or 3
  std::string init = "ortho";  ///< model.init: ortho | N02 | xavier (G_init / D_init)
  /// model.channels_last: the blocks compute on activations in channels-last memory
  /// format (NHWC strides, the same [B, C, H, W] shapes), which oneDNN convolves without
  /// reordering them to its blocked layout: less transient memory per convolution on the
  /// CPU. Different rounding from the default (contiguous) layout; parameters and
  /// checkpoints are the same either way.
  bool channels_last = false;
  /// model.fused_upsample: each up-block's two convolutions of the upsampled input (conv1
  /// 3x3, conv_sc 1x1) compute on the low-resolution input instead (biggan::SNConv2d::
  /// forward_upsampled), so the nearest-upsampled activations, 4x the block's input, are
  /// never made: less memory in forward and backward, with or without activation
  /// checkpointing, and 4/9 of conv1's multiply-adds. The same function and parameters
  /// as BigGAN-PyTorch's upsample-then-convolve, with a different rounding; checkpoints
  /// are the same either way.
  bool fused_upsample = false;
  /// model.d_class_head: D's "out" unit also has AC-GAN's auxiliary classifier (Odena et
  /// al. 2017, Sec. 3), an SN linear layer from D's pooled features to n_classes logits,
  /// beside the projection (ModelFamily::discriminator_classifies; the objective's
  /// train.aux_class_weight trains it). Adds d_ch * d_ch_mult.back() * n_classes +
  /// n_classes parameters to D; a checkpoint of a D without it does not load into one with it.
  bool d_class_head = false;
};

class BigGanFamily : public ModelFamily {
 public:
  /// Throws std::invalid_argument naming the model.* key of the first invalid field.
  explicit BigGanFamily(BigGanConfig cfg);
  const char* arch() const override { return "biggan"; }
  /// G's units and program (see above). G.forward({z [B, z_dim], y int64 [B]}) ->
  /// {images [B, channels, S, S]} in [-1, 1], S = 4 * 2^(L-1). Its forward in training
  /// mode is a collective (SyncBatchNorm), so all ranks run it together.
  ModelSpec generator(Communicator& comm) const override;
  /// D's units and program. D.forward({x [B, channels, S, S], y int64 [B]}) -> {logits
  /// [B]}, and with d_class_head {logits [B], class logits [B, n_classes]}, x's dtype.
  /// Local apart from the sharding layer's own collectives.
  ModelSpec discriminator(Communicator& comm) const override;
  ImageShape image_shape() const override;
  int64_t num_classes() const override { return cfg_.n_classes; }
  bool discriminator_classifies() const override { return cfg_.d_class_head; }
  /// randn [n, z_dim] in `dtype` from `gen` (local).
  at::Tensor sample_latents(int64_t n, at::Generator& gen, at::ScalarType dtype) const override;
  const BigGanConfig& config() const { return cfg_; }
  /// Image side S = 4 * 2^(L-1).
  int64_t resolution() const;
  /// Latent chunks: L (one for the first linear layer, one per up-block).
  int64_t num_z_chunks() const { return static_cast<int64_t>(cfg_.g_ch_mult.size()); }

 private:
  BigGanConfig cfg_;
};

/// The family for `cfg`; throws std::invalid_argument naming the key of a bad field.
std::unique_ptr<ModelFamily> make_biggan_family(const BigGanConfig& cfg);

/// Reads model.{ch, d_ch, g_ch_mult, d_ch_mult, g_blocks_per_res, d_blocks_per_res, g_attn,
/// d_attn, z_dim, shared_dim, n_classes, channels, init, channels_last, fused_upsample,
/// d_class_head} (defaults in BigGanConfig) and
/// validates them: each bad value is a ConfigError naming its key (z_dim not divisible by
/// the number of latent chunks names both).
std::unique_ptr<ModelFamily> make_biggan_family(ConfigReader& r);

}  // namespace shardgan
