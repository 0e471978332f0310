// The phases of one training step and the buffers alive in each (step_phases.h): the
// builder, the dispatch to the executor of the placement, and the byte counts.
#include "shardgan/train/step_phases.h"

#include <algorithm>
#include <sstream>
#include <stdexcept>

#include "shardgan/models/family.h"
#include "shardgan/train/config.h"
#include "shardgan/train/step_executor.h"

namespace shardgan {
namespace {

using Gathered = ModelAlive::Gathered;
using Placement = PhaseShape::Placement;

}  // namespace

PhaseBuilder::PhaseBuilder(const PhaseShape& s)
    : s_(s), holds_g_(s.placement != Placement::kSplitDiscriminator),
      holds_d_(s.placement != Placement::kSplitGenerator) {}

void PhaseBuilder::add(std::string name, std::string source, Alive g, Alive d, int64_t kept) {
  StepPhase p;
  p.name = std::move(name);
  p.source = std::move(source);
  p.g = model_alive(holds_g_, s_.g_stage, g);
  p.d = model_alive(holds_d_, s_.d_stage, d);
  p.kept_image_micro_batches = kept;
  phases_.push_back(std::move(p));
}

ModelAlive PhaseBuilder::model_alive(bool held, int stage, Alive a) const {
  ModelAlive m;
  m.held = held;
  if (!held) return m;
  m.grad_shard = a.shard;
  m.grad_buffers = a.grads;
  // Only stage 3 gathers: below it every rank keeps the full parameters (persistent state).
  if (stage == 3) m.gathered = a.whole ? Gathered::kWhole : a.window ? Gathered::kWindow : Gathered::kNone;
  return m;
}

namespace {

int64_t model_bytes(const ModelAlive& a, const ModelMemoryEstimate& e, bool transient) {
  if (!a.held) return 0;
  if (transient) return alive_bytes(e, a);
  ModelAlive state = a;
  state.gathered = Gathered::kNone;
  state.grad_buffers = false;
  return alive_bytes(e, state);
}

}  // namespace

PhaseShape phase_shape(const TrainConfig& cfg, bool split, bool holds_generator) {
  PhaseShape s;
  s.step.simultaneous = cfg.update == "simultaneous";
  s.step.shared_d_forward = cfg.shared_d_forward && s.step.simultaneous;
  s.step.paired = cfg.family && cfg.family->condition_channels() > 0;
  s.step.d_steps = cfg.d_steps;
  s.step.micro_batches = cfg.micro_batches;
  s.placement = !split            ? Placement::kShared
                : holds_generator ? Placement::kSplitGenerator
                                  : Placement::kSplitDiscriminator;
  s.g_stage = cfg.g_sharding.stage;
  s.d_stage = cfg.d_sharding.stage;
  const bool separate = cfg.family && cfg.family->separate_regularization();
  s.r1 = cfg.r1_gamma > 0 && !separate;
  s.r1_update = cfg.r1_gamma > 0 && separate;
  s.pl_update = cfg.pl_weight > 0 && separate;
  return s;
}

std::vector<StepPhase> step_phases(const PhaseShape& s) {
  if (s.step.d_steps < 1) {
    throw std::invalid_argument("step phases: d_steps = " + std::to_string(s.step.d_steps) + " (must be >= 1)");
  }
  if (s.step.micro_batches < 1) {
    throw std::invalid_argument("step phases: micro_batches = " + std::to_string(s.step.micro_batches) +
                                " (must be >= 1)");
  }
  for (int st : {s.g_stage, s.d_stage}) {
    if (st < 0 || st > 3) throw std::invalid_argument("step phases: stage = " + std::to_string(st) + " (use 0-3)");
  }
  return s.placement == Placement::kShared ? SharedStepExecutor::phases(s) : SplitStepExecutor::phases(s);
}

int64_t phase_bytes(const StepPhase& p, const ModelMemoryEstimate& g, const ModelMemoryEstimate& d, bool transient,
                    int64_t image_micro_batch_bytes) {
  return model_bytes(p.g, g, transient) + model_bytes(p.d, d, transient) +
         p.kept_image_micro_batches * image_micro_batch_bytes;
}

StepPeak step_peak(const std::vector<StepPhase>& phases, const ModelMemoryEstimate& g, const ModelMemoryEstimate& d,
                   bool transient, int64_t image_micro_batch_bytes) {
  StepPeak peak;
  for (size_t i = 0; i < phases.size(); ++i) {
    const int64_t b = phase_bytes(phases[i], g, d, transient, image_micro_batch_bytes);
    if (i == 0 || b > peak.bytes) peak = {b, i};
  }
  return peak;
}

std::string describe(const std::vector<StepPhase>& phases) {
  std::ostringstream o;
  auto model = [&](const char* name, const ModelAlive& a) {
    if (!a.held) return;
    o << "; " << name << ":";
    if (a.grad_shard) o << " grad shard";
    if (a.gathered == Gathered::kWindow) o << " window";
    if (a.gathered == Gathered::kWhole) o << " whole";
    if (a.grad_buffers) o << " grads";
  };
  for (const StepPhase& p : phases) {
    o << p.name << " (" << p.source << ")";
    model("G", p.g);
    model("D", p.d);
    if (p.kept_image_micro_batches > 0) o << "; " << p.kept_image_micro_batches << " micro-batches of images kept";
    o << "\n";
  }
  return o.str();
}

}  // namespace shardgan
