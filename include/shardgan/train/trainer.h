#pragma once
/// The training loop and its order of events. It delegates to four parts: DataPipeline (the
/// real images, held-out sets, latents), ModelSet (G, D, optimizers, EMA and the groups they
/// run on), the StepExecutor of the placement (one step's passes and transfers) and
/// CheckpointManager (sync and async saves, retention); PeriodicActions logs, samples and
/// evaluates. Both models are sharded on their own.
#include <array>
#include <chrono>
#include <memory>
#include <string>
#include <utility>

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include "shardgan/checkpoint/checkpoint.h"
#include "shardgan/data/images.h"
#include "shardgan/models/family.h"
#include "shardgan/train/checkpoint_manager.h"
#include "shardgan/train/config.h"
#include "shardgan/train/data_pipeline.h"
#include "shardgan/train/evaluation.h"
#include "shardgan/train/model_set.h"
#include "shardgan/train/periodic.h"
#include "shardgan/train/step_executor.h"

namespace shardgan {

class Trainer {
 public:
  /// Builds G, D, their optimizers and the sampler. `images` ([N, C, H, W] of the family's
  /// image shape, the model dtype) may be undefined: then the dataset named in the config
  /// is loaded (DataError if it is missing). `labels` (int64 [N]) go with `images`; when
  /// undefined and the family is conditional, synthetic labels are drawn. With
  /// data.source hdf5 (and no `images`), nothing is loaded: each rank opens data.path,
  /// validates it (DataError naming the file and dataset; ConfigError when its image shape
  /// or labels do not fit the model) and a background thread reads this rank's micro-batches
  /// ahead into a queue of data.prefetch_batches. Local (no collectives), but every rank
  /// must construct it; with sharding.<model>.replicate_degree != 1 it is a collective (the
  /// replica groups are split off `comm`, hybrid_communicator.h). With train.placement
  /// split it is a collective too (the G and D groups are split off `comm`, and the two
  /// models' sizes are all-reduced): a rank builds only its group's model, and only D's
  /// ranks read data (ConfigError naming the key when the world size does not allow it).
  Trainer(TrainConfig cfg, Communicator& comm, at::Tensor images = {}, at::Tensor labels = {});
  ~Trainer();

  /// Collective. d_steps D updates then one G update on the next global batches; its
  /// metrics are complete (under split placement it waits for the step's world figures).
  StepMetrics train_step();

  /// Collective. Trains until step() == cfg.steps, logging, sampling and checkpointing
  /// as configured, and always saving a final checkpoint and sample grid. Ends with
  /// report_memory (periodic.h), which stores `preflight` (may be null) beside the
  /// measured peak RSS of every rank. After every step the ranks vote (one all-reduce) on
  /// a preemption signal (preemption.h): if any rank got one, every rank saves a
  /// checkpoint and returns early. Throws NonFiniteError (objective.h) on every rank when a
  /// NaN or Inf ends the job (train.on_nonfinite, train.max_nonfinite_steps).
  /// With train.placement split the vote rides with the step's world figures
  /// (StepExecutor::post_figures), which are waited for only after the next step,
  /// so that G's ranks need not wait for D's update: a step's figures are logged, its
  /// NaN/Inf verdict acted on, and its votes obeyed one step later, at the end of the
  /// next step (every rank alike). Before an evaluation, a sample grid, a checkpoint or
  /// the last step nothing is left in flight.
  void run(const nlohmann::json& preflight = nullptr);

  /// Collective. Saves a checkpoint of the current state synchronously (after waiting for
  /// a background write in flight); returns its directory.
  std::string save();
  /// Collective. With checkpoint.async, snapshots the current state and writes the
  /// checkpoint in the background (AsyncCheckpointer::save; the previous background write
  /// is waited for first, and its error rethrown); returns the directory it will have once
  /// committed. Without checkpoint.async, save().
  std::string save_async();
  /// Collective. Restores from what `--resume` names (see resolve_checkpoint_dir): rank 0
  /// picks the checkpoint and every rank confirms it sees it (agree_checkpoint_dir), so
  /// all ranks load the same step; with data.source hdf5 the read-ahead restarts at the
  /// restored epoch and batch. Throws CheckpointError on every rank.
  void resume(const std::string& path);
  /// Collective. `--resume auto`: resumes from the newest committed checkpoint under
  /// cfg.run_dir, as rank 0 sees it, and returns true, or returns false on every rank (a
  /// fresh start) when rank 0 sees none.
  bool resume_auto();
  /// Collective (G forward). Writes PNG grids from the fixed sample batch (rank 0 writes):
  /// 8x8 for an unconditional family, one class per row for a conditional one, and the
  /// same from G's EMA when ema.enabled. Returns the first grid's path (under split
  /// placement G's ranks only; D's ranks return "" at once).
  std::string write_samples();
  /// Collective (G forwards, one all-reduce; under split placement over G's ranks only,
  /// and D's ranks get an empty object at once). FID and class accuracy of G and, with
  /// EMA, of its EMA (evaluation.h); rank 0 appends them to metrics.jsonl. Throws
  /// ConfigError unless eval.enabled.
  nlohmann::json evaluate();

  int64_t step() const { return counters_.step; }
  /// The models, optimizers, EMA and groups of this rank.
  ModelSet& models() { return *models_; }
  /// The generator's EMA, or nullptr when ema.enabled is false.
  ShardedEma* ema() { return models_->ema(); }
  /// Under train.placement split a rank holds one of them: the other is not built here
  /// (std::logic_error naming the model).
  ShardedModel& generator();
  ShardedModel& discriminator();
  /// ADA's state (augment.mode not none), else nullptr.
  const AdaptiveAugment* augment() const { return augment_.get(); }
  bool holds_generator() const { return models_->holds_generator(); }
  bool holds_discriminator() const { return models_->holds_discriminator(); }
  /// Parameter counts of both models, on every rank (whichever it holds).
  int64_t generator_numel() const { return models_->generator_numel(); }
  int64_t discriminator_numel() const { return models_->discriminator_numel(); }
  /// Local accounting for one model, optimizer state included.
  MemoryStats memory_stats(ShardedModel& m) const { return models_->memory_stats(&m); }
  const TrainConfig& config() const { return cfg_; }

 private:
  /// Collective: loads checkpoint directory `dir`, agreed on by every rank.
  void load_resolved(const std::string& dir);
  /// Local: the counters a checkpoint stores (noise RNG, loss scalers, non-finite counts).
  void fill_counters();
  /// Counts a step whose update was skipped for a NaN or Inf, and throws NonFiniteError
  /// when the policy says so (identically on every rank: the flags were voted).
  void check_nonfinite(StepMetrics& r);
  /// Split placement, collective over the world (a no-op otherwise): G's ranks have just
  /// evaluated or written a sample grid (`what`), which D's ranks do not take part in; every
  /// rank meets in a barrier whose timeout is dist.timeout_s + eval.timeout_s, so D's ranks
  /// wait through G's work explicitly instead of timing out in the next step's first
  /// transfer. Throws CollectiveTimeout naming eval.timeout_s.
  void await_generator_ranks(const char* what);
  /// Collective. The step itself: under split placement without its world figures
  /// (StepExecutor::post_figures), else complete but for check_nonfinite.
  StepMetrics run_step();
  /// Local: this rank's preemption signal (or 0) and rank 0's verdict on
  /// train.time_limit_s after `elapsed_s` seconds of training (1 or 0), for a vote.
  std::vector<double> local_votes(double elapsed_s) const;
  /// Collective (one all-reduce of 2 doubles): the largest preemption signal any rank
  /// received, or 0; `time_up` is rank 0's verdict on train.time_limit_s (`elapsed_s`,
  /// seconds since training started, is read on rank 0 only), the same on every rank.
  int preemption_vote(double elapsed_s, bool& time_up);
  /// With train.preempt_grace_s > 0, at every unit forward while the step may still be
  /// abandoned (before its first optimizer update). Shared placement: every rank runs the
  /// same units, so the vote is pipelined and no rank waits for it: each unit reads the
  /// vote the previous unit posted (a non-blocking all-gather of 3 doubles, complete by
  /// then) and posts its own; the first update reads the last one (before_first_update).
  /// Split placement: at every transfer between the groups instead (the groups' units
  /// differ), also after an update (a group's update does not stop the other's transfers),
  /// a blocking all-reduce of 3 doubles, and a step is abandoned only while no rank of
  /// either group has updated. Throws StepAbandoned on every rank, at the same unit or
  /// transfer, when any rank must abandon (must_abandon_step).
  void grace_vote();
  /// Local: this rank's ballot {a signal came (1/0), the step must be abandoned (1/0), this
  /// rank can no longer abandon (1/0)}; the vote takes the maximum of each over the world.
  std::array<double, 3> grace_ballot();
  /// Shared placement: waits for the vote in flight (CollectiveTimeout after the world's
  /// timeout) and returns whether the world voted to abandon; false when none is in flight.
  bool finish_grace_vote();
  /// The objective's hook before every optimizer update: the step stops being abandonable;
  /// under shared placement the vote posted at the last unit is read first (and may abandon).
  void before_first_update();
  /// Local, with train.preempt_grace_s > 0, at each step's start: keeps what an abandoned
  /// step must give back (step_start_) and marks the step abandonable.
  void capture_step_start();
  /// Collective: puts back the state of the step's start (counters, noise RNG, the models'
  /// buffers), clears the models' half-done step, saves, and logs. Returns the checkpoint.
  std::string abandon_step_and_save();
  /// The state that an abandoned step must give back (train.preempt_grace_s > 0).
  struct StepStart {
    TrainCounters counters;
    DataPipeline::Position data;      // the real batch and the latent generator
    std::vector<at::Tensor> buffers;  // G's then D's named_buffers()
  };
  StepStart step_start_;
  bool abandonable_ = false;   // inside a step, before its first optimizer update
  bool abandoning_ = false;    // grace_vote threw
  /// Shared placement's grace vote in flight: this rank's ballot, the world's, the all-gather.
  struct GraceVote {
    at::Tensor ballot, all;
    std::unique_ptr<Work> work;
  };
  std::unique_ptr<GraceVote> grace_vote_;
  double last_step_s_ = 0;
  std::chrono::steady_clock::time_point step_t0_;

  TrainConfig cfg_;
  Communicator& comm_;
  double figures_wait_s_ = 0;  // split: run()'s waits for step figures since the last step
  const ModelFamily& family_;
  // Declared in the order of construction; the destructor resets them in reverse.
  std::unique_ptr<ModelSet> models_;    // G, D, optimizers, EMA, groups
  std::unique_ptr<DataPipeline> data_;  // the real images, their sampler, the latents
  std::unique_ptr<AdaptiveAugment> augment_;  // ADA's state (augment.mode not none), read by the objective
  std::unique_ptr<GanObjective> objective_;
  std::unique_ptr<StepExecutor> executor_;  // the placement's step order (destroyed before the objective)
  std::unique_ptr<PeriodicActions> periodic_;
  std::unique_ptr<Evaluator> evaluator_;  // when eval.enabled
  TensorList fixed_inputs_;  // the sample grid's {z, y}
  int sample_nrow_ = 8;
  TrainCounters counters_;
  int64_t nonfinite_steps_ = 0, nonfinite_in_a_row_ = 0;  // saved in checkpoints
  std::unique_ptr<CheckpointManager> ckpt_;  // saves, sync and async (destroyed first)
};

}  // namespace shardgan
