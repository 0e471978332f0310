// The phases of one training step and the buffers alive in each (step_phases.h), read off
// GanObjective::step (src/train/objective.cpp) and the split sides (src/train/split_step.cpp).
#include "train/step_phases.h"

#include <algorithm>
#include <sstream>
#include <stdexcept>

#include "shardgan/models/family.h"
#include "shardgan/train/config.h"

namespace shardgan {
namespace {

using Gathered = ModelAlive::Gathered;
using Placement = PhaseShape::Placement;

// What of one model a phase holds: `window` its forward or backward runs (stage 3 gathers a
// rolling window of units), `whole` it stays gathered whole (begin_higher_order), `grads`
// its backward computes parameter gradients, `shard` its released gradient shards are allocated.
struct Alive {
  bool window = false, whole = false, grads = false, shard = false;
};

ModelAlive model_alive(bool held, int stage, Alive a) {
  ModelAlive m;
  m.held = held;
  if (!held) return m;
  m.grad_shard = a.shard;
  m.grad_buffers = a.grads;
  // Only stage 3 gathers: below it every rank keeps the full parameters (persistent state).
  if (stage == 3) m.gathered = a.whole ? Gathered::kWhole : a.window ? Gathered::kWindow : Gathered::kNone;
  return m;
}

class Builder {
 public:
  explicit Builder(const PhaseShape& s)
      : s_(s), holds_g_(s.placement != Placement::kSplitDiscriminator),
        holds_d_(s.placement != Placement::kSplitGenerator) {}
  void add(std::string name, std::string source, Alive g, Alive d, int64_t kept = 0) {
    StepPhase p;
    p.name = std::move(name);
    p.source = std::move(source);
    p.g = model_alive(holds_g_, s_.g_stage, g);
    p.d = model_alive(holds_d_, s_.d_stage, d);
    p.kept_image_micro_batches = kept;
    phases_.push_back(std::move(p));
  }
  std::vector<StepPhase> take() { return std::move(phases_); }

 private:
  const PhaseShape& s_;
  bool holds_g_, holds_d_;
  std::vector<StepPhase> phases_;
};

std::string d_update_name(int64_t s) { return "D update " + std::to_string(s + 1); }

// Shared placement: GanObjective::step.
void shared_phases(const PhaseShape& s, Builder& b) {
  const int64_t k = s.step.micro_batches;
  // D's passes in a D update: real and fake (or joint) forwards and backwards, gathered
  // whole for the real pass when R1 is due (d_real_pass's begin_higher_order).
  const Alive d_training{true, s.r1, true, true};
  const Alive d_frozen{true, false, false, false};  // G's pass: D's input gradients only
  const Alive g_pass{true, false, true, true};
  const Alive g_update{false, false, false, true};
  const Alive none{};
  if (!s.step.simultaneous) {
    // step: d_steps x d_update (G's images under no_grad, D's update), g_pass, update_g.
    // Each update's finish_update ends in zero_grad, which releases the model's shards: no
    // phase holds both models' shards.
    for (int64_t i = 0; i < s.step.d_steps; ++i) {
      b.add(d_update_name(i), "GanObjective::d_update (G forward under no_grad, D forward and backward)",
            {true, false, false, false}, d_training);
      b.add(d_update_name(i) + ": optimizer step", "GanObjective::finish_update from d_update", none, g_update);
    }
    b.add("G pass", "GanObjective::g_pass (G forward and backward through the frozen D)", g_pass, d_frozen);
    b.add("G update", "GanObjective::finish_update from step's update_g", g_update, none);
    return;
  }
  // Simultaneous: G's update waits for every D step when d_steps > 1 (they draw their images
  // from G_t), so G's released shards stay allocated through D's updates.
  const bool g_waits = s.step.d_steps > 1;
  const Alive g_held{false, false, false, g_waits};
  const Alive g_images{true, false, false, g_waits};  // D steps 2..: G's images under no_grad
  int64_t first = 0;
  int64_t kept = 0;
  if (s.step.shared_d_forward) {
    // d_update_sharing_forward: per micro-batch G's forward, one D forward gathered whole
    // (begin_higher_order) to the end of its two backwards, G's backward of dL_G/dx (G's
    // gradients), D's backward of its fake term (D's gradients), D's real pass; then D's
    // update, while G's gradient shards wait for G's update (after it).
    b.add("D update 1 sharing G's forward",
          "GanObjective::d_update_sharing_forward from step (G and D forward and backward)", g_pass,
          {true, true, true, true});
    b.add("D update 1: optimizer step", "GanObjective::finish_update from d_update_sharing_forward",
          {false, false, false, true}, g_update);
    first = 1;
  } else {
    // g_pass keeping its images (`fakes`, alive to the end of the step's branch), which D's
    // first update trains on.
    b.add("G pass (keeping its images)", "GanObjective::g_pass from step (keep = &fakes)", g_pass, d_frozen, k);
    kept = k;
  }
  if (!g_waits) b.add("G update", "GanObjective::finish_update from step's update_g (d_steps 1)", g_update, none, kept);
  for (int64_t i = first; i < s.step.d_steps; ++i) {
    // D update 1 without the shared forward trains on the kept images: no G forward.
    const Alive g = i == 0 ? g_held : g_images;
    b.add(d_update_name(i),
          i == 0 ? "GanObjective::d_update on g_pass's images" : "GanObjective::d_update (G forward under no_grad)", g,
          d_training, kept);
    b.add(d_update_name(i) + ": optimizer step", "GanObjective::finish_update from d_update", g_held, g_update, kept);
  }
  if (g_waits) {
    b.add("G update", "GanObjective::finish_update from step's update_g (d_steps > 1)", g_update, none, kept);
  }
}

// Split placement, G's ranks: GanObjective::split_g_side.
void split_g_phases(const PhaseShape& s, Builder& b) {
  const Alive g_pass{true, false, true, true}, g_update{false, false, false, true}, none{};
  if (!s.step.simultaneous) {
    for (int64_t i = 0; i < s.step.d_steps; ++i) {
      b.add("images for " + d_update_name(i), "split_g_side's d_step_images (G forward under no_grad)",
            {true, false, false, false}, none);
    }
    b.add("G pass", "split_g_side's g_pass (G forward, D's ranks return dL_G/dx, G backward)", g_pass, none);
    b.add("G update", "GanObjective::finish_update from split_g_side's update_g", g_update, none);
    return;
  }
  // G's pass first (with or without the shared D forward: D's side decides), then the images
  // of D steps 2.., G's shards held until G's update when d_steps > 1.
  b.add("G pass", "split_g_side's g_pass (simultaneous: before D's first update)", g_pass, none);
  if (s.step.d_steps == 1) b.add("G update", "GanObjective::finish_update from split_g_side's update_g", g_update, none);
  for (int64_t i = 1; i < s.step.d_steps; ++i) {
    b.add("images for " + d_update_name(i), "split_g_side's d_step_images (G forward under no_grad)",
          {true, false, false, true}, none);
  }
  if (s.step.d_steps > 1) b.add("G update", "GanObjective::finish_update from split_g_side's update_g", g_update, none);
}

// Split placement, D's ranks: GanObjective::split_d_side. D's updates train on the k
// micro-batches of images received from G's ranks (`fakes`, all received first).
void split_d_phases(const PhaseShape& s, Builder& b) {
  const int64_t k = s.step.micro_batches;
  const Alive d_training{true, s.r1, true, true}, d_frozen{true, false, false, false},
      d_update{false, false, false, true}, none{};
  int64_t first = 0;
  if (s.step.simultaneous && s.step.shared_d_forward) {
    b.add("D update 1 sharing G's forward", "split_d_side -> GanObjective::d_update_sharing_forward", none,
          {true, true, true, true});
    b.add("D update 1: optimizer step", "GanObjective::finish_update from d_update_sharing_forward", none, d_update);
    first = 1;
  } else if (s.step.simultaneous) {
    b.add("G pass on D's side (keeping its images)", "split_d_side's g_pass (split_d_score)", none, d_frozen, k);
  }
  for (int64_t i = first; i < s.step.d_steps; ++i) {
    b.add(d_update_name(i), "split_d_side -> GanObjective::d_update on G's ranks' images", none, d_training, k);
    b.add(d_update_name(i) + ": optimizer step", "GanObjective::finish_update from d_update", none, d_update, k);
  }
  if (!s.step.simultaneous) {
    b.add("G pass on D's side", "split_d_side's g_pass (split_d_score: D's input gradients only)", none, d_frozen);
  }
}

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
  s.r1 = cfg.r1_gamma > 0;
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
  Builder b(s);
  switch (s.placement) {
    case Placement::kShared: shared_phases(s, b); break;
    case Placement::kSplitGenerator: split_g_phases(s, b); break;
    case Placement::kSplitDiscriminator: split_d_phases(s, b); break;
  }
  return b.take();
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
