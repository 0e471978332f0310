// KID, improved precision/recall and the Inception Score from feature or logit arrays (float64).
#include "shardgan/eval/feature_metrics.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "eval/shape_text.h"

#include "shardgan/util/test_control.h"

namespace shardgan::eval {

namespace {

using detail::shape_str;

std::string describe(const at::Tensor& t) {
  if (!t.defined()) return "undefined";
  return std::string(c10::toString(t.scalar_type())) + " " + shape_str(t.sizes());
}

// `t` checked to be a finite float [N, D] with N >= min_rows and D >= 1; as float64 CPU contiguous.
at::Tensor checked_2d(const at::Tensor& t, const std::string& fn, const char* what, int64_t min_rows) {
  if (!t.defined() || t.dim() != 2 || t.size(1) < 1 || !at::isFloatingType(t.scalar_type())) {
    throw std::invalid_argument(fn + ": " + what + " must be a float [N, D] tensor with D >= 1, got " + describe(t));
  }
  if (t.size(0) < min_rows) {
    throw std::invalid_argument(fn + ": " + what + " needs at least " + std::to_string(min_rows) + " rows, got " +
                                shape_str(t.sizes()));
  }
  at::Tensor x = t.to(torch::kCPU, torch::kDouble).contiguous();
  if (!x.isfinite().all().item<bool>()) {
    throw std::invalid_argument(fn + ": " + what + " " + shape_str(t.sizes()) + " holds a non-finite value");
  }
  return x;
}

void check_widths(const at::Tensor& real, const at::Tensor& fake, const std::string& fn) {
  if (real.size(1) != fake.size(1)) {
    throw std::invalid_argument(fn + ": feature widths differ: real " + shape_str(real.sizes()) + ", fake " +
                                shape_str(fake.sizes()));
  }
}

// An unbiased integer in [0, bound) from 64-bit generator outputs (rejection, then modulo).
uint64_t uniform_below(std::mt19937_64& gen, uint64_t bound) {
  const uint64_t rem = (0 - bound) % bound;  // 2^64 mod bound
  const uint64_t limit = 0 - rem;            // 2^64 - rem (0 means 2^64: nothing rejected)
  for (;;) {
    const uint64_t r = gen();
    if (limit == 0 || r < limit) return r % bound;
  }
}

// `m` distinct indices from [0, n): partial Fisher-Yates shuffle of the identity permutation.
void draw_subset(std::mt19937_64& gen, int64_t n, int64_t m, int64_t* out) {
  std::vector<int64_t> perm(static_cast<size_t>(n));
  std::iota(perm.begin(), perm.end(), int64_t{0});
  for (int64_t i = 0; i < m; ++i) {
    const int64_t j = i + static_cast<int64_t>(uniform_below(gen, static_cast<uint64_t>(n - i)));
    std::swap(perm[i], perm[j]);
    out[i] = perm[i];
  }
}

// The index tensor of one side of the KID subsets, checked against `n` rows.
at::Tensor checked_indices(const at::Tensor& idx, int64_t n, const char* side) {
  const std::string fn = "kernel_inception_distance";
  if (!idx.defined() || idx.dim() != 2 || idx.scalar_type() != at::kLong || idx.size(0) < 1 || idx.size(1) < 2) {
    throw std::invalid_argument(fn + ": " + side +
                                " subset indices must be an int64 [S, m] tensor with S >= 1 and m >= 2, got " +
                                describe(idx));
  }
  at::Tensor c = idx.to(torch::kCPU).contiguous();
  const int64_t* p = c.data_ptr<int64_t>();
  const int64_t s = c.size(0), m = c.size(1);
  std::vector<int64_t> row(static_cast<size_t>(m));
  for (int64_t i = 0; i < s; ++i) {
    std::copy(p + i * m, p + (i + 1) * m, row.begin());
    for (int64_t v : row) {
      if (v < 0 || v >= n) {
        throw std::invalid_argument(fn + ": " + side + " subset " + std::to_string(i) + " has index " +
                                    std::to_string(v) + ", outside [0, " + std::to_string(n) + ") (indices " +
                                    shape_str(idx.sizes()) + ")");
      }
    }
    std::sort(row.begin(), row.end());
    const auto dup = std::adjacent_find(row.begin(), row.end());
    if (dup != row.end()) {
      throw std::invalid_argument(fn + ": " + side + " subset " + std::to_string(i) + " repeats index " +
                                  std::to_string(*dup) + " (indices " + shape_str(idx.sizes()) +
                                  "); subsets are drawn without replacement");
    }
  }
  return c;
}

// Sum of the cubic polynomial kernel (a·b / d + 1)^3 over all pairs, and over the diagonal.
struct KernelSums {
  double all = 0.0;
  double diag = 0.0;
};

KernelSums kernel_sums(const at::Tensor& a, const at::Tensor& b, bool same) {
  const double d = static_cast<double>(a.size(1));
  const at::Tensor k = (at::matmul(a, b.t()) / d + 1.0).pow(3);
  KernelSums s;
  s.all = k.sum().item<double>();
  if (same) s.diag = k.diagonal().sum().item<double>();
  return s;
}

// Population mean and std (ddof = 0) of `v`.
MeanStd mean_std(const std::vector<double>& v) {
  MeanStd r;
  r.count = static_cast<int64_t>(v.size());
  double sum = 0.0;
  for (double x : v) sum += x;
  r.mean = sum / static_cast<double>(v.size());
  double ss = 0.0;
  for (double x : v) ss += (x - r.mean) * (x - r.mean);
  r.std = std::sqrt(ss / static_cast<double>(v.size()));
  return r;
}

// ---- precision and recall ----

constexpr double kEps = 1.1102230246251565e-16;  // 2^-53, the unit roundoff of float64

// sum_k (a_k - b_k)^2, in order.
double direct_sq(const double* a, const double* b, int64_t d) {
  double s = 0.0;
  for (int64_t k = 0; k < d; ++k) {
    const double t = a[k] - b[k];
    s += t * t;
  }
  return s;
}

// Rows per block so that a block of squared distances [rows, n] holds at most 16 Mi doubles.
int64_t block_rows(int64_t n) { return std::max<int64_t>(1, std::min<int64_t>(1024, (int64_t{1} << 24) / n)); }

// Squared distance of `x`'s rows [b0, b1) to all of `y`'s rows, in the Gram form (clamped >= 0).
at::Tensor gram_sq(const at::Tensor& x, const at::Tensor& xsq, const at::Tensor& y, const at::Tensor& ysq, int64_t b0,
                   int64_t b1) {
  const at::Tensor xb = x.slice(0, b0, b1);
  return (xsq.slice(0, b0, b1).unsqueeze(1) + ysq.unsqueeze(0) - 2.0 * at::matmul(xb, y.t()))
      .clamp_min(0.0)
      .contiguous();
}

// The squared k-th nearest-neighbour distance of each row of `x` [N, d] in `x`, itself excluded.
std::vector<double> knn_radii_sq(const at::Tensor& x, int64_t k) {
  const int64_t n = x.size(0), d = x.size(1);
  const at::Tensor xsq = (x * x).sum(1);
  const double* xs = xsq.data_ptr<double>();
  const double* xp = x.data_ptr<double>();
  const double tol_scale = 4.0 * static_cast<double>(d + 4) * kEps;
  const double xsq_max = xsq.max().item<double>();
  std::vector<double> radii(static_cast<size_t>(n));
  std::vector<double> cand;
  const int64_t rows = block_rows(n);
  for (int64_t b0 = 0; b0 < n; b0 += rows) {
    const int64_t b1 = std::min(n, b0 + rows);
    at::Tensor d2 = gram_sq(x, xsq, x, xsq, b0, b1);
    // Exclude each row's own index.
    d2.diagonal(b0).fill_(std::numeric_limits<double>::infinity());
    const at::Tensor kth = std::get<0>(d2.kthvalue(k, 1)).contiguous();
    const double* dp = d2.data_ptr<double>();
    const double* kp = kth.data_ptr<double>();
    for (int64_t i = b0; i < b1; ++i) {
      // Every point whose true distance is among the k smallest has a Gram distance within
      // 2 tol of the Gram k-th value; the radius is the k-th smallest direct distance of these.
      const double limit = kp[i - b0] + 2.0 * tol_scale * (xs[i] + xsq_max);
      const double* row = dp + (i - b0) * n;
      cand.clear();
      for (int64_t j = 0; j < n; ++j) {
        if (j != i && row[j] <= limit) cand.push_back(direct_sq(xp + i * d, xp + j * d, d));
      }
      std::nth_element(cand.begin(), cand.begin() + (k - 1), cand.end());
      radii[static_cast<size_t>(i)] = cand[static_cast<size_t>(k - 1)];
    }
  }
  return radii;
}

// Fraction of the rows of `q` [M, d] within the radius of at least one row of `x` [N, d].
double fraction_inside(const at::Tensor& q, const at::Tensor& x, const std::vector<double>& radii_sq) {
  const int64_t m = q.size(0), n = x.size(0), d = x.size(1);
  const at::Tensor qsq = (q * q).sum(1), xsq = (x * x).sum(1);
  const double* qs = qsq.data_ptr<double>();
  const double* qp = q.data_ptr<double>();
  const double* xp = x.data_ptr<double>();
  const double tol_scale = 4.0 * static_cast<double>(d + 4) * kEps;
  const double xsq_max = xsq.max().item<double>();
  int64_t inside = 0;
  const int64_t rows = block_rows(n);
  for (int64_t b0 = 0; b0 < m; b0 += rows) {
    const int64_t b1 = std::min(m, b0 + rows);
    const at::Tensor d2 = gram_sq(q, qsq, x, xsq, b0, b1);
    const double* dp = d2.data_ptr<double>();
    for (int64_t i = b0; i < b1; ++i) {
      const double tol = tol_scale * (qs[i] + xsq_max);
      const double* row = dp + (i - b0) * n;
      bool in = false;
      for (int64_t j = 0; j < n && !in; ++j) {
        const double margin = row[j] - radii_sq[static_cast<size_t>(j)];
        if (margin < -tol) {
          in = true;
        } else if (margin <= tol) {  // too close to call from the Gram form
          in = direct_sq(qp + i * d, xp + j * d, d) <= radii_sq[static_cast<size_t>(j)];
        }
      }
      inside += in ? 1 : 0;
    }
  }
  return static_cast<double>(inside) / static_cast<double>(m);
}

}  // namespace

KidSubsets draw_kid_subsets(int64_t n_real, int64_t n_fake, int64_t num_subsets, int64_t subset_size, uint64_t seed) {
  if (num_subsets < 1 || subset_size < 2 || subset_size > n_real || subset_size > n_fake) {
    throw std::invalid_argument("draw_kid_subsets: need num_subsets >= 1 and 2 <= subset_size <= min(n_real, n_fake); "
                                "got num_subsets " + std::to_string(num_subsets) + ", subset_size " +
                                std::to_string(subset_size) + ", n_real " + std::to_string(n_real) + ", n_fake " +
                                std::to_string(n_fake));
  }
  KidSubsets s;
  s.real = torch::empty({num_subsets, subset_size}, torch::kLong);
  s.fake = torch::empty({num_subsets, subset_size}, torch::kLong);
  std::mt19937_64 gen(seed);
  for (int64_t i = 0; i < num_subsets; ++i) {
    draw_subset(gen, n_real, subset_size, s.real.data_ptr<int64_t>() + i * subset_size);
    draw_subset(gen, n_fake, subset_size, s.fake.data_ptr<int64_t>() + i * subset_size);
  }
  return s;
}

MeanStd kernel_inception_distance(const at::Tensor& real, const at::Tensor& fake, const KidSubsets& subsets) {
  const std::string fn = "kernel_inception_distance";
  const at::Tensor x = checked_2d(real, fn, "real features", 2);
  const at::Tensor y = checked_2d(fake, fn, "fake features", 2);
  check_widths(real, fake, fn);
  const at::Tensor ri = checked_indices(subsets.real, x.size(0), "real");
  const at::Tensor fi = checked_indices(subsets.fake, y.size(0), "fake");
  if (ri.size(0) != fi.size(0)) {
    throw std::invalid_argument(fn + ": real and fake subset index tensors differ in the number of subsets: " +
                                shape_str(ri.sizes()) + " and " + shape_str(fi.sizes()));
  }
  // Control: the biased V-statistic (diagonals kept, divided by m^2) instead of the U-statistic.
  const bool biased = test_control("kid_biased");
  std::vector<double> mmd(static_cast<size_t>(ri.size(0)));
  for (int64_t s = 0; s < ri.size(0); ++s) {
    const at::Tensor xs = x.index_select(0, ri[s]), ys = y.index_select(0, fi[s]);
    const double m = static_cast<double>(xs.size(0)), n = static_cast<double>(ys.size(0));
    const KernelSums kxx = kernel_sums(xs, xs, true), kyy = kernel_sums(ys, ys, true), kxy = kernel_sums(xs, ys, false);
    if (biased) {
      mmd[static_cast<size_t>(s)] = kxx.all / (m * m) + kyy.all / (n * n) - 2.0 * kxy.all / (m * n);
    } else {
      mmd[static_cast<size_t>(s)] =
          (kxx.all - kxx.diag) / (m * (m - 1.0)) + (kyy.all - kyy.diag) / (n * (n - 1.0)) - 2.0 * kxy.all / (m * n);
    }
  }
  return mean_std(mmd);
}

MeanStd kernel_inception_distance(const at::Tensor& real, const at::Tensor& fake, int64_t num_subsets,
                                  int64_t subset_size, uint64_t seed) {
  const std::string fn = "kernel_inception_distance";
  const at::Tensor x = checked_2d(real, fn, "real features", std::max<int64_t>(subset_size, 2));
  const at::Tensor y = checked_2d(fake, fn, "fake features", std::max<int64_t>(subset_size, 2));
  check_widths(real, fake, fn);
  return kernel_inception_distance(x, y, draw_kid_subsets(x.size(0), y.size(0), num_subsets, subset_size, seed));
}

PrecisionRecall precision_recall(const at::Tensor& real, const at::Tensor& fake, int64_t k) {
  const std::string fn = "precision_recall";
  if (k < 1) throw std::invalid_argument(fn + ": k must be >= 1, got " + std::to_string(k));
  const at::Tensor x = checked_2d(real, fn, "real features", k + 1);
  const at::Tensor y = checked_2d(fake, fn, "fake features", k + 1);
  check_widths(real, fake, fn);
  PrecisionRecall pr;
  pr.precision = fraction_inside(y, x, knn_radii_sq(x, k));
  pr.recall = fraction_inside(x, y, knn_radii_sq(y, k));
  return pr;
}

at::Tensor manifold_radii_sq(const at::Tensor& features, int64_t k) {
  const std::string fn = "manifold_radii_sq";
  if (k < 1) throw std::invalid_argument(fn + ": k must be >= 1, got " + std::to_string(k));
  const std::vector<double> r = knn_radii_sq(checked_2d(features, fn, "features", k + 1), k);
  return torch::tensor(r, torch::kDouble);
}

PrecisionRecall precision_recall(const at::Tensor& real, const at::Tensor& fake, const at::Tensor& real_radii_sq,
                                 int64_t k) {
  const std::string fn = "precision_recall";
  if (k < 1) throw std::invalid_argument(fn + ": k must be >= 1, got " + std::to_string(k));
  const at::Tensor x = checked_2d(real, fn, "real features", k + 1);
  const at::Tensor y = checked_2d(fake, fn, "fake features", k + 1);
  check_widths(real, fake, fn);
  if (!real_radii_sq.defined() || real_radii_sq.dim() != 1 || real_radii_sq.size(0) != x.size(0) ||
      real_radii_sq.scalar_type() != at::kDouble) {
    throw std::invalid_argument(fn + ": real_radii_sq must be float64 [" + std::to_string(x.size(0)) + "], got " +
                                describe(real_radii_sq));
  }
  const at::Tensor rr = real_radii_sq.to(torch::kCPU).contiguous();
  const std::vector<double> radii(rr.data_ptr<double>(), rr.data_ptr<double>() + rr.numel());
  PrecisionRecall pr;
  pr.precision = fraction_inside(y, x, radii);
  pr.recall = fraction_inside(x, y, knn_radii_sq(y, k));
  return pr;
}

MeanStd inception_score(const at::Tensor& logits, int64_t splits) {
  const std::string fn = "inception_score";
  if (splits < 1) throw std::invalid_argument(fn + ": splits must be >= 1, got " + std::to_string(splits));
  const at::Tensor z = checked_2d(logits, fn, "logits", splits);
  const int64_t n = z.size(0);
  const at::Tensor logp = at::log_softmax(z, 1);
  const at::Tensor p = logp.exp();
  std::vector<double> scores(static_cast<size_t>(splits));
  for (int64_t s = 0; s < splits; ++s) {
    const int64_t b0 = s * n / splits, b1 = (s + 1) * n / splits;
    const at::Tensor ps = p.slice(0, b0, b1), logps = logp.slice(0, b0, b1);
    const at::Tensor log_marginal = ps.mean(0).log().unsqueeze(0);
    // p log(p / p_s), with 0 log 0 = 0 (p = 0 can meet a marginal of 0: 0 * -inf).
    const at::Tensor terms = at::where(ps > 0.0, ps * (logps - log_marginal), at::zeros_like(ps));
    scores[static_cast<size_t>(s)] = std::exp(terms.sum(1).mean().item<double>());
  }
  return mean_std(scores);
}

}  // namespace shardgan::eval
