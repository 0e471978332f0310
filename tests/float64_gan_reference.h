#pragma once
// Pieces shared by the float64 plain-autograd references of the GAN objective
// (test_simultaneous_update.cpp, test_aux_class.cpp): the step data, the parameters of a
// model run as plain modules, gradient accumulation, and the relative distance of two runs.
#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "shardgan/sharding/sharded_model.h"

namespace shardgan::test_util {

using Named = std::vector<std::pair<std::string, at::Tensor>>;

/// `steps` global batches of float64 images in (-1, 1) [steps, B, 1, 32, 32] and labels in
/// {0, 1, 2} [steps, B], B = 4 images per rank at 4 ranks for each of `micro` micro-batches.
struct StepData {
  int64_t global = 0;
  at::Tensor x, y;
};

inline StepData make_step_data(int64_t steps, int64_t micro) {
  StepData d;
  d.global = 4 * 4 * micro;
  torch::manual_seed(3);
  d.x = torch::randn({steps, d.global, 1, 32, 32}, torch::kDouble).tanh();
  d.y = torch::randint(0, 3, {steps, d.global}, torch::kLong);
  return d;
}

/// Every parameter of `m`'s units, in unit and slot order (after begin_higher_order()).
inline std::vector<at::Tensor> unit_params(ShardedModel& m) {
  std::vector<at::Tensor> out;
  for (auto& u : m.units()) {
    for (auto& s : u->slots()) out.push_back(s.param);
  }
  return out;
}

/// acc += gr, element by element (acc = gr when empty).
inline void accumulate(std::vector<at::Tensor>& acc, const std::vector<at::Tensor>& gr) {
  if (acc.empty()) {
    acc = gr;
    return;
  }
  for (size_t i = 0; i < acc.size(); ++i) acc[i] = acc[i] + gr[i];
}

/// The largest |got - ref| over every parameter, as a fraction of the largest change of
/// `ref` from `init`.
inline double worst_relative(const Named& init, const Named& ref, const Named& got) {
  double largest = 0, diff = 0;
  for (size_t i = 0; i < init.size(); ++i) {
    largest = std::max(largest, (ref[i].second - init[i].second).abs().max().item<double>());
    diff = std::max(diff, (got[i].second - ref[i].second).abs().max().item<double>());
  }
  return largest > 0 ? diff / largest : 1.0;
}

}  // namespace shardgan::test_util
