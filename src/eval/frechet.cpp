// Feature statistics and the Frechet distance between two Gaussians (float64).
#include "shardgan/eval/frechet.h"

#include <stdexcept>
#include <string>
#include <tuple>

#include <torch/torch.h>

#include "eval/shape_text.h"

namespace shardgan::eval {

namespace {

using detail::shape_str;

// `features` checked to be a float [N, F] with F >= 1, as float64 CPU.
at::Tensor checked_features(const at::Tensor& features, const char* what) {
  if (!features.defined() || features.dim() != 2 || features.size(1) < 1 ||
      !at::isFloatingType(features.scalar_type())) {
    throw std::invalid_argument(std::string(what) + ": features must be a float [N, F] tensor with F >= 1, got " +
                                (features.defined() ? std::string(c10::toString(features.scalar_type())) + " " +
                                                          shape_str(features.sizes())
                                                    : std::string("undefined")));
  }
  return features.to(torch::kCPU, torch::kDouble).contiguous();
}

void check_stats(const FeatureStats& s, const char* name) {
  if (!s.mean.defined() || !s.cov.defined() || s.mean.dim() != 1 || s.cov.dim() != 2 ||
      s.cov.size(0) != s.mean.size(0) || s.cov.size(1) != s.mean.size(0)) {
    throw std::invalid_argument(std::string("frechet_distance: ") + name +
                                " must have mean [F] and cov [F, F], got " +
                                (s.mean.defined() ? shape_str(s.mean.sizes()) : std::string("undefined")) + " and " +
                                (s.cov.defined() ? shape_str(s.cov.sizes()) : std::string("undefined")));
  }
}

// Eigenvalues (clamped to >= 0) and eigenvectors of the symmetric part of `m` (float64).
std::tuple<at::Tensor, at::Tensor> psd_eigh(const at::Tensor& m) {
  auto [vals, vecs] = at::linalg_eigh(0.5 * (m + m.t()), "L");
  return {vals.clamp_min(0.0), vecs};
}

}  // namespace

FeatureStats feature_stats(const at::Tensor& features) {
  const at::Tensor x = checked_features(features, "feature_stats");
  const int64_t n = x.size(0);
  if (n < 2) {
    throw std::invalid_argument("feature_stats: need at least 2 feature vectors for a covariance, got " +
                                shape_str(features.sizes()));
  }
  FeatureStats s;
  s.n = n;
  s.mean = x.mean(0);
  const at::Tensor c = x - s.mean;
  s.cov = c.t().mm(c) / static_cast<double>(n - 1);
  s.cov = 0.5 * (s.cov + s.cov.t());
  return s;
}

void FeatureMoments::add(const at::Tensor& features) {
  const at::Tensor x = checked_features(features, "FeatureMoments::add");
  if (mean.defined() && x.size(1) != mean.size(0)) {
    throw std::invalid_argument("FeatureMoments::add: features " + shape_str(x.sizes()) + " after ones of width " +
                                std::to_string(mean.size(0)));
  }
  FeatureMoments batch;
  batch.n = x.size(0);
  batch.mean = batch.n > 0 ? x.mean(0) : torch::zeros({x.size(1)}, torch::kDouble);
  const at::Tensor c = x - batch.mean;
  batch.m2 = c.t().mm(c);
  merge(batch);
}

void FeatureMoments::merge(const FeatureMoments& o) {
  if (!o.mean.defined()) return;
  if (!mean.defined()) {
    n = o.n;
    mean = o.mean.to(torch::kCPU, torch::kDouble).clone();
    m2 = o.m2.to(torch::kCPU, torch::kDouble).clone();
    return;
  }
  if (o.mean.size(0) != mean.size(0)) {
    throw std::invalid_argument("FeatureMoments::merge: width " + std::to_string(o.mean.size(0)) + " into width " +
                                std::to_string(mean.size(0)));
  }
  if (o.n == 0) return;
  const double na = static_cast<double>(n), nb = static_cast<double>(o.n), nt = na + nb;
  const at::Tensor delta = o.mean.to(torch::kCPU, torch::kDouble) - mean;
  mean = mean + delta * (nb / nt);
  m2 = m2 + o.m2.to(torch::kCPU, torch::kDouble) + torch::outer(delta, delta) * (na * nb / nt);
  n += o.n;
}

FeatureStats FeatureMoments::stats() const {
  if (n < 2 || !mean.defined()) {
    throw std::invalid_argument("FeatureMoments::stats: need at least 2 feature vectors, got " + std::to_string(n));
  }
  FeatureStats s;
  s.n = n;
  s.mean = mean.clone();
  const at::Tensor cov = m2 / static_cast<double>(n - 1);
  s.cov = 0.5 * (cov + cov.t());
  return s;
}

double frechet_distance(const FeatureStats& a, const FeatureStats& b) {
  check_stats(a, "a");
  check_stats(b, "b");
  if (a.mean.size(0) != b.mean.size(0)) {
    throw std::invalid_argument("frechet_distance: feature widths differ: " + std::to_string(a.mean.size(0)) +
                                " vs " + std::to_string(b.mean.size(0)));
  }
  const auto f64 = [](const at::Tensor& t) { return t.to(torch::kCPU, torch::kDouble); };
  const at::Tensor mu_a = f64(a.mean), mu_b = f64(b.mean), sa = f64(a.cov), sb = f64(b.cov);
  // S_a^{1/2} = Q diag(sqrt(l)) Q^T.
  const auto [la, qa] = psd_eigh(sa);
  const at::Tensor sqrt_a = (qa * la.sqrt().unsqueeze(0)).mm(qa.t());
  // tr((S_a^{1/2} S_b S_a^{1/2})^{1/2}) = sum of the square roots of its eigenvalues, which
  // need no eigenvectors (eigvalsh: about a third of eigh's time at 2048 features).
  const at::Tensor m = sqrt_a.mm(sb).mm(sqrt_a);
  const at::Tensor lm = at::linalg_eigvalsh(0.5 * (m + m.t()), "L").clamp_min(0.0);
  const double tr_sqrt = lm.sqrt().sum().item<double>();
  const double dmu2 = (mu_a - mu_b).pow(2).sum().item<double>();
  return dmu2 + sa.trace().item<double>() + sb.trace().item<double>() - 2.0 * tr_sqrt;
}

double class_accuracy(const at::Tensor& predicted, const at::Tensor& labels) {
  if (!predicted.defined() || !labels.defined() || predicted.dim() != 1 || labels.dim() != 1 ||
      predicted.size(0) != labels.size(0) || predicted.size(0) == 0) {
    throw std::invalid_argument("class_accuracy: predicted and labels must both be [N] with N >= 1, got " +
                                (predicted.defined() ? shape_str(predicted.sizes()) : std::string("undefined")) +
                                " and " + (labels.defined() ? shape_str(labels.sizes()) : std::string("undefined")));
  }
  return predicted.to(torch::kCPU, torch::kLong).eq(labels.to(torch::kCPU, torch::kLong))
      .to(torch::kDouble).mean().item<double>();
}

}  // namespace shardgan::eval
