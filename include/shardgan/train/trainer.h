#pragma once
/// The training loop: builds G and D of the configured model family (deferred sharded
/// initialization), runs GAN steps (objective.h), and the periodic actions (periodic.h):
/// metrics, samples, checkpoints. Both models are sharded on their own.
#include <array>
#include <chrono>
#include <memory>
#include <string>
#include <utility>

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include "shardgan/checkpoint/checkpoint.h"
#include "shardgan/models/family.h"
#include "shardgan/optim/loss_scaler.h"
#include "shardgan/optim/optimizer.h"
#include "shardgan/optim/sharded_ema.h"
#include "shardgan/sharding/sharded_model.h"
#include "shardgan/train/config.h"
#include "shardgan/data/images.h"
#include "shardgan/train/evaluation.h"
#include "shardgan/train/step_executor.h"
#include "shardgan/train/checkpoint_manager.h"
#include "shardgan/train/data_pipeline.h"
#include "shardgan/train/periodic.h"
#include "shardgan/train/split_placement.h"

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
  /// The generator's EMA, or nullptr when ema.enabled is false.
  ShardedEma* ema() { return ema_.get(); }
  /// Under train.placement split a rank holds one of them: the other is not built here.
  ShardedModel& generator() { return *g_; }
  ShardedModel& discriminator() { return *d_; }
  bool holds_generator() const { return g_ != nullptr; }
  /// Parameter counts of both models, on every rank (whichever it holds).
  int64_t generator_numel() const { return g_numel_; }
  int64_t discriminator_numel() const { return d_numel_; }
  bool holds_discriminator() const { return d_ != nullptr; }
  /// Local accounting for one model, optimizer state included.
  MemoryStats memory_stats(ShardedModel& m) const;
  const TrainConfig& config() const { return cfg_; }

 private:
  /// Collective: loads checkpoint directory `dir`, agreed on by every rank.
  void load_resolved(const std::string& dir);
  std::vector<ModelAndOptimizer> checkpoint_models();
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
  /// Collective at every unit forward while the step may still be abandoned (before its
  /// first optimizer update), with train.preempt_grace_s > 0: one all-reduce of 3 doubles;
  /// throws StepAbandoned on every rank when any rank must abandon (must_abandon_step).
  /// Split placement: at every transfer between the groups instead (the groups' units
  /// differ), also after an update (a group's update does not stop the other's transfers),
  /// and a step is abandoned only while no rank of either group has updated.
  void grace_vote();
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
  double last_step_s_ = 0;
  std::chrono::steady_clock::time_point step_t0_;

  /// Builds a model of `spec` on `comm` and its optimizer. With offload.param the store is
  /// made first and each unit's master shard moves into it as the unit is built.
  std::pair<std::unique_ptr<ShardedModel>, std::unique_ptr<ShardedOptimizer>> build_model_and_optimizer(
      const ModelSpec& spec, Communicator& comm, const ShardingConfig& sc, const OptimizerConfig& oc, uint64_t seed);
  Communicator& g_comm() { return g_comm_ ? *g_comm_ : group_comm_ ? *group_comm_ : comm_; }
  Communicator& d_comm() { return d_comm_ ? *d_comm_ : group_comm_ ? *group_comm_ : comm_; }
  /// train.placement split: checks the config against the world size, splits off this
  /// rank's group and returns whether this rank holds G (ConfigError naming the key).
  bool make_split_placement();
  /// memory_stats of a model this rank may not hold (zeros then).
  MemoryStats stats_of(const std::unique_ptr<ShardedModel>& m) const { return m ? memory_stats(*m) : MemoryStats{}; }
  /// Rank 0's collective volume so far (CommStats bytes) on the world communicator, the
  /// models' shard groups and their replica groups (those two only under HSDP), and the
  /// hpZ secondary groups.
  std::array<int64_t, 4> comm_bytes();

  TrainConfig cfg_;
  Communicator& comm_;
  std::unique_ptr<Communicator> g_comm_, d_comm_;  // HSDP groups; destroyed after the models
  std::unique_ptr<Communicator> g_hpz_, d_hpz_;    // hpZ secondary groups; likewise
  // train.placement split: this rank's group (G's ranks or D's) and the transport. Only
  // the model of the group is built here: the other's pointers stay null.
  std::unique_ptr<Communicator> group_comm_;
  std::unique_ptr<SplitPlacement> split_;
  double figures_wait_s_ = 0;  // split: run()'s waits for step figures since the last step
  int64_t g_numel_ = 0, d_numel_ = 0;  // both models' sizes, on every rank
  const ModelFamily& family_;
  std::unique_ptr<DataPipeline> data_;  // the real images, their sampler, the latents
  std::unique_ptr<ShardedModel> g_, d_;
  std::unique_ptr<ShardedOptimizer> opt_g_, opt_d_;
  std::unique_ptr<DynamicLossScaler> scaler_g_, scaler_d_;
  std::unique_ptr<ShardedEma> ema_;
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
