#pragma once
/// Adaptive discriminator augmentation (ADA; Karras et al. 2020, "Training Generative
/// Adversarial Networks with Limited Data", arXiv:2006.06676, Sec. 2-3 and Appendix B): every
/// image D sees, real or generated, in D's and G's passes alike, goes through a pipeline of
/// transforms, each applied to a sample with probability p; p follows D's overfitting
/// heuristic r_t = E[sign(D(x_real))] towards a target.
///
/// The pipeline is the paper's `bgc` set (or a subset, AugmentConfig::pipe): geometric
/// (xflip, rotate90, integer translation, isotropic scaling, rotation, anisotropic scaling,
/// fractional translation), composed into one inverse 3x3 map per sample and executed as
/// one bilinear resampling with reflection at the borders; and colour (brightness,
/// contrast, luma flip, hue, saturation), composed into one 4x4 map per sample. The
/// matrices, distributions and their order are the paper's (Appendix B, Table 7 defaults).
/// One difference in the execution: the authors resample at twice the resolution between
/// two sym6 wavelet filters, here the resampling is bilinear at the image's own resolution
/// (docs/models.md). Every transform is linear in the images, and its first and second
/// derivatives with respect to them exist (R1 differentiates D's input gradient through the
/// augmentation of the real images).
#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include <ATen/core/Tensor.h>

namespace shardgan {

/// augment.* keys (config.h's TrainConfig::augment).
struct AugmentConfig {
  /// augment.mode: none | ada (p adjusted from r_t) | fixed (p stays augment.p).
  std::string mode = "none";
  /// augment.pipe: the transforms, as the authors' augpipe names: blit (xflip, rotate90,
  /// integer translation), geom (scaling, rotation, anisotropic scaling, fractional
  /// translation), color (brightness, contrast, luma flip, hue, saturation), bg (blit and
  /// geom) or bgc (all; the paper's choice).
  std::string pipe = "bgc";
  double p = 0;           ///< augment.p: p at the start (ada) or throughout (fixed), in [0, 1]
  double target = 0.6;    ///< augment.target: the r_t that ADA steers towards (the paper: 0.6)
  /// augment.speed_kimg: p can move from 0 to 1 within this many thousand real images
  /// (the authors' ada_kimg, 500)
  double speed_kimg = 500;
  int64_t interval = 4;   ///< augment.interval: steps between adjustments of p (the authors': 4)
  bool enabled() const { return mode != "none"; }
  bool adaptive() const { return mode == "ada"; }
};

/// Each transform's strength: the multiplier of p in its probability (1: in the pipe, 0: off).
struct AugmentStrengths {
  double xflip = 0, rotate90 = 0, xint = 0;              // blit
  double scale = 0, rotate = 0, aniso = 0, xfrac = 0;    // geom
  double brightness = 0, contrast = 0, lumaflip = 0, hue = 0, saturation = 0;  // color
  /// The strengths of pipe `name` (AugmentConfig::pipe). Throws std::invalid_argument
  /// naming the pipes there are.
  static AugmentStrengths of_pipe(const std::string& name);
};

/// The random numbers one augmentation of a batch of N images consumes: uniforms in [0, 1)
/// u [N, kUniforms] and standard normals z [N, kNormals], float64, one row per image. Every
/// transform reads its columns whether it is on or not, so that a column means the same
/// draw in every pipe.
namespace augment_draw {
enum Uniform : int64_t {
  kXflipSide, kXflipGate, kRotate90Turns, kRotate90Gate, kXintX, kXintY, kXintGate, kScaleGate,
  kRotatePreAngle, kRotatePreGate, kAnisoGate, kRotatePostAngle, kRotatePostGate, kXfracGate,
  kBrightnessGate, kContrastGate, kLumaflipSide, kLumaflipGate, kHueAngle, kHueGate, kSaturationGate,
  kUniforms
};
enum Normal : int64_t { kScale, kAniso, kXfracX, kXfracY, kBrightness, kContrast, kSaturation, kNormals };
}  // namespace augment_draw

/// The transforms' constants (the paper's Table 7 / the authors' defaults).
struct AugmentConstants {
  static constexpr double kXintMax = 0.125;      ///< integer translation: at most this fraction of the size
  static constexpr double kScaleStd = 0.2;       ///< log2 of the isotropic scale ~ N(0, this^2)
  static constexpr double kRotateMax = 1.0;      ///< rotation angle ~ U(-pi, pi) times this
  static constexpr double kAnisoStd = 0.2;       ///< log2 of the anisotropic scale
  static constexpr double kXfracStd = 0.125;     ///< fractional translation ~ N(0, this^2) times the size
  static constexpr double kBrightnessStd = 0.2;  ///< brightness offset ~ N(0, this^2)
  static constexpr double kContrastStd = 0.5;    ///< log2 of the contrast factor
  static constexpr double kHueMax = 1.0;         ///< hue rotation ~ U(-pi, pi) times this
  static constexpr double kSaturationStd = 1.0;  ///< log2 of the saturation factor
};

/// One batch's transforms: `geometric` [N, 3, 3] maps an output pixel's position (x, y, 1),
/// in pixels from the image centre, to the input position it samples (the inverse of the
/// geometric transform); `color` [N, 4, 4] maps (r, g, b, 1) to the new colour. float64,
/// CPU. `geometric_identity` / `color_identity`: every sample's matrix is the identity (the
/// pass is skipped).
struct AugmentMatrices {
  at::Tensor geometric, color;
  bool geometric_identity = true, color_identity = true;
};

/// The matrices of the transforms of `s` at probability `p` for images of `channels` x
/// `height` x `width` from draws `u`, `z` (augment_draw's layout, N rows each). Hue and
/// saturation act on 3 channels only, as the authors'. Throws std::invalid_argument on
/// draws of the wrong shape. Local, pure.
AugmentMatrices augment_matrices(const AugmentStrengths& s, double p, const at::Tensor& u, const at::Tensor& z,
                                 int64_t channels, int64_t height, int64_t width);

/// `x` [N, C, H, W] (any floating dtype and device, values in the data's [-1, 1] range)
/// under `m` (N rows): the geometric map resampled bilinearly (at::grid_sampler, reflection
/// about the border pixels' centres), then the colour map (C = 3: the 3x4 affine map; C = 1:
/// the average of its three rows, as the authors'). Differentiable twice with respect to x.
/// Throws std::invalid_argument for C other than 1 or 3 when the colour map is on, and on
/// H or W of 1 when the geometric map is on. Local.
at::Tensor augment_images(const at::Tensor& x, const AugmentMatrices& m);

/// Which of a step's passes an augmentation serves: its draws are separate.
enum class AugmentSite : int64_t { kDReal = 0, kDFake = 1, kGPass = 2, kDReg = 3 };

/// ADA's state and its heuristic: the probability p, the signs of D's outputs on real
/// images since the last adjustment, and the draws of every pass. Held by the trainer; the
/// objective augments through it (GanObjective::set_augment).
class AdaptiveAugment {
 public:
  /// `cfg` enabled; `seed`: the run's; `global_batch`: images per step over all ranks (the
  /// rows of a pass's draws). Throws std::invalid_argument on a bad pipe.
  AdaptiveAugment(const AugmentConfig& cfg, uint64_t seed, int64_t global_batch);

  /// The draws of pass `site` of D step `d_step` at step `step` (steps done before it) for
  /// the whole global batch: u [global_batch, kUniforms], z [global_batch, kNormals],
  /// float64, CPU. A function of the seed and these three alone: the same on every rank
  /// and after a resume. Local.
  std::pair<at::Tensor, at::Tensor> draws(int64_t step, AugmentSite site, int64_t d_step) const;
  /// augment_images(x, augment_matrices(strengths, p, u, z, ...)) for this rank's rows
  /// `u`, `z` of the pass's draws, counted as images of `site` (images_augmented). Local.
  at::Tensor apply(const at::Tensor& x, const at::Tensor& u, const at::Tensor& z, AugmentSite site) const;
  /// Images this rank augmented for passes of `site` so far (a figure for tests: every image
  /// D sees, real or generated, goes through apply).
  int64_t images_augmented(AugmentSite site) const { return augmented_[static_cast<size_t>(site)]; }

  double p() const { return p_; }
  /// r_t of the last adjustment (NaN before the first).
  double last_rt() const { return last_rt_; }
  /// Adds one step's D logits on (augmented) real images, over every rank (StepStats'
  /// real_signs and real_logits after the step's exchange): the sum of their signs and their
  /// count. Then, after step `steps_done` (counted from 1), when it is a multiple of
  /// AugmentConfig::interval and the mode is ada: r_t = the signs' mean since the last
  /// adjustment, p += sign(r_t - target) * global_batch * interval / (speed_kimg * 1000),
  /// kept at least 0 (as the authors, with no upper clamp: p above 1 acts as 1), and the
  /// sums restart. Returns whether it adjusted. Local; its inputs are the same on every
  /// rank, so is p.
  bool after_step(int64_t steps_done, double sign_sum, double count);

  /// Checkpoint scalars: "ada_p", "ada_sign_sum", "ada_sign_count", and "ada_rt" once p has
  /// been adjusted (the same on every rank).
  void put_state(std::map<std::string, double>& scalars) const;
  /// Restores put_state's scalars; missing ones (a checkpoint without ADA) keep p at
  /// AugmentConfig::p and the sums at 0.
  void load_state(const std::map<std::string, double>& scalars);

  const AugmentConfig& config() const { return cfg_; }

 private:
  AugmentConfig cfg_;
  AugmentStrengths strengths_;
  uint64_t seed_;
  int64_t global_batch_;
  double p_;
  double sign_sum_ = 0, sign_count_ = 0;
  double last_rt_;
  mutable std::array<int64_t, 4> augmented_{};  // per AugmentSite
};

}  // namespace shardgan
