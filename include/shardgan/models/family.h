#pragma once
/// A model family, selected by `model.arch` (dcgan | biggan | pix2pix | stylegan2). A family supplies
/// exactly these things, and nothing else in the trainer, the tools or the checkpoint layer
/// knows which family is in use:
///  - its G and D, as unit specs built with deferred sharded initialization (deferred.h);
///  - the image shape;
///  - what G is conditioned on: nothing, a class (num_classes) or an input image
///    (condition_channels, image-to-image translation);
///  - its latent and label sampler;
///  - how its recipe regularizes (separate_regularization, generator_returns_styles).
///
/// Calling convention of the models it builds (all tensors on the CPU):
///  - G.forward({z, y}) -> {images} (or {images, ws}: generator_returns_styles): z from sample_latents ([B, ...]), y int64 [B] class
///    labels, or for an image-conditioned family the input image A [B, condition_channels,
///    H, W] in [-1, 1] (the model dtype), or undefined when unconditional; images
///    [B, C, H, W] in [-1, 1].
///  - D.forward({x, y}) -> {logits}: x [B, C, H, W], y as for G; logits [B], or [B, ...]
///    with one logit per patch (PatchGAN), any float dtype; the losses average over all.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include "shardgan/sharding/deferred.h"
#include "shardgan/util/config_reader.h"

namespace shardgan {

class Communicator;

struct ImageShape {
  int64_t channels = 1;
  int64_t height = 32;
  int64_t width = 32;
};

class ModelFamily {
 public:
  virtual ~ModelFamily() = default;
  /// The `model.arch` value ("dcgan", "biggan").
  virtual const char* arch() const = 0;
  /// G's unit specs and program. `comm` (for SyncBatchNorm) must outlive the model.
  virtual ModelSpec generator(Communicator& comm) const = 0;
  /// D's unit specs and program.
  virtual ModelSpec discriminator(Communicator& comm) const = 0;
  /// Shape of one image, G's output and D's input.
  virtual ImageShape image_shape() const = 0;
  /// Classes the models are conditioned on; 0 for an unconditional family.
  virtual int64_t num_classes() const = 0;
  /// Channels of the input image A that G translates (and D sees beside x), 0 for a
  /// family whose G starts from latents (and labels) alone. Then the real batch pairs each
  /// image B with its A, G's y is A, and the trainer's L1 term compares G(A) with B.
  virtual int64_t condition_channels() const { return 0; }
  /// Whether D's forward returns a second output, class logits [B, num_classes()] from an
  /// auxiliary classifier (AC-GAN, Odena et al. 2017), after its logits: what
  /// train.aux_class_weight trains. False for a family without one.
  virtual bool discriminator_classifies() const { return false; }
  /// Local. `n` latents for G ([n, ...], `dtype`) drawn from `gen`.
  virtual at::Tensor sample_latents(int64_t n, at::Generator& gen, at::ScalarType dtype) const = 0;
  /// Local. `n` labels (int64 [n], uniform over the classes) drawn from `gen`; undefined
  /// when num_classes() is 0 (and then `gen` is not advanced).
  at::Tensor sample_labels(int64_t n, at::Generator& gen) const;
  /// Whether the family's recipe runs each regularizer as an update of its own (StyleGAN2's
  /// lazy regularization, Karras et al. 2020, arXiv:1912.04958, Sec. 3.1 and Appendix B):
  /// R1 (train.r1_gamma) as a D update after D's main update every train.r1_every-th step,
  /// path length (train.pl_weight) as a G update after G's every train.pl_every-th step,
  /// each loss multiplied by its interval I and each optimizer's lr by c = I / (I + 1), its
  /// betas raised to c. False: R1 joins D's main update every r1_every-th D update (scaled
  /// by r1_every, no optimizer correction), and there is no path-length term.
  virtual bool separate_regularization() const { return false; }
  /// Whether G's forward returns, after its images, the styles the path-length penalty
  /// differentiates against: ws [B, num_ws, w_dim] in G's graph (the mapping network's
  /// output after style mixing), in G's compute dtype. What train.pl_weight needs.
  virtual bool generator_returns_styles() const { return false; }
  /// Whether sample_latents draws independent standard normals (the truncation trick
  /// applies); false for a family whose latents are seeds (pix2pix).
  virtual bool gaussian_latents() const { return true; }
  /// Local. sample_latents(n, gen, dtype) truncated, trading variety (FID) for fidelity
  /// (class accuracy); `truncation` <= 0 returns sample_latents unchanged. By default
  /// BigGAN's truncation trick (Brock et al. 2019, section 3.1): every entry with |z| >
  /// `truncation` is redrawn from N(0, 1) (the same `gen`) until all lie in [-truncation,
  /// truncation]. A family may truncate otherwise (StyleGAN2: psi in W, carried in z).
  /// Throws std::invalid_argument if truncation > 0 and !truncation_applies(), or if
  /// truncation is positive but below 0.05 (BigGAN's: more than 96% of draws rejected).
  virtual at::Tensor sample_truncated_latents(int64_t n, at::Generator& gen, at::ScalarType dtype,
                                              double truncation) const;
  /// Whether sample_truncated_latents takes a truncation (eval.truncation, shardgan-ckpt's
  /// --truncation): Gaussian latents by default; false for a family whose latents are seeds.
  virtual bool truncation_applies() const { return gaussian_latents(); }
};

/// Every `model.arch` value make_family accepts, in a fixed order ("dcgan", "biggan", "pix2pix",
/// "stylegan2").
const std::vector<std::string>& model_archs();

/// Reads `model.arch` and that family's `model.*` keys from `r` (an unknown arch, or a bad
/// value of one of its keys, is a ConfigError naming the key) and returns the family.
std::unique_ptr<ModelFamily> make_family(ConfigReader& r);

}  // namespace shardgan
