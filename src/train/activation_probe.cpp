#include "shardgan/train/activation_probe.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <stdexcept>

#include <c10/core/Allocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "shardgan/comm/shadow_communicator.h"
#include "shardgan/models/family.h"
#include "shardgan/sharding/sharded_model.h"
#include "shardgan/sharding/sharded_unit.h"
#include "shardgan/train/trainer.h"

namespace shardgan {
namespace {

// Bytes allocated minus freed on the CPU since the reporter was installed, and their peak.
// Blocks allocated before are not seen when freed, so the count errs high, never low.
struct PeakReporter final : c10::MemoryReportingInfoBase {
  std::atomic<int64_t> current{0}, peak{0};
  void reportMemoryUsage(void*, int64_t size, size_t, size_t, c10::Device device) override {
    if (!device.is_cpu()) return;
    const int64_t now = current.fetch_add(size) + size;
    int64_t p = peak.load();
    while (now > p && !peak.compare_exchange_weak(p, now)) {
    }
  }
  bool memoryProfilingEnabled() const override { return true; }
};

constexpr int kShadowWorld = 64;  // shards of 1/64: small next to the gathered units

int64_t probe_once(const TrainConfig& cfg, int64_t micro_batch, const std::string& dir) {
  TrainConfig p = cfg;
  p.steps = 1;
  p.d_steps = 1;
  p.micro_batches = 1;
  p.global_batch = micro_batch * kShadowWorld;
  p.run_dir = dir;
  p.preempt_grace_s = 0;
  p.checkpoint_async = false;  // the probe saves nothing, and the shadow backend cannot split
  p.eval_enabled = false;      // no evaluator: its classifier and reference images are not the step's
  p.warnings.clear();          // the real run logs the config's warnings
  // Nor split off hpZ's secondary groups: their blocks are persistent state, which the
  // estimate counts exactly (ModelMemoryEstimate::secondary_param_bytes).
  p.g_sharding.hpz_partition_size = 1;
  p.d_sharding.hpz_partition_size = 1;
  p.on_nonfinite = "skip";
  p.max_nonfinite_steps = 1000;
  for (OptimizerConfig* oc : {&p.g_optim, &p.d_optim}) oc->offload = OffloadConfig{};
  ShadowCommunicator shadow(kShadowWorld);
  if (!p.family) throw std::invalid_argument(p.source + ": no model family (model.arch) was read");
  const ModelFamily* family = p.family.get();
  const ImageShape s = family->image_shape();
  at::Tensor images = torch::rand({p.global_batch, s.channels, s.height, s.width}, torch::dtype(p.model_dtype)) * 2 - 1;
  at::Tensor labels;
  if (family->num_classes() > 0) labels = torch::randint(family->num_classes(), {p.global_batch}, torch::kLong);
  if (family->condition_channels() > 0) {  // image-to-image: the input images A
    labels = torch::rand({p.global_batch, family->condition_channels(), s.height, s.width}, torch::dtype(p.model_dtype)) * 2 - 1;
  }
  Trainer trainer(p, shadow, images, labels);
  // The gradient shards are state, which the prediction counts apart (the step's phases,
  // include/shardgan/train/step_phases.h, say whose are alive at once: both models' in the simultaneous
  // update's shared D forward and with d_steps > 1, which this one-D-step probe could not
  // show): kept and allocated here, before the count starts, they are not counted as the
  // step's.
  for (ShardedModel* m : {&trainer.generator(), &trainer.discriminator()}) {
    m->set_release_grad_shards(false);
    for (auto& u : m->units()) u->grad_shard();
  }
  auto reporter = std::make_shared<PeakReporter>();
  {
    c10::DebugInfoGuard guard(c10::DebugInfoKind::PROFILER_STATE, reporter);
    try {
      trainer.train_step();
    } catch (const NonFiniteError&) {  // stand-in values may overflow; the passes ran
    }
  }
  return reporter->peak.load();
}

}  // namespace

int64_t ActivationProbe::bytes_at(int64_t micro_batch) const {
  if (micro_batch_b == 0) return peak_a_bytes;
  const double v = static_cast<double>(peak_a_bytes) + (micro_batch - micro_batch_a) * bytes_per_sample();
  return std::max<int64_t>(static_cast<int64_t>(v), micro_batch >= micro_batch_b ? peak_b_bytes : 0);
}

double ActivationProbe::bytes_per_sample() const {
  if (micro_batch_b == 0) return 0;
  return std::max(0.0, static_cast<double>(peak_b_bytes - peak_a_bytes) / static_cast<double>(micro_batch_b - micro_batch_a));
}

ActivationProbe probe_step_memory(const TrainConfig& cfg, const std::string& work_dir, int64_t micro_batch_a,
                                  int64_t micro_batch_b) {
  if (micro_batch_a < 1 || (micro_batch_b != 0 && micro_batch_b <= micro_batch_a)) {
    throw std::invalid_argument("activation probe: micro-batches " + std::to_string(micro_batch_a) + " and " +
                                std::to_string(micro_batch_b) + " (need 1 <= a < b, or b = 0)");
  }
  if (cfg.compute_device.is_cuda()) {
    throw std::invalid_argument("train.memory_probe: measures host allocations only; off with run.device=cuda");
  }
  if (cfg.g_replicate_degree != 1 || cfg.d_replicate_degree != 1) {
    throw std::invalid_argument("train.memory_probe: not available with hybrid sharding (replicate_degree != 1)");
  }
  const auto t0 = std::chrono::steady_clock::now();
  const auto level = spdlog::get_level();
  // The stand-in trainer's own lines: its info, and its warnings about steps skipped on
  // non-finite values, which the stand-in gathers (shard 0 copied into every block) can
  // produce. Its errors still show.
  spdlog::set_level(spdlog::level::err);
  // Undone whether the probes return or throw.
  auto restore = [&] {
    spdlog::set_level(level);
    std::filesystem::remove_all(work_dir);
  };
  ActivationProbe r;
  r.shadow_world = kShadowWorld;
  r.micro_batch_a = micro_batch_a;
  r.micro_batch_b = micro_batch_b;
  try {
    r.peak_a_bytes = probe_once(cfg, r.micro_batch_a, work_dir);
    if (r.micro_batch_b > 0) r.peak_b_bytes = probe_once(cfg, r.micro_batch_b, work_dir);
  } catch (...) {
    restore();
    throw;
  }
  restore();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

ActivationProbe probe_step_memory(const TrainConfig& cfg, const std::string& work_dir, int64_t micro_batch) {
  if (micro_batch <= kProbeExactMaxBatch) return probe_step_memory(cfg, work_dir, std::max<int64_t>(micro_batch, 1), 0);
  return probe_step_memory(cfg, work_dir, kProbeExactMaxBatch, 2 * kProbeExactMaxBatch);
}

}  // namespace shardgan
