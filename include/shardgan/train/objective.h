#pragma once
/// The GAN objective and one training step: `d_steps` D updates, then one G update with D
/// frozen (BigGAN, Brock et al. 2019, Sec. 3 and Appendix C: hinge loss, two D steps per G
/// step), each accumulated over micro-batches. Losses: non-saturating (Goodfellow et al.
/// 2014; DCGAN) or hinge (Lim & Ye 2017; Miyato et al. 2018; BigGAN).
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "shardgan/sharding/sharded_unit.h"
#include "shardgan/train/augment.h"
#include "shardgan/train/step_schedule.h"
#include "shardgan/train/step_stats.h"

namespace shardgan {

class Communicator;
class DynamicLossScaler;
class ShardedModel;
class ShardedOptimizer;

/// One step's record for the trainer's log: the step's figures (StepStats: losses, D's
/// outputs, verdicts, norms, split placement's idle times and bytes; identical on every
/// rank once reduced) and what rank 0 measured around the step.
struct StepMetrics : StepStats {
  int64_t step = 0;  ///< steps done after this one
  /// Wall time of the step on rank 0 (seconds); under split placement with the wait for
  /// step figures that came before it (Trainer::run).
  double step_time_s = 0;
  int64_t nonfinite_steps = 0;  ///< steps of this run so far with such a skip (the trainer's count)
  /// ADA (augment.mode not none; the trainer's): p after this step, and the r_t of the last
  /// adjustment of p (NaN before the first). p is -1 when ADA is off.
  double ada_p = -1, ada_rt = std::numeric_limits<double>::quiet_NaN();
  double loss_scale_d = 1, loss_scale_g = 1;  ///< current loss scales (1 unless float16)
  /// Where rank 0's step time went (seconds, G and D summed): collectives started or
  /// waited for, master shards read from the offload tier for all-gathers, optimizer
  /// updates, and of those the offload tier's I/O. The rest is forward/backward compute.
  double time_collective_s = 0, time_offload_read_s = 0, time_optimizer_s = 0, time_optimizer_io_s = 0;
  double time_offload_grad_s = 0;  ///< gradient offload: the tier's reads and writes outside the step
  /// What the operating system counted for rank 0's process during the step
  /// (getrusage(RUSAGE_SELF), all threads): minor page faults, and CPU seconds in the
  /// kernel and in user space. Fresh mappings that the kernel must fault in and zero show
  /// up here.
  int64_t minor_faults = 0;
  double system_s = 0, user_s = 0;
  /// Rank 0's collective volume in this step (bytes, as CommStats counts them: the full
  /// size of each all-gather, reduce-scatter and all-reduce): on the world communicator
  /// (SyncBatchNorm, votes, and the models' collectives without HSDP), inside the models'
  /// shard groups, across replica groups (HSDP's gradient all-reduce), and inside the
  /// hpZ secondary groups (sharding.<model>.hpz_partition_size).
  int64_t comm_bytes_world = 0, comm_bytes_shard_group = 0, comm_bytes_replicate = 0, comm_bytes_secondary = 0;
  /// Rank 0's GPU memory in use after the step (bytes; device_memory_used_bytes()), -1 on
  /// the CPU.
  int64_t device_mem_used_bytes = -1;
  /// Rank 0's peak of GPU bytes held by live tensors during the step (the caching
  /// allocator's, as torch.cuda.max_memory_allocated(); take_device_peak_allocated_bytes()),
  /// -1 on the CPU.
  int64_t device_mem_peak_allocated_bytes = -1;
};

/// Thrown on every rank when a NaN or Inf ends the job (train.on_nonfinite: abort, or more
/// than train.max_nonfinite_steps skips in a row). The message names the step and model.
class NonFiniteError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// One model with what updates it.
struct TrainedModel {
  ShardedModel* model;
  ShardedOptimizer* optim;
  DynamicLossScaler* scaler;
};

/// Where a step's inputs come from (the trainer's data pipeline and latent sampler).
struct StepInputs {
  /// This rank's part of micro-batch `micro` of the next real global batch: {x, y} with x
  /// [B_local, C, H, W] (model dtype) and y int64 [B_local], undefined, or (set_paired) x's
  /// input image A [B_local, C_A, H, W] (model dtype). Called with micro = 0, 1, ... k-1 once
  /// per D step; micro 0 moves to the next global batch.
  std::function<TensorList(int64_t micro)> real;
  /// G's inputs for one whole global batch, {z, y} (same on every rank, so that results
  /// do not depend on the world size).
  std::function<TensorList()> latents;
  /// This rank's part of micro-batch `micro` of a global-batch tensor (dim 0): of its rows
  /// (a global batch, or the path-length update's smaller one), the micro-batch's
  /// size(0) / k rows, and of those this rank's equal share.
  std::function<at::Tensor(const at::Tensor& global, int64_t micro)> local;
  /// Standard normals of shape `sizes` in `dtype` from the latents' generator, the same on
  /// every rank (the path-length update's image noise). Needed with set_path_length only.
  std::function<at::Tensor(at::IntArrayRef sizes, at::ScalarType dtype)> normal;
  /// Steps done before this one: which separate regularization updates are due
  /// (set_separate_regularization).
  int64_t step = 0;
};

/// The GAN objective: the losses and the passes a step is made of (D's update over
/// micro-batches, G's pass against the frozen D, the shared D forward, R1, the joint pass,
/// the update with its non-finite vote). The order in which a step runs them is a
/// StepExecutor's (step_executor.h): SharedStepExecutor for the shared placement,
/// SplitStepExecutor for train.placement split. Each pass adds what it measured to a
/// StepStats (step_stats.h), by name.
class GanObjective {
 public:
  /// `loss`: "nonsaturating", "hinge" or "least_squares" (std::invalid_argument otherwise). `d_steps` >= 1.
  /// `micro_batches` >= 1: each update accumulates that many backward passes, each loss
  /// divided by it. `grad_clip` > 0 clips each model's global gradient norm.
  /// `r1_gamma` > 0 adds the R1 penalty (gamma / 2) E[||grad_x D(x)||^2] on real images
  /// (Mescheder et al. 2018, Eq. 9) to D's loss on every `r1_every`-th D update, scaled by
  /// r1_every (StyleGAN2's lazy regularization, Karras et al. 2020, Sec. 3.1), through
  /// ShardedModel::begin_higher_order (D is gathered whole for that real pass).
  /// `comm`: the world; the models' votes, norms and R1's mean use update_comm().
  GanObjective(std::string loss, int64_t d_steps, int64_t micro_batches, double grad_clip,
               Communicator& comm, double r1_gamma = 0.0, int64_t r1_every = 1);
  ~GanObjective();

  /// Called before every optimizer update of a step (the trainer ends there the part of
  /// the step that a preemption may abandon). Local.
  void set_before_update(std::function<void()> f) { before_update_ = std::move(f); }
  /// One D forward and backward on cat([fake, real]) per micro-batch instead of one each
  /// (TrainConfig::d_joint_pass; BigGAN-PyTorch's G_D). Micro-batches whose D update takes
  /// R1 keep the separate passes. Local; call it alike on every rank.
  void set_d_joint_pass(bool on) { d_joint_pass_ = on; }
  /// TrainConfig::update "simultaneous": ParaGAN's update (Shi, Li and You 2024, Fig. 5),
  /// G_{t+1} = G_t - lr_G grad_G L_G(G_t, D_t) and D_{t+1} = D_t - lr_D grad_D L_D(G_t, D_t):
  /// G's pass (D frozen) runs first and D's first update trains on the images of that same
  /// G forward, so a step has one G forward fewer than the alternating update, whose G
  /// trains against the D its D steps just updated. Local; call it alike on every rank.
  void set_simultaneous(bool on) { simultaneous_ = on; }
  /// Image-to-image translation (pix2pix, Isola et al. 2017, Sec. 3.1, Eq. 4): the real
  /// batch is {B, A}; G translates the A of each real micro-batch (with the latents' z, its
  /// dropout seeds), D scores {B or G(A), A}, and G's loss is adversarial_weight times the
  /// adversarial loss plus l1_weight * mean|G(A) - B|.
  /// G's pass uses the micro-batches (A, B and z) of the step's last D update, so that, as
  /// in the authors' code, G trains on the same pairs and dropout masks as D just did.
  /// Throws std::invalid_argument with set_simultaneous on (G's pass would need the batch
  /// before D's). Local; call it alike on every rank.
  void set_paired(bool on, double l1_weight, double adversarial_weight = 1.0);
  bool simultaneous() const { return simultaneous_; }
  /// With set_simultaneous: D's first update of a step runs one D forward per micro-batch
  /// on G's images instead of two. From that forward, torch::autograd::grad takes L_G's
  /// gradient with respect to the images (D frozen: no parameter gradients), which G
  /// backpropagates, and a backward of D's fake term gives D's parameter gradients; then
  /// D's real pass runs as usual. Spectral norm advances u on that forward and on the real
  /// pass, as G's pass and the real pass did. At stage 3 D stays gathered for the span of
  /// that forward and its two backwards (ShardedModel::begin_higher_order, as for R1), the
  /// price of the saved forward. With set_d_joint_pass the real images join that forward
  /// (one D forward per micro-batch in all). Local; call it alike on every rank.
  void set_shared_d_forward(bool on) { shared_d_forward_ = on; }
  /// AC-GAN's auxiliary classification loss (Odena et al. 2017, Sec. 3, Eq. 2-3), for a D
  /// whose forward returns class logits [B, n_classes] after its logits
  /// (ModelFamily::discriminator_classifies): D's loss adds `w` times the cross-entropy of
  /// its class logits on the real images against their labels, G's loss `w` times the
  /// cross-entropy on G's images against the labels they were generated for. Unlike Odena
  /// et al., D's classifier does not train on G's images: it learns the classes from the
  /// data alone, and G is asked to match them. Under split placement D's side adds G's term
  /// to the loss whose image gradient it returns. 0 turns it off. Throws
  /// std::invalid_argument for w < 0, and with set_paired. Local; call it
  /// alike on every rank.
  void set_aux_class_weight(double w);
  /// StyleGAN2's separate regularization phases (ModelFamily::separate_regularization;
  /// Karras et al. 2020, arXiv:1912.04958, Sec. 3.1 and Appendix B). R1 stops joining D's
  /// main update: on steps whose index (StepInputs::step) is a multiple of r1_every, after
  /// the step's D updates, a D update of its own ("D reg", d_reg) takes the penalty alone on
  /// the real micro-batches of the step's last D update, multiplied by r1_every; on steps
  /// that are multiples of the path-length interval, after G's update, a G update of its own
  /// ("G reg", g_reg) takes the path-length penalty (set_path_length). The optimizers'
  /// lr and betas carry the correction c = I / (I + 1) (lazy_regularization_ratio, applied
  /// when the trainer builds them). Local; call it alike on every rank.
  void set_separate_regularization(bool on) { separate_reg_ = on; }
  /// StyleGAN2's path-length regularization (Karras et al. 2020, Sec. 3.2; TrainConfig's
  /// train.pl_*). `weight` > 0 turns it on (needs set_separate_regularization and a G whose
  /// forward returns its styles ws after its images, ModelFamily::generator_returns_styles).
  /// Each due step, G's update of its own draws fresh latents, keeps the first
  /// global_batch / batch_shrink, and per micro-batch: images x = G(z) with styles w, noise
  /// u ~ N(0, 1) / sqrt(H W) of x's shape (StepInputs::normal, the same on every rank), per
  /// sample a = sqrt(mean over ws of the squared norm over w_dim of d(sum x u)/dw) (taken
  /// with create_graph, G gathered whole: ShardedModel::begin_higher_order), the running
  /// mean m = m + decay (mean(a) - m) with mean(a) over the micro-batch of every rank (an
  /// all-reduce: the authors keep one m per process), then the loss weight * every *
  /// mean((a - m)^2) / k backpropagated to G's parameters. m is float32 (float64 in a
  /// float64 run) and checkpointed (pl_mean).
  struct PathLength {
    double weight = 0;
    int64_t every = 4, batch_shrink = 2;
    double decay = 0.01;
  };
  void set_path_length(const PathLength& pl) { pl_ = pl; }
  /// The running mean of path lengths (0 before the first path-length update); restored by
  /// set_pl_mean on resume. Local.
  double pl_mean() const { return pl_mean_; }
  void set_pl_mean(double m) { pl_mean_ = m; }
  /// ADA (augment.h; Karras et al. 2020, arXiv:2006.06676): every image D sees goes through
  /// `a`'s pipeline at its current p, the real and the generated ones, in D's updates, in
  /// G's pass and in D reg, each pass with draws of its own (AdaptiveAugment::draws, this
  /// rank's rows through StepInputs::local). R1 differentiates D's output with respect to
  /// the real images before their augmentation, as the authors'. D's logits on real images
  /// are counted into StepStats::real_signs and real_logits (the input of ADA's heuristic),
  /// with or without it. nullptr (the default) turns it off. Needs the alternating update,
  /// the shared placement, separate real and fake D passes and a model without an image
  /// input (the step throws std::invalid_argument otherwise). `a` must outlive the
  /// objective. Local; call it alike on every rank.
  void set_augment(const AdaptiveAugment* a) { aug_ = a; }
  /// The communicator of the models' votes, norms and R1 mean: the world's (default), or
  /// under split placement this rank's group (SplitStepExecutor sets it). `c` must outlive
  /// the objective; nullptr restores the world's.
  void set_update_comm(Communicator* c) { update_comm_ = c; }
  /// The step's shape (step_schedule.h): what a step's order depends on.
  StepShape shape() const { return {simultaneous_, shared_d_forward_ && simultaneous_, paired_, d_steps_, micro_}; }

  /// D's loss on logits [B] of real images and of fake images, each a mean over the batch;
  /// the D loss is their sum. Local.
  /// least_squares: mean (D(x) - 1)^2 and mean D(G(z))^2; G's mean (D(G(z)) - 1)^2 (LSGAN,
  /// Mao et al. 2017, Eq. 9 with a = 0, b = c = 1, as the pix2pix code's MSE loss).
  at::Tensor d_loss_real(const at::Tensor& real_logits) const;
  at::Tensor d_loss_fake(const at::Tensor& fake_logits) const;
  /// G's loss on D's logits [B] of fake images. Local.
  at::Tensor g_loss(const at::Tensor& fake_logits) const;

  /// Collective. One step of the shared placement (SharedStepExecutor): d_steps D updates
  /// (G under no_grad; real and fake images each get a forward and a backward of their
  /// own, so that D's units are released as in any single backward, or one joint pass with
  /// set_d_joint_pass), then one G update with D frozen (input gradients only, no D
  /// reduce-scatter). With set_simultaneous, G's pass comes first and both models update
  /// against the other's weights of before the step. Fills every field but step and
  /// step_time_s. For tests and tools that drive the objective directly; the trainer
  /// holds its executor.
  StepMetrics step(TrainedModel g, TrainedModel d, const StepInputs& in);

 private:
  friend class SharedStepExecutor;
  friend class SplitStepExecutor;
  /// A step's losses and D outputs on the host in float64, as the engine's other scalars
  /// (one copy and one wait on a GPU). Local.
  static at::Tensor host(const at::Tensor& t);
  /// One micro-batch of G's images (detached) and their labels (undefined if unconditional).
  struct MicroFakes {
    at::Tensor images, labels;
  };
  /// D update `s` of the step: k micro-batches of real images and of G's images (`given`,
  /// one per micro-batch, or drawn here from fresh latents under no_grad), then the update.
  /// Adds D's loss, outputs, class term and R1 to `st` and sets its D verdicts and norm.
  void d_update(TrainedModel g, TrainedModel d, const StepInputs& in, int64_t s,
                const std::vector<MicroFakes>* given, StepStats& st);
  /// G's k micro-batches against the frozen D (input gradients only), without the update;
  /// keeps each micro-batch's images in `keep` when given. Adds G's losses to `st`.
  /// Returns whether G's losses were finite on this rank.
  bool g_pass(TrainedModel g, TrainedModel d, const StepInputs& in, std::vector<MicroFakes>* keep, StepStats& st);
  /// set_shared_d_forward: D's first update of a simultaneous step. `images(j)` gives G's
  /// images of micro-batch j (detached; labels from `lat`), `image_grad(j, gx, lg)` takes
  /// dL_G/dx (divided by k, scaled by G's loss scale) and G's loss of the micro-batch
  /// (detached scalar, with the class term) before D's update. Sets `g_loss_finite` to
  /// whether G's losses were finite on this rank.
  using ImageGrad = std::function<void(int64_t, const at::Tensor&, const at::Tensor&)>;
  void d_update_sharing_forward(TrainedModel d, DynamicLossScaler* g_scaler, const StepInputs& in,
                                const TensorList& lat, const std::function<at::Tensor(int64_t)>& images,
                                const ImageGrad& image_grad, StepStats& st, bool& g_loss_finite);
  bool shared_d_forward_ = false;
  /// set_aux_class_weight: the mean cross-entropy of D's class logits (`d_out`[1], rows
  /// [start, start + n), all when n < 0) against labels `y`, in `md`, before the weight;
  /// undefined when the weight is 0. Throws std::invalid_argument when D returned no class
  /// logits or `y` is undefined.
  at::Tensor class_loss(const TensorList& d_out, const at::Tensor& y, at::ScalarType md, int64_t start = 0,
                        int64_t n = -1) const;
  double aux_class_weight_ = 0;
  /// The communicator of this rank's model updates: the world's, or split's group.
  Communicator& update_comm() const { return update_comm_ ? *update_comm_ : comm_; }
  Communicator* update_comm_ = nullptr;
  bool simultaneous_ = false;
  bool paired_ = false;
  double l1_weight_ = 0, adversarial_weight_ = 1;
  /// set_paired: {z, A, B} of each micro-batch of the last D update, for G's pass (split
  /// placement: z is undefined on D's ranks, which run no G).
  std::vector<TensorList> paired_batch_;
  /// The latents G's pass draws: none when paired (it reuses the last D update's pairs).
  TensorList g_pass_latents(const StepInputs& in) const { return paired_ ? TensorList{} : in.latents(); }
  /// G's pass, micro-batch j: G's inputs {z, y}, the L1 target B (paired; else undefined)
  /// and the dtype of the pass's losses (B's when paired, z's otherwise), from the last D
  /// update's pairs or from `lat` (g_pass_latents). Shared by g_pass and both split sides.
  struct GPassMicro {
    at::Tensor z, y, target;
    at::ScalarType md;
  };
  GPassMicro g_pass_micro(const StepInputs& in, const TensorList& lat, int64_t j) const;
  std::function<void()> before_update_;
  /// Collective: unscale and vote (float16), or vote on finite loss and gradients (other
  /// dtypes: one all-reduce of one element), clip, then step, post-step all-gather and zero
  /// the gradients. Returns whether the optimizer stepped; sets `nonfinite` when the vote
  /// found a NaN or Inf. `loss_finite`: this rank's losses of the update were finite.
  bool finish_update(TrainedModel m, double& norm, int64_t step_index, bool loss_finite, bool& nonfinite);

  /// What a D pass over real images gives back: D's logits [B] (detached, `md`), the R1
  /// penalty (0 if not due), and the class term of set_aux_class_weight before its weight
  /// (detached scalar; undefined when off).
  struct RealPass {
    at::Tensor logits;
    double r1 = 0;
    at::Tensor class_ce;
  };
  /// D's input transform of one pass over micro-batch `j` (set_augment): the augmentation
  /// of pass `site` of D step `d_step`, on this rank's rows; empty when ADA is off or p is 0.
  using Augment = std::function<at::Tensor(const at::Tensor&)>;
  Augment augment_for(const StepInputs& in, int64_t j, AugmentSite site, int64_t d_step) const;
  static at::Tensor augmented(const Augment& a, const at::Tensor& x) { return a ? a(x) : x; }
  const AdaptiveAugment* aug_ = nullptr;

  /// D's real-image loss of one micro-batch (divided by k), with the R1 penalty when due
  /// and the class term when on; runs the backward. D sees the images through `aug`.
  RealPass d_real_pass(TrainedModel d, const TensorList& real, at::ScalarType md, const Augment& aug = {});

  /// Whether R1 joins D's update now (train.r1_every-th D update, not under separate phases).
  bool r1_folded_due(TrainedModel d) const;
  /// Whether the separate R1 (D reg) or path-length (G reg) update is due at step `step`.
  bool r1_update_due(int64_t step) const { return separate_reg_ && r1_gamma_ > 0 && step % r1_every_ == 0; }
  bool pl_update_due(int64_t step) const { return separate_reg_ && pl_.weight > 0 && step % pl_.every == 0; }
  /// D reg: the R1 penalty alone (times r1_every, divided by k) on the real micro-batches
  /// d_update kept (reg_reals_), D gathered whole, then D's update. Adds R1 to `st`, sets D's
  /// verdicts. Collective.
  void d_reg(TrainedModel d, const StepInputs& in, StepStats& st);
  /// G reg: the path-length penalty of set_path_length, then G's update. Adds the penalty
  /// and the running mean to `st`, sets G's verdicts. Collective.
  void g_reg(TrainedModel g, const StepInputs& in, StepStats& st);
  bool separate_reg_ = false;
  PathLength pl_;
  double pl_mean_ = 0;
  /// The real micro-batches of the step's last D update, kept for D reg.
  std::vector<TensorList> reg_reals_;

  /// One micro-batch's D forward and backward on cat([fake, real]) (labels alike), with the
  /// class term on the real half when on. Returns the real half's RealPass and the fake
  /// logits [B], detached, in `md`.
  std::pair<RealPass, at::Tensor> d_joint_pass(TrainedModel d, const TensorList& real, const at::Tensor& fake,
                                               const at::Tensor& y_fake, at::ScalarType md);

  bool d_joint_pass_ = false;
  std::string loss_;
  int64_t d_steps_, micro_;
  double grad_clip_;
  double r1_gamma_;
  int64_t r1_every_;
  Communicator& comm_;
};

}  // namespace shardgan
