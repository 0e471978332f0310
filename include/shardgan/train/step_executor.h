#pragma once
/// A step executor runs one training step's passes (GanObjective's) in its placement's
/// order, owns the communication that order needs, and turns every rank's StepStats into
/// the step's figures (StepFiguresExchange). One implementation per placement:
///   - SharedStepExecutor: every rank holds both models (train.placement shared).
///   - SplitStepExecutor: G's ranks hold G, D's ranks D; the transfers between them follow
///     one declarative schedule (step_schedule.h) that both sides generate and check.
/// The trainer keeps the loop and its order of events and calls step(), then
/// post_figures() / finish_figures() (which the shared executor answers at once).
#include <cstddef>
#include <deque>
#include <memory>
#include <vector>

#include "shardgan/train/objective.h"
#include "shardgan/train/step_figures.h"
#include "shardgan/train/step_phases.h"
#include "shardgan/train/step_schedule.h"

namespace shardgan {

class Communicator;
class SplitPlacement;

class StepExecutor {
 public:
  virtual ~StepExecutor() = default;
  /// Collective over the world. Runs one step. Shared placement: returns the step's figures
  /// (every field but step and step_time_s). Split placement: returns this rank's own
  /// figures; the step's come from finish_figures after post_figures.
  virtual StepMetrics step(TrainedModel g, TrainedModel d, const StepInputs& in) = 0;
  /// Whether a step's figures travel after the step (post_figures / finish_figures) rather
  /// than inside step().
  virtual bool defers_figures() const = 0;
  /// Collective, non-blocking (defers_figures only): posts the figures of the step step()
  /// just ran, with `local` (the caller's record, whose other fields are kept) and caller
  /// `votes` of which finish_figures gives the world's maxima. Throws std::logic_error
  /// without a step since the last post, or when the executor does not defer.
  virtual void post_figures(const StepMetrics& local, const std::vector<double>& votes = {});
  /// Waits for the oldest posted figures (CollectiveTimeout after the world's timeout) and
  /// returns that step's record, identical on every rank, with the votes' maxima in
  /// `votes`. The wait counts as idle time in the next step. Throws std::logic_error when
  /// none is in flight.
  virtual StepMetrics finish_figures(std::vector<double>* votes = nullptr);
  /// Steps whose figures are posted and not finished.
  virtual size_t figures_in_flight() const { return 0; }
};

/// Shared placement: GanObjective's update orders (alternating; simultaneous, with or
/// without the shared D forward), each rank's StepStats averaged over the world at the
/// step's end (one all-gather).
class SharedStepExecutor final : public StepExecutor {
 public:
  /// `obj` (and its world communicator) must outlive the executor.
  explicit SharedStepExecutor(GanObjective& obj);
  /// The phases of one step of `shape` (shape.placement kShared) and what each keeps
  /// alive (step_phases.h), declared here beside the order step() runs. Local, pure.
  static std::vector<StepPhase> phases(const PhaseShape& shape);
  StepMetrics step(TrainedModel g, TrainedModel d, const StepInputs& in) override;
  bool defers_figures() const override { return false; }

 private:
  GanObjective& obj_;
  StepFiguresExchange figures_;
};

/// train.placement split (split_placement.h): this rank runs its model's side of the step.
/// Both update rules give the shared placement's updates: G's side makes the images and
/// backpropagates the gradients D's side returns; D's side scores them, returns dL_G/dx
/// for G's pass and trains on them. With the simultaneous update D's side returns dL_G/dx
/// before its own update, so G's backward, update and next forward run while D updates.
/// Every transfer names its slot of the step's schedule (split_schedule of the
/// objective's shape), which SplitPlacement checks before any byte moves; the two sides
/// compare the schedule's fingerprint over the world at construction. D's verdict on G's
/// loss travels with each gradient: a micro-batch whose G loss is not finite on a D rank
/// sends NaN gradients, so G's ranks skip the update as the shared placement does.
/// With paired data (alternating update only) G's ranks read their slices' pairs too: A
/// is G's input and B the target of G's L1 term, which G's side adds to the adversarial
/// gradient D's side returns; D's side scores {G(A), A} with its own slices' A.
class SplitStepExecutor final : public StepExecutor {
 public:
  /// Collective over the world (the schedule check). Sets the objective's update
  /// communicator to this rank's group. Throws std::invalid_argument with paired data and
  /// the simultaneous update, and std::runtime_error on every rank when the two sides'
  /// schedules differ. `obj` and `split` must outlive the executor.
  SplitStepExecutor(GanObjective& obj, SplitPlacement& split);
  /// The phases of one step of `shape` on a rank of G's group (kSplitGenerator) or D's
  /// (kSplitDiscriminator) and what each keeps alive (step_phases.h), declared here
  /// beside the order g_side() and d_side() run. Local, pure.
  static std::vector<StepPhase> phases(const PhaseShape& shape);
  ~SplitStepExecutor() override;
  StepMetrics step(TrainedModel g, TrainedModel d, const StepInputs& in) override;
  bool defers_figures() const override { return true; }
  void post_figures(const StepMetrics& local, const std::vector<double>& votes = {}) override;
  StepMetrics finish_figures(std::vector<double>* votes = nullptr) override;
  size_t figures_in_flight() const override { return figures_.in_flight(); }

 private:
  void g_side(TrainedModel g, const StepInputs& in, StepStats& st);
  void d_side(TrainedModel d, DynamicLossScaler* g_scaler, const StepInputs& in, StepStats& st);
  /// G's pass on D's side, micro-batch j: scores the images G's ranks send (with D's
  /// condition `y`: labels, A images when paired, or undefined) against the frozen D and
  /// sends back dL_G/dx (NaN when G's loss is not finite); returns the images (detached).
  GanObjective::MicroFakes score_for_g(TrainedModel d, int32_t j, const at::Tensor& y, at::ScalarType md,
                                       StepStats& st);
  /// Sends G's images of slot {kImagesToD, d_step, j} (G's side) or receives them (D's).
  at::Tensor images(int32_t d_step, int32_t j, const at::Tensor& mine = {});
  /// Sends dL_G/dx of G's pass micro-batch j (D's side) or receives it (G's).
  at::Tensor grads(int32_t j, const at::Tensor& mine = {});

  GanObjective& obj_;
  SplitPlacement& split_;
  StepFiguresExchange figures_;
  std::vector<ScheduledTransfer> schedule_;
  StepStats last_;           // this rank's figures of the last step, until post_figures
  std::deque<StepMetrics> pending_local_;  // the caller's records of the posted steps
  RankRole role_;
  bool stepped_ = false;     // a step ran since the last post
  double figures_wait_s_ = 0;  // finish_figures' waits since the last step
};

}  // namespace shardgan
