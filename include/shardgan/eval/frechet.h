#pragma once
/// The Frechet distance between Gaussians fitted to two sets of feature vectors: the FID of
/// Heusel et al. 2017 ("GANs Trained by a Two Time-Scale Update Rule Converge to a Local Nash
/// Equilibrium", NeurIPS 2017, arXiv:1706.08500), computed here on the features of a small
/// Fashion-MNIST classifier (classifier.h) instead of Inception-v3's pool3 features, as is
/// common for MNIST-like data, where an ImageNet network is a poor feature extractor. Values
/// are therefore comparable only between runs that use the same classifier file, never with
/// published Inception FIDs. All computation is float64 on the CPU and local (no
/// collectives); see docs/fid.md.
#include <cstdint>

#include <ATen/core/Tensor.h>

namespace shardgan::eval {

/// Mean and covariance of N feature vectors of width F.
struct FeatureStats {
  at::Tensor mean;  ///< float64 CPU [F]
  at::Tensor cov;   ///< float64 CPU [F, F], unbiased (divided by N - 1), symmetric
  int64_t n = 0;    ///< number of feature vectors N (>= 2)
};

/// Mean and unbiased covariance of `features` [N, F] (any float dtype and device; computed
/// in float64 on the CPU, two-pass: the mean first, then the centred cross products).
/// Throws std::invalid_argument naming the shape if `features` is not 2-D, N < 2, F < 1,
/// or it is not a float dtype.
FeatureStats feature_stats(const at::Tensor& features);

/// Centred moments of feature vectors, for statistics over data that arrives in batches or is
/// spread over ranks. Each batch is centred on its own mean (two-pass) and merged with
/// Chan, Golub and LeVeque's pairwise update ("Algorithms for computing the sample
/// variance", 1983; the parallel form of Welford's method):
///   delta = mean_b - mean_a,  n = n_a + n_b,  mean = mean_a + delta n_b / n,
///   m2 = m2_a + m2_b + delta delta^T n_a n_b / n.
/// Unlike the one-pass sum of x x^T minus n mean mean^T, which loses log10(mean^2 / var)
/// digits to cancellation (8 of float64's 16 for features shifted by 1e4), this keeps the
/// accuracy of a two-pass covariance. Ranks merge their moments in rank order
/// (evaluation.cpp all-gathers them), so every rank gets the same bits. Local.
struct FeatureMoments {
  int64_t n = 0;    ///< feature vectors added so far
  at::Tensor mean;  ///< float64 CPU [F]: their mean (undefined until the first add)
  at::Tensor m2;    ///< float64 CPU [F, F]: sum of (x - mean)(x - mean)^T (undefined until the first add)

  /// Adds `features` [N, F] (any float dtype and device; N may be 0). Throws
  /// std::invalid_argument naming the shape if it is not 2-D or F differs from earlier adds.
  void add(const at::Tensor& features);
  /// Adds the moments of another set of vectors (same F; either may be empty). Throws
  /// std::invalid_argument if the widths differ.
  void merge(const FeatureMoments& other);
  /// Mean and unbiased covariance (m2 / (n - 1), symmetrized exactly) of everything added.
  /// Throws std::invalid_argument if n < 2.
  FeatureStats stats() const;
};

/// Frechet distance between N(a.mean, a.cov) and N(b.mean, b.cov):
///   FD = |mu_a - mu_b|^2 + tr(S_a) + tr(S_b) - 2 tr((S_a^{1/2} S_b S_a^{1/2})^{1/2}),
/// the symmetric form of Heusel et al.'s tr((S_a S_b)^{1/2}) (the two matrices are similar,
/// so their square roots have the same trace). Both square roots come from symmetric
/// eigendecompositions (at::linalg_eigh) with eigenvalues below zero (rounding of a
/// positive semi-definite matrix) clamped to 0, so singular covariances (F > N, dead
/// features) are fine. Float64 throughout; the result is >= 0 up to rounding: near-zero
/// eigenvalues contribute errors of order sqrt(F eps) |S|_2 each (eps = 2.2e-16), so for
/// identical inputs |FD| <= 2 F sqrt(F eps) |S|_2. Units: squared feature units.
/// Symmetric in a and b up to the same rounding. Throws std::invalid_argument if the
/// widths differ or a tensor has the wrong shape.
double frechet_distance(const FeatureStats& a, const FeatureStats& b);

/// Fraction of `predicted` equal to `labels` (both integer [N], N >= 1), in [0, 1]. Throws
/// std::invalid_argument naming the shapes if they differ or N = 0.
double class_accuracy(const at::Tensor& predicted, const at::Tensor& labels);

}  // namespace shardgan::eval
