#pragma once
/// Which buffers a rank holds alive at once in each phase of one training step, for every
/// update rule, d_steps, placement and pair of ZeRO stages: the description the memory
/// pre-flight counts (preflight.h). Each step executor declares its own placement's phases
/// beside the code that runs them (SharedStepExecutor::phases in src/train/shared_step.cpp,
/// SplitStepExecutor::phases in src/train/split_step.cpp, step_executor.h), and
/// step_phases() asks the executor of the configured placement. Each phase names the
/// function that runs it; tests/test_preflight_phases.cpp holds the description to the
/// gradient shards a real step allocates at every optimizer update.
///
/// A phase is a span of the step; what it lists is alive at some time within the span
/// (a bound on the span, not on every instant of it). The persistent state of the models a
/// rank holds (parameter shards, optimizer state, EMA, hpZ blocks, stage 0-1 flat
/// gradients) is alive in every phase; a phase says in addition, per model:
/// - whether its released gradient shards are allocated (ShardedModel::zero_grad releases
///   them after each of the model's updates; the first reduction of its next backward
///   allocates them again: at stages 2-3 the first micro-batch's, at stages 0-1 the last's);
/// - which of its units are gathered (stage 3): none, the rolling window of a forward or
///   backward (ShardedModel's prefetch, at most 3 units), or all of them
///   (ShardedModel::begin_higher_order: the shared D forward and R1);
/// - whether its backward computes parameter gradients (autograd gradients, the flat
///   gradient and the reduce-scatters in flight);
/// and how many micro-batches of G's images are kept for a later phase.
///
/// Everything here is pure and local (no collective, no tensor); the header has no LibTorch.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "shardgan/sharding/memory_estimate.h"
#include "shardgan/train/step_schedule.h"  // StepShape

namespace shardgan {

struct TrainConfig;

/// What decides the phases of a step (TrainConfig's keys in brackets).
struct PhaseShape {
  /// The step's order (step_schedule.h): train.update, train.shared_d_forward (only the
  /// simultaneous update has it; ignored under alternating), paired data (no effect on what
  /// is alive), train.d_steps and train.micro_batches (>= 1 each).
  StepShape step;
  /// shared: this rank holds G and D; split: only G (generator) or only D (discriminator).
  enum class Placement { kShared, kSplitGenerator, kSplitDiscriminator };
  Placement placement = Placement::kShared;  ///< train.placement (and this rank's group)
  int g_stage = 3, d_stage = 3;  ///< sharding.<model>.stage, 0-3
  /// train.r1_gamma > 0 folded into D's update: D gathered whole for the real pass when due
  bool r1 = false;
  /// Separate regularization updates (ModelFamily::separate_regularization): "D reg" (R1,
  /// train.r1_gamma > 0) and "G reg" (path length, train.pl_weight > 0), each with its model
  /// gathered whole and computing parameter gradients (shared placement only).
  bool r1_update = false, pl_update = false;
};

/// The shape of `cfg`'s step on a rank that holds G (`holds_generator`) and/or D: shared
/// placement (`split` false) holds both; under split placement the rank holds the model of
/// its group. Local, pure.
PhaseShape phase_shape(const TrainConfig& cfg, bool split, bool holds_generator);

/// One phase of a step.
struct StepPhase {
  std::string name;    ///< e.g. "D update 1 sharing G's forward"
  std::string source;  ///< the function that runs it, e.g. "GanObjective::d_update_sharing_forward"
  ModelAlive g, d;     ///< what of G and of D is alive (held false: not on this rank)
  /// Micro-batches of G's images (one local micro-batch each) kept across the phase.
  int64_t kept_image_micro_batches = 0;
};

/// Builds a placement's phase list (the step executors' phases()): what of G and of D a
/// phase holds, given as flags and turned into ModelAlive for the rank's models and stages.
class PhaseBuilder {
 public:
  /// What of one model a phase holds: `window` its forward or backward runs (stage 3
  /// gathers a rolling window of units), `whole` it stays gathered whole
  /// (begin_higher_order), `grads` its backward computes parameter gradients, `shard` its
  /// released gradient shards are allocated. Ignored for a model the rank does not hold.
  struct Alive {
    bool window = false, whole = false, grads = false, shard = false;
  };
  explicit PhaseBuilder(const PhaseShape& s);
  /// Appends a phase named `name`, run by `source`, keeping `kept` micro-batches of images.
  void add(std::string name, std::string source, Alive g, Alive d, int64_t kept = 0);
  std::vector<StepPhase> take() { return std::move(phases_); }
  /// "D update <s + 1>": the name of D step `s` (0-based), as every placement's phases use it.
  static std::string d_update_name(int64_t s) { return "D update " + std::to_string(s + 1); }

 private:
  ModelAlive model_alive(bool held, int stage, Alive a) const;
  PhaseShape s_;
  bool holds_g_, holds_d_;
  std::vector<StepPhase> phases_;
};

/// The phases of one step of `shape`, in order: the phases() of the executor of
/// shape.placement (SharedStepExecutor or SplitStepExecutor). Throws std::invalid_argument naming the
/// field for d_steps or micro_batches < 1 or a stage outside 0-3.
std::vector<StepPhase> step_phases(const PhaseShape& shape);

/// Bytes per rank alive in phase `p`: alive_bytes() of G and D (their persistent state
/// always; with `transient`, the gathered units and gradient buffers too) plus the kept
/// images (`image_micro_batch_bytes` each: one local micro-batch of G's images).
int64_t phase_bytes(const StepPhase& p, const ModelMemoryEstimate& g, const ModelMemoryEstimate& d,
                    bool transient = true, int64_t image_micro_batch_bytes = 0);

/// The largest phase_bytes() over `phases` and the first phase that reaches it (0 bytes,
/// index 0 for no phase).
struct StepPeak {
  int64_t bytes = 0;
  size_t phase = 0;
};
StepPeak step_peak(const std::vector<StepPhase>& phases, const ModelMemoryEstimate& g, const ModelMemoryEstimate& d,
                   bool transient = true, int64_t image_micro_batch_bytes = 0);

/// One line per phase: name, source, and per model "grad shard", "window"/"whole",
/// "grads" where alive. For logs, --dry-run and test messages.
std::string describe(const std::vector<StepPhase>& phases);

}  // namespace shardgan
