#pragma once
/// pix2pix (Isola et al. 2017, "Image-to-Image Translation with Conditional Adversarial
/// Networks", Sec. 3.2 and Appendix 6.1) as the `pix2pix` model family (model.arch: pix2pix;
/// image-conditioned): a U-Net G that translates an input image A into an image B, and a
/// PatchGAN D that scores (A, B) pairs patch by patch. Laid out as the authors' code
/// (junyanz/pytorch-CycleGAN-and-pix2pix, models/networks.py: UnetGenerator,
/// UnetSkipConnectionBlock, NLayerDiscriminator), with BatchNorm over the global batch
/// (SyncBatchNorm; at batch 1 it is instance normalization, as the paper notes).
///
/// G has L = log2(image_size) levels (256 -> 8, 32 -> 5), with E_i = g_width * min(2^i, 8)
/// channels at level i. Units, in registration order:
///  - "enc<i>", i = 0..L-1: e_i = [norm](conv4x4/2(LeakyReLU0.2(e_{i-1}))), e_{-1} = A and no
///    LeakyReLU or norm at level 0, no norm at the innermost level (a 1x1 map; the authors'
///    code). {e_{i-1}} -> {e_i [B, E_i, H/2^(i+1), W/2^(i+1)]}.
///  - "dec<i>", i = L-1..0: u_i = [dropout](norm(convT4x4/2(ReLU(cat(e_i, u_{i+1}))))), only e_i
///    at the innermost level; at level 0 convT (with bias) -> tanh gives the image. The
///    first `dropout_blocks` decoder units (from the innermost) apply dropout. {e_i, u_{i+1},
///    z} -> {u_i [B, E_{i-1}, ...]}.
/// The skip e_i is made by unit enc<i> and consumed by enc<i+1> and dec<i>: one tensor with
/// two uses, which lives from G's encoder pass to its decoder across every unit between.
/// At 256x256 with g_width 64 and 3 channels G has 54.4M parameters.
///
/// Dropout draws its masks from the latents: z is int64 [B], one seed per sample
/// (sample_latents), and unit dec<i> masks sample b with a generator seeded from (z[b], i).
/// The masks thus follow the sample, not the rank or the world size, and a replay under
/// activation checkpointing draws the same ones. The paper keeps dropout on at test time as
/// G's only noise (model.test_dropout); with it off, G in eval mode (shardgan-ckpt sample
/// --eval) applies none. The trainer samples and evaluates in training mode.
///
/// D (the 70x70 PatchGAN at d_layers 3): "block0" conv4x4/2 (bias) + LeakyReLU on cat(A, B);
/// "block<k>", k = 1..d_layers: conv4x4 (stride 2, the last stride 1) + norm + LeakyReLU,
/// D_k = d_width * min(2^k, 8) channels; "out": conv4x4/1 (bias) to one channel.
/// {x [B, C, H, W], a [B, C_A, H, W]} -> {logits [B, 1, h, w]}, one per patch. 2.8M
/// parameters at d_width 64 with 3-channel A and B.
///
/// Initialization: N(0, 0.02) conv weights, N(1, 0.02) norm scales, zero biases (the
/// authors' init_weights 'normal').
#include <cstdint>
#include <memory>

#include "shardgan/models/family.h"

namespace shardgan {

/// pix2pix hyperparameters: the `model.*` keys (defaults: Fashion-MNIST edges -> image).
struct Pix2PixConfig {
  int64_t image_size = 32;     ///< model.image_size: a power of two, 8 to 1024; G has log2 of it levels
  int64_t g_width = 64;        ///< model.g_width: G's first encoder width (the paper's ngf)
  int64_t d_width = 64;        ///< model.d_width: D's first width (ndf)
  int64_t d_layers = 3;        ///< model.d_layers: D's strided blocks (3: 70x70 receptive field)
  int64_t in_channels = 1;     ///< model.in_channels: channels of A, 1 or 3
  int64_t channels = 1;        ///< model.channels: channels of B, 1 or 3
  double dropout = 0.5;        ///< model.dropout: rate of the decoder's dropout
  int64_t dropout_blocks = 3;  ///< model.dropout_blocks: decoder units with dropout, from the innermost
  bool test_dropout = true;    ///< model.test_dropout: dropout also in eval mode (the paper's noise)
};

/// The family for `cfg`.
std::unique_ptr<ModelFamily> make_pix2pix_family(const Pix2PixConfig& cfg);

/// Reads the keys above (ConfigError naming the key for a bad value).
std::unique_ptr<ModelFamily> make_pix2pix_family(ConfigReader& r);

}  // namespace shardgan
