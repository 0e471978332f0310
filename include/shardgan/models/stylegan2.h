#pragma once
/// StyleGAN2 (Karras et al. 2020, "Analyzing and Improving the Image Quality of StyleGAN",
/// arXiv:1912.04958) as the `stylegan2` model family (model.arch: stylegan2), with the
/// configurations of the authors' StyleGAN2-ADA code (Karras et al. 2020, arXiv:2006.06676):
/// G's mapping network and 'skip' synthesis network with modulated, demodulated
/// convolutions and per-layer noise; D 'resnet' or 'orig' with minibatch standard deviation
/// and, when conditional, a projection onto a label mapping network. The layer shapes equal
/// our plain-PyTorch peer, benchmarks/peers/stylegan2.py (paper256: G 24,767,458 and
/// D 24,001,089 parameters; cifar: G 20,215,315 and D 23,089,664).
///
/// The recipe's regularizers run as updates of their own (separate_regularization): lazy R1
/// and path length, which differentiates against the ws G's forward returns.
/// Not here yet: constant noise for evaluation, the fp16
/// layers and conv_clamp of the authors' code, ADA.
///
/// Latents (sample_latents): z [n, 2 z_dim + 3] in the requested dtype (float32 or float64):
///  - columns [0, z_dim): the main latent, N(0, 1);
///  - columns [z_dim, 2 z_dim): the style-mixing latent, N(0, 1);
///  - column 2 z_dim: the mixing cutoff, an integer: with probability style_mixing a layer
///    index uniform in [1, num_ws), whose ws from there on come from the mixing latent;
///    otherwise num_ws (no mixing; then the mixing latent is ignored);
///  - column 2 z_dim + 1: the sample's noise seed, an integer in [0, 2^24) (exact in float32);
///  - column 2 z_dim + 2: the truncation psi, 1 (none) from sample_latents, `truncation`
///    from sample_truncated_latents (eval.truncation, shardgan-ckpt's --truncation): every
///    w of the sample, the mixing latent's too, becomes w_avg + psi (w - w_avg) (truncation
///    in W, Karras et al. 2019, Sec. 4; the authors' truncation_psi with no cutoff), after
///    the training-mode update of w_avg.
/// All of G's randomness is in z: the noise images of a sample are drawn in the forward from
/// CPU generators seeded with (its noise seed, the layer), so one z row gives the same image
/// whatever batch or rank it is generated in. The entries are not jointly Gaussian
/// (gaussian_latents() is false): truncation is psi in W (truncation_applies() is true).
///
/// Units (sharding units, in registration and execution order):
///  - G: "mapping" ({z main [B, z_dim], y int64 [B] or undefined, z mixing [B, z_dim] or
///    undefined, cutoff int64 [B] or undefined, psi float64 [B] or undefined (none)} ->
///    {ws [B, num_ws, w_dim]}; ws[:, l] is the
///    mixing latent's w for l >= cutoff; it keeps the buffer "w_avg", updated in training
///    mode from the main latents over the global batch, a collective); then "b4", "b8", ...,
///    "b<R>" ({x [B, C_in, r/2, r/2], img [B, channels, r/2, r/2], ws [B, num_conv + 1, w_dim],
///    noise seeds int64 [B] or undefined (no noise)} -> {x [B, C_r, r, r], img}; x and img
///    undefined into b4).
///  - D: "b<R>", ..., "b8" ({x} -> {x at half the resolution}; the first takes the image),
///    "mapping" (conditional only: {y int64 [B]} -> {cmap [B, channels(4)]}), "b4" (the
///    epilogue: {x [B, channels(4), 4, 4], cmap or undefined} -> {logits [B]}).
/// G.forward({z, y}) -> {images [B, channels, R, R], ws [B, num_ws, w_dim]} (ws after style
/// mixing, in the graph: what path length differentiates against), images not clamped (about [-1, 1] once
/// trained); D.forward({x, y}) -> {logits [B]}. D's batch on each rank must be a multiple
/// of min(mbstd_group, batch); minibatch-stddev groups are consecutive samples, so a run
/// whose per-rank batch is a multiple of mbstd_group gives the same D outputs in any world
/// size.
#include <cstdint>
#include <memory>
#include <string>

#include <ATen/core/Tensor.h>

#include "shardgan/models/family.h"

namespace shardgan {

/// One StyleGAN2 configuration. Defaults: the authors' network defaults at 32x32 (preset
/// "none").
struct StyleGan2Config {
  int64_t resolution = 32;         ///< model.image_size: R, a power of two from 32 to 1024
  int64_t channels = 3;            ///< model.channels: image channels, 1 or 3
  int64_t z_dim = 512;             ///< model.z_dim: size of each of the two latents
  int64_t w_dim = 512;             ///< model.w_dim: size of the intermediate latent w
  int64_t num_classes = 0;         ///< model.n_classes: 0 for an unconditional model
  int64_t channel_base = 32768;    ///< model.channel_base: channels(r) = min(base / r, max)
  int64_t channel_max = 512;       ///< model.channel_max
  int64_t mapping_layers = 8;      ///< model.mapping_layers: G's mapping depth
  double mapping_lr_mult = 0.01;   ///< learning-rate multiplier of both mapping networks
  double w_avg_beta = 0.995;       ///< decay of G's tracked mean w (for truncation in W)
  std::string d_arch = "resnet";   ///< model.d_arch: "resnet" (1x1 skips) or "orig"
  int64_t mbstd_group = 4;         ///< model.mbstd_group: minibatch-stddev group size
  int64_t mbstd_channels = 1;      ///< minibatch-stddev feature groups F
  double style_mixing = 0.9;       ///< model.style_mixing: probability that a sample mixes
  int64_t d_mapping_layers = 8;    ///< depth of the conditional D's label mapping network
                                   ///< (the authors keep 8 even for cifar)
  at::ScalarType dtype = at::kFloat;  ///< parameter dtype (float32 or float64); not used by
                                      ///< the family (the trainer passes model.dtype)
};

/// The authors' configuration `name` (StyleGAN2-ADA's train.py --cfg), as defaults:
///  - "paper256": 256x256, 3 channels, unconditional, channel_base 16384, mapping 8,
///    D resnet, mbstd group 8, style mixing 0.9;
///  - "cifar": 32x32, 3 channels, 10 classes, channel_base 32768, mapping 2, D orig,
///    mbstd group 32, no style mixing;
///  - "fmnist" (ours, for Fashion-MNIST padded to 32x32): 1 channel, unconditional,
///    channel_base 8192 and channel_max 128 (128 channels at every resolution), mapping 2,
///    D resnet, mbstd group 4, style mixing 0.9;
///  - "none": StyleGan2Config{}.
/// Throws std::invalid_argument naming `name` for any other.
StyleGan2Config stylegan2_preset(const std::string& name);

/// channels(r) = min(channel_base / r, channel_max) (integer division).
int64_t stylegan2_channels(const StyleGan2Config& cfg, int64_t res);

/// Number of ws G's synthesis takes: 2 log2(R) - 2 (14 at 256, 8 at 32).
int64_t stylegan2_num_ws(const StyleGan2Config& cfg);

/// Columns of a latent row: 2 z_dim + 3 (main and mixing latents, cutoff, noise seed, psi).
int64_t stylegan2_latent_dim(const StyleGan2Config& cfg);

/// The family for `cfg`. Throws std::invalid_argument naming the model.* key of the first
/// bad field (the checks of make_stylegan2_family(ConfigReader&), and mbstd_channels,
/// w_avg_beta, mapping_lr_mult, d_mapping_layers in range).
std::unique_ptr<ModelFamily> make_stylegan2_family(const StyleGan2Config& cfg);

/// Reads model.preset first (default fmnist, the project's default data; its configuration
/// gives the defaults of the others), then
/// model.{image_size, channels, z_dim, w_dim, n_classes, channel_base, channel_max,
/// mapping_layers, d_arch, mbstd_group, style_mixing}. A bad value is a ConfigError naming
/// its key.
std::unique_ptr<ModelFamily> make_stylegan2_family(ConfigReader& r);

}  // namespace shardgan
