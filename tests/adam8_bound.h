#pragma once
// 8-bit Adam against a float32 twin fed the same gradients, beta2 = 0 (v = g^2 each step, so
// the denominators d = |g| + eps are equal and the runs differ only by m's storage). With
// r_t = (stored m) - m_t the rounding of step t, e_t = m_t - m^f_t = beta1 (e_{t-1} + r_{t-1}),
// and the parameters differ by sum_t s_t e_t / d_t (s_t the step size).
//
// Two bounds come from the code map:
//  - worst case: |r| <= absmax * H(u), H(u) half the larger map gap next to u = m / absmax,
//    so |p_T - p^f_T| <= sum_t s_t E_t / d_t with E_t = beta1 (E_{t-1} + absmax H(u) +
//    slack), plus the float32 roundings of both runs (2^-22 of each term);
//  - typical: a rounding to nearest inside a gap of width G errs by a value spread evenly
//    over +-G/2 (variance G^2 / 12), independently from step to step, so p_T - p^f_T =
//    sum_k r_k w_k, w_k = beta1 (s_{k+1}/d_{k+1} + w_{k+1}), has variance
//    sum_k w_k^2 absmax^2 G(u_k)^2 / 12. A map of half the resolution doubles G.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace shardgan::test_adam8 {

// Half the larger of the two map gaps around u (the rounding error bound of a value in
// either gap), from a sorted map.
inline double half_gap(const std::vector<double>& map, double u) {
  auto it = std::upper_bound(map.begin(), map.end(), u);
  const size_t k = static_cast<size_t>(it - map.begin());  // map[k-1] <= u < map[k]
  double g = 0;
  if (k >= 1 && k < map.size()) g = std::max(g, map[k] - map[k - 1]);
  if (k >= 2) g = std::max(g, map[k - 1] - map[k - 2]);
  if (k + 1 < map.size()) g = std::max(g, map[k + 1] - map[k]);
  return g / 2;
}

// Width of the map gap holding u (0 when u is a map value: it is stored exactly).
inline double gap_width(const std::vector<double>& map, double u) {
  auto it = std::upper_bound(map.begin(), map.end(), u);
  const size_t k = static_cast<size_t>(it - map.begin());
  if (k == 0 || k == map.size() || map[k - 1] == u) return 0.0;
  return map[k] - map[k - 1];
}

// E_t from E_{t-1} and the state stored after step t-1 (value `stored`, block absmax A),
// mf the twin's m before step t: |r| <= A (H(u) + 2^-23) + ulp(stored) / 2, since the code
// is the nearest to the rounded x / A and the stored value is the rounded code * A; plus
// the roundings of m in both runs.
inline double next_error(double E, double beta1, const std::vector<double>& map, double stored, double A,
                         double mf) {
  const double u = A == 0 ? 0.0 : stored / A;
  return beta1 * (E + A * (half_gap(map, u) + std::ldexp(1.0, -23)) +
                  std::ldexp(std::fabs(stored) + std::fabs(mf), -21));
}

// One step's share of the worst-case bound on |p - p^f|: step s, error bound E, the twin's
// new m, d = |g| + eps, and both runs' new parameters (their float32 roundings).
inline double bound_term(double step, double E, double mf, double d, double p, double pf) {
  return step * (E + std::ldexp(std::fabs(mf), -21)) / d +
         std::ldexp(std::fabs(p) + std::fabs(pf) + 2 * step * std::fabs(mf) / d, -22);
}

// The typical bound: per element, the standard deviation of p_T - p^f_T that roundings
// spread evenly over their gaps give. Record each step's s/d and each stored m's rounding
// variance, then sd() sums them backwards.
class DriftVariance {
 public:
  DriftVariance(int64_t n, double beta1) : n_(n), beta1_(beta1) {}
  // Step t: c[i] = s_t / d_t[i] and var[i] = the variance of the rounding of the m stored
  // after step t.
  void record(std::vector<float> c, std::vector<float> var) {
    c_.push_back(std::move(c));
    var_.push_back(std::move(var));
  }
  std::vector<double> sd() const {
    std::vector<double> w(static_cast<size_t>(n_), 0.0), total(static_cast<size_t>(n_), 0.0);
    for (size_t k = c_.size(); k-- > 0;) {
      // w_k = beta1 (c_{k+1} + w_{k+1}); the last step's rounding moves nothing.
      if (k + 1 < c_.size()) {
        for (size_t i = 0; i < w.size(); ++i) w[i] = beta1_ * (c_[k + 1][i] + w[i]);
      }
      for (size_t i = 0; i < w.size(); ++i) total[i] += w[i] * w[i] * var_[k][i];
    }
    for (double& t : total) t = std::sqrt(t);
    return total;
  }

 private:
  int64_t n_;
  double beta1_;
  std::vector<std::vector<float>> c_, var_;
};

}  // namespace shardgan::test_adam8
