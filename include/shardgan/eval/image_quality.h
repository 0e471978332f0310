#pragma once
/// Full-reference image quality, for image-to-image models evaluated against their targets
/// (pix2pix's held-out pairs): mean absolute error, PSNR and SSIM.
#include <ATen/core/Tensor.h>

namespace shardgan::eval {

/// Per-image scores of `out` against `target`, both [N, C, H, W] of the same shape, any
/// floating dtype, values in [-1, 1], CPU. Computed in float64 on images mapped to [0, 1]
/// (data range 1). Each is a [N] float64 tensor; average them for a set's score.
struct ImageScores {
  at::Tensor l1;    ///< mean |out - target| over the image, on the [-1, 1] scale the models use
  at::Tensor psnr;  ///< 10 log10(1 / MSE) in dB on the [0, 1] scale (an identical image: +inf)
  /// SSIM (Wang et al. 2004, "Image Quality Assessment: From Error Visibility to Structural
  /// Similarity", Eq. 13) with an 11x11 Gaussian window of sigma 1.5, K1 = 0.01, K2 = 0.03,
  /// population (co)variances, over the valid region (no padding) and averaged over channels:
  /// scikit-image's structural_similarity(gaussian_weights=True, sigma=1.5,
  /// use_sample_covariance=False, data_range=1, channel_axis=0).
  at::Tensor ssim;
};

/// Local. Throws std::invalid_argument for mismatched shapes, a non-4-D tensor or images
/// smaller than 11x11.
ImageScores image_scores(const at::Tensor& out, const at::Tensor& target);

}  // namespace shardgan::eval
