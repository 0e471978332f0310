#pragma once
// Pieces shared by the float64 plain-autograd references of the GAN objective
// (test_simultaneous_update.cpp, test_aux_class.cpp): the step data, the objective's run
// on sharded models with SGD, the reference's models run as plain modules on this rank
// alone, gradient accumulation, and the relative distance of two runs.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <mpi.h>
#include <torch/torch.h>

#include "shardgan/comm/mpi_communicator.h"
#include "shardgan/models/biggan.h"
#include "shardgan/nn/power_iteration.h"
#include "shardgan/optim/factory.h"
#include "shardgan/optim/loss_scaler.h"
#include "shardgan/sharding/deferred.h"
#include "shardgan/sharding/sharded_model.h"
#include "shardgan/train/objective.h"
#include "test_util.h"

namespace shardgan::test_util {

using Named = std::vector<std::pair<std::string, at::Tensor>>;

/// `steps` x `per_step` global batches of float64 images in (-1, 1) [steps * per_step, B,
/// 1, 32, 32] and labels in {0, 1, 2} [steps * per_step, B], B = 4 images per rank at 4
/// ranks for each of `micro` micro-batches. Step t's real batches are t * per_step ... (one
/// per D step, the last one repeated when a step has more D steps than `per_step`); the
/// labels G's latents are drawn for are those of the step's first batch, t * per_step.
/// per_step 1 gives the same tensors as before it existed (one torch::randn and one
/// torch::randint after manual_seed(3)).
struct StepData {
  int64_t global = 0, per_step = 1;
  at::Tensor x, y;
  /// Index of step t's real batch for its D step s (0-based).
  int64_t batch(int64_t t, int64_t s) const { return t * per_step + std::min(s, per_step - 1); }
  int64_t steps() const { return x.size(0) / per_step; }
};

inline StepData make_step_data(int64_t steps, int64_t micro, int64_t per_step = 1) {
  StepData d;
  d.global = 4 * 4 * micro;
  d.per_step = per_step;
  torch::manual_seed(3);
  d.x = torch::randn({steps * per_step, d.global, 1, 32, 32}, torch::kDouble).tanh();
  d.y = torch::randint(0, 3, {steps * per_step, d.global}, torch::kLong);
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

/// Full parameters of G and D before and after a run.
struct TrainedParams {
  Named g_init, d_init, g, d;
};

/// The objective under test: G and D of `cfg` built on `comm` at ZeRO `stage` (float64,
/// seeds 11 and 12), plain SGD at `lr`, and data.steps() steps of the objective that
/// `make` returns (spectral norm paused). Each D step's real micro-batch j is this rank's
/// slice of micro-batch j of the step's next real batch (StepData::batch: StepInputs::real
/// with micro 0 moves to the next one); the latents are drawn from one generator seeded 5
/// with the labels of the step's first batch. `on_step` sees each step's metrics. Collective.
inline TrainedParams run_objective(MpiCommunicator& comm, const BigGanConfig& cfg, int stage, const StepData& data,
                                   int64_t micro, double lr, const std::function<std::unique_ptr<GanObjective>()>& make,
                                   const std::function<void(const StepMetrics&)>& on_step = {}) {
  BigGanFamily fam(cfg);
  ShardingConfig sc = sharding(stage);
  auto g = build_sharded_model(fam.generator(comm), comm, sc, 11, at::kDouble);
  auto d = build_sharded_model(fam.discriminator(comm), comm, sc, 12, at::kDouble);
  OptimizerConfig sgd;
  sgd.type = OptimizerType::kSgd;
  sgd.lr = lr;
  auto og = make_optimizer(*g, sgd);
  auto od = make_optimizer(*d, sgd);
  DynamicLossScaler sg(LossScalerConfig{}, at::kDouble), sd(LossScalerConfig{}, at::kDouble);
  const std::unique_ptr<GanObjective> obj = make();
  const int64_t w = comm.world_size(), per = data.global / micro / w;
  auto gen = at::detail::createCPUGenerator(5);
  int64_t t = 0, s = -1;  // step, and its D step (the number of real batches begun, less one)
  StepInputs in;
  in.local = [&](const at::Tensor& a, int64_t j) { return a.narrow(0, (j * w + comm.rank()) * per, per); };
  in.real = [&](int64_t j) {
    if (j == 0) ++s;
    const int64_t b = data.batch(t, std::max<int64_t>(s, 0));
    return TensorList{in.local(data.x[b], j), in.local(data.y[b], j)};
  };
  in.latents = [&] {
    return TensorList{fam.sample_latents(data.global, gen, at::kDouble), data.y[data.batch(t, 0)]};
  };
  TrainedParams r;
  r.g_init = g->gather_full_parameters();
  r.d_init = d->gather_full_parameters();
  PowerIterationPause paused;
  for (t = 0; t < data.steps(); ++t) {
    s = -1;
    const StepMetrics m = obj->step({g.get(), og.get(), &sg}, {d.get(), od.get(), &sd}, in);
    if (on_step) on_step(m);
  }
  r.g = g->gather_full_parameters();
  r.d = d->gather_full_parameters();
  return r;
}

/// The reference's models: G and D of `cfg` built as run_objective builds them, on this
/// rank alone (MPI_COMM_SELF, stage 0), every unit gathered and run as a plain module
/// (ShardedModel::begin_higher_order); `gp` and `dp` their parameters (unit_params).
struct PlainGan {
  explicit PlainGan(const BigGanConfig& cfg)
      : fam(cfg),
        g(build_sharded_model(fam.generator(self), self, sharding(0), 11, at::kDouble)),
        d(build_sharded_model(fam.discriminator(self), self, sharding(0), 12, at::kDouble)) {
    init.g_init = g->gather_full_parameters();
    init.d_init = d->gather_full_parameters();
    g->begin_higher_order();
    d->begin_higher_order();
    gp = unit_params(*g);
    dp = unit_params(*d);
  }
  /// The initial parameters and the ones now.
  TrainedParams result() const {
    TrainedParams r = init;
    r.g = g->gather_full_parameters();
    r.d = d->gather_full_parameters();
    return r;
  }
  MpiCommunicator self{MPI_COMM_SELF, 60.0};
  BigGanFamily fam;
  std::unique_ptr<ShardedModel> g, d;
  std::vector<at::Tensor> gp, dp;
  TrainedParams init;
};

}  // namespace shardgan::test_util
