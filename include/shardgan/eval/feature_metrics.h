#pragma once
/// Sample-quality metrics computed from arrays of features or logits that a feature network
/// (Inception-v3, VGG16, a domain classifier) has already produced: the Kernel Inception
/// Distance, improved precision and recall, and the Inception Score. They are the metrics of
/// StyleGAN2-ADA's `kid50k_full`, `pr50k3_full` and `is50k`, without the network: which
/// features are passed decides what the figures can be compared with (see each function).
///
/// Sources:
///  - KID: Bińkowski, Sutherland, Arbel and Gretton 2018, "Demystifying MMD GANs",
///    arXiv:1801.01401 (the unbiased MMD² U-statistic with the cubic polynomial kernel,
///    averaged over subsets), as StyleGAN2-ADA's metrics/kernel_inception_distance.py and
///    torch-fidelity compute it.
///  - Precision and recall: Kynkäänniemi, Karras, Laine, Lehtinen and Aila 2019, "Improved
///    Precision and Recall Metric for Assessing Generative Models", arXiv:1904.06991, k = 3.
///  - IS: Salimans et al. 2016, "Improved Techniques for Training GANs", arXiv:1606.03498,
///    with StyleGAN2-ADA's split boundaries.
///
/// Every function takes tensors of any float dtype on any device, copies them to the CPU as
/// float64 and computes in float64; results are plain doubles. All are Local (no
/// collectives): gather the features across ranks first. Bad input throws
/// std::invalid_argument naming the function and the shapes.
#include <cstdint>

#include <ATen/core/Tensor.h>

namespace shardgan::eval {

/// Mean and standard deviation of a metric over subsets or splits. `std` is the population
/// standard deviation (divided by the count, numpy's default ddof = 0), as torch-fidelity
/// reports for KID and StyleGAN2-ADA for IS.
struct MeanStd {
  double mean = 0.0;
  double std = 0.0;
  int64_t count = 0;  ///< subsets (KID) or splits (IS) averaged
};

/// Explicit KID subsets: row s of `real` and of `fake` lists the indices of the s-th subset
/// in the real and the fake feature array.
struct KidSubsets {
  at::Tensor real;  ///< int64 CPU [S, m_r]: indices into the real features
  at::Tensor fake;  ///< int64 CPU [S, m_f]: indices into the fake features
};

/// Draws `num_subsets` subsets of `subset_size` distinct indices (without replacement, as
/// StyleGAN2-ADA and torch-fidelity do) from [0, n_real) and [0, n_fake). The generator is
/// std::mt19937_64 seeded with `seed` (fully specified by the C++ standard, so the indices
/// are the same on every platform). For each subset s = 0, 1, ..., in order: the real
/// indices, then the fake ones, each by a partial Fisher-Yates shuffle of the identity
/// permutation 0..n-1 (restarted for every subset and side): for i = 0..m-1, j = i + u(n - i),
/// swap(perm[i], perm[j]); the subset is perm[0..m). u(b) takes 64-bit outputs r of the
/// generator, rejects r >= 2^64 - (2^64 mod b), and returns r mod b (unbiased). Throws
/// std::invalid_argument if num_subsets < 1, subset_size < 2, or subset_size exceeds
/// n_real or n_fake. Local.
KidSubsets draw_kid_subsets(int64_t n_real, int64_t n_fake, int64_t num_subsets, int64_t subset_size,
                            uint64_t seed);

/// The Kernel Inception Distance between `real` [N_r, d] and `fake` [N_f, d] feature arrays
/// (any float dtype and device; d >= 1) over the explicit `subsets`. For subset s, with
/// X = real[subsets.real[s]] (m rows), Y = fake[subsets.fake[s]] (n rows) and the cubic
/// polynomial kernel k(a, b) = (a·b / d + 1)^3, the unbiased MMD² estimate is
///   MMD²_s = sum_{i != j} k(x_i, x_j) / (m (m - 1)) + sum_{i != j} k(y_i, y_j) / (n (n - 1))
///            - 2 sum_{i, j} k(x_i, y_j) / (m n).
/// With m = n this is exactly StyleGAN2-ADA's form t = (sum(Kxx + Kyy) - trace(Kxx + Kyy)) /
/// (m - 1) - 2 sum(Kxy) / m, KID_s = t / m. Returned: the mean over subsets and the population
/// std (ddof = 0) of the MMD²_s values, in squared kernel units (KID is often printed x 1e3).
/// The estimate is unbiased, so it can be slightly negative when the two sets come from the
/// same distribution. Throws std::invalid_argument naming the shapes if a feature array is
/// not a float 2-D tensor with rows, the widths differ, a feature is not finite, the index
/// tensors are not int64 2-D with the same number of subsets (>= 1) and >= 2 indices per
/// subset, an index is out of range, or an index repeats within a subset (the U-statistic
/// needs distinct samples). Test control "kid_biased" includes the diagonals (the biased
/// V-statistic, sum k / m²), used only by the negative control of tests/test_feature_metrics.
MeanStd kernel_inception_distance(const at::Tensor& real, const at::Tensor& fake, const KidSubsets& subsets);

/// The same with subsets drawn by draw_kid_subsets(N_r, N_f, num_subsets, subset_size,
/// seed). The defaults are StyleGAN2-ADA's and torch-fidelity's (100 subsets of 1,000).
/// Throws std::invalid_argument (naming the shapes) if either set has fewer than
/// `subset_size` rows, and as above.
MeanStd kernel_inception_distance(const at::Tensor& real, const at::Tensor& fake, int64_t num_subsets = 100,
                                  int64_t subset_size = 1000, uint64_t seed = 0);

/// Improved precision and recall, each a fraction in [0, 1].
struct PrecisionRecall {
  double precision = 0.0;  ///< fraction of fake features inside the real manifold
  double recall = 0.0;     ///< fraction of real features inside the fake manifold
};

/// Improved precision and recall (Kynkäänniemi et al. 2019) of `fake` [N_f, d] against
/// `real` [N_r, d] (any float dtype and device). The manifold of a set is the union of balls
/// around its points; the radius of point a is the Euclidean distance to its k-th nearest
/// neighbour in its own set, itself excluded: its own index is skipped, but other points at
/// distance 0 (duplicates) count as neighbours, which equals the paper's code (it takes the
/// (k+1)-th smallest distance including the self-distance 0). Precision is the fraction of
/// fakes b with |b - a| <= radius(a) for at least one real a (a point on a ball's boundary is
/// inside); recall is the fraction of reals inside the fake manifold. Distances are compared
/// squared, as in the paper's code. They come in row blocks from the float64 Gram form
/// |a|² + |b|² - 2 a·b, and every decision within that form's rounding bound
/// (4 (d + 4) 2^-53 (|a|² + max |b|²)) of a radius is recomputed from the differences,
/// sum_k (a_k - b_k)², as are the radii themselves; so the result equals the direct
/// computation except for distances equal to a radius to within ~1e-15 relative. Cost:
/// O((N_r + N_f)² d) flops and O(block x N) memory (<= 128 MiB). Throws
/// std::invalid_argument naming the shapes if an array is not a float 2-D tensor, the
/// widths differ, a feature is not finite, k < 1, or a set has k rows or fewer.
///
/// Comparability: StyleGAN's `pr50k3` uses VGG16 features (k = 3, 50,000 samples); on
/// Inception-v3 or classifier features the figures are not comparable with it.
PrecisionRecall precision_recall(const at::Tensor& real, const at::Tensor& fake, int64_t k = 3);

/// The squared radii of the manifold of `features` [N, d] (any float dtype and device): the
/// squared distance of each row to its k-th nearest neighbour in the set, itself excluded,
/// as precision_recall computes them; float64 CPU [N]. For a fixed reference set, compute
/// them once and pass them to the overload below. Throws std::invalid_argument as
/// precision_recall does.
at::Tensor manifold_radii_sq(const at::Tensor& features, int64_t k = 3);

/// precision_recall with the real set's radii given (manifold_radii_sq(real, k)): the same
/// result, without the O(N_r² d) radii. Throws std::invalid_argument as precision_recall
/// does, and if `real_radii_sq` is not float64 [N_r].
PrecisionRecall precision_recall(const at::Tensor& real, const at::Tensor& fake, const at::Tensor& real_radii_sq,
                                 int64_t k = 3);

/// The Inception Score of `logits` [N, C] (any float dtype and device; C >= 1): p(y|x_i) =
/// softmax of row i in float64 (via log-softmax), rows split into `splits` consecutive parts,
/// part s being rows [s N / S, (s + 1) N / S) (integer division, StyleGAN2-ADA's boundaries),
///   IS_s = exp(mean_{i in s} KL(p(y|x_i) || p_s(y))),  p_s(y) = mean_{i in s} p(y|x_i),
/// with 0 log 0 = 0. Returned: the mean over splits and the population std (ddof = 0).
/// Dimensionless, in [1, C]. The logits are used as given: pytorch-fid's FID Inception has
/// 1008 outputs (the 2015 TF graph's, 1000 ImageNet classes plus 8 unused) and they enter
/// the softmax as they are, as in StyleGAN2-ADA and torch-fidelity. Throws
/// std::invalid_argument naming the shape if `logits` is not a float 2-D tensor, a logit is
/// not finite, splits < 1, or N < splits.
MeanStd inception_score(const at::Tensor& logits, int64_t splits = 10);

}  // namespace shardgan::eval
