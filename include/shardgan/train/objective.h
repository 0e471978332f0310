#pragma once
/// The GAN objective and one training step: `d_steps` D updates, then one G update with D
/// frozen (BigGAN, Brock et al. 2019, Sec. 3 and Appendix C: hinge loss, two D steps per G
/// step), each accumulated over micro-batches. Losses: non-saturating (Goodfellow et al.
/// 2014; DCGAN) or hinge (Lim & Ye 2017; Miyato et al. 2018; BigGAN).
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "shardgan/sharding/sharded_unit.h"

namespace shardgan {

class Communicator;
class DynamicLossScaler;
class SplitPlacement;
class ShardedModel;
class Work;
class ShardedOptimizer;

/// Global-batch averages of one step (identical on every rank).
struct StepMetrics {
  int64_t step = 0;          ///< steps done after this one
  double loss_d = 0, loss_g = 0;  ///< D loss averaged over the D steps; G's adversarial loss
  /// Image-conditioned models (set_paired): mean |G(A) - B| of G's pass, before the weight
  /// (0 otherwise). G's loss is loss_g + l1_weight * loss_l1.
  double loss_l1 = 0;
  double d_real = 0, d_fake = 0;  ///< mean sigmoid(D(x)) and sigmoid(D(G(z))), D steps
  /// Wall time of the step on rank 0 (seconds); under split placement with the wait for
  /// step figures that came before it (Trainer::run).
  double step_time_s = 0;
  double grad_norm_d = 0, grad_norm_g = 0;  ///< global gradient norms (0 unless clipping)
  bool skipped_d = false, skipped_g = false;  ///< a step skipped (float16 overflow, inf norm)
  /// A NaN or Inf in the model's loss or gradients on some rank (float32, float64 and
  /// bfloat16 compute; float16 overflows are the loss scaler's): its update was skipped.
  bool nonfinite_d = false, nonfinite_g = false;
  int64_t nonfinite_steps = 0;  ///< steps of this run so far with such a skip (the trainer's count)
  double loss_scale_d = 1, loss_scale_g = 1;  ///< current loss scales (1 unless float16)
  double r1 = 0;  ///< R1 penalty (gamma/2) E||grad_x D(x)||^2 of this step's D updates (0 if none ran)
  /// GanObjective::set_aux_class_weight (0 otherwise): the cross-entropy of D's class head
  /// on the real images (mean over the D updates) and on G's images in G's pass, before
  /// the weight.
  double class_real = 0, class_fake = 0;
  /// Where rank 0's step time went (seconds, G and D summed): collectives started or
  /// waited for, master shards read from the offload tier for all-gathers, optimizer
  /// updates, and of those the offload tier's I/O. The rest is forward/backward compute.
  double time_collective_s = 0, time_offload_read_s = 0, time_optimizer_s = 0, time_optimizer_io_s = 0;
  double time_offload_grad_s = 0;  ///< gradient offload: the tier's reads and writes outside the step
  /// What the operating system counted for rank 0's process during the step
  /// (getrusage(RUSAGE_SELF), all threads): minor page faults, and CPU seconds in the
  /// kernel and in user space. Fresh mappings that the kernel must fault in and zero show
  /// up here (issue 21).
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
  /// train.placement split (0 otherwise): seconds each group's ranks spent waiting for the
  /// other group in the step (the transfers, and the wait for the previous step's world
  /// figures, GanObjective::finish_split_figures; averaged over the group's ranks), the
  /// seconds each group was busy (its step's work less the transfers' wait), and the
  /// bytes that crossed between the groups (images and their gradients, all ranks summed).
  double idle_g_s = 0, idle_d_s = 0, busy_g_s = 0, busy_d_s = 0;
  int64_t bytes_between_groups = 0;
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
  /// This rank's part of micro-batch `micro` of a global-batch tensor (dim 0).
  std::function<at::Tensor(const at::Tensor& global, int64_t micro)> local;
};

class GanObjective {
 public:
  /// `loss`: "nonsaturating", "hinge" or "least_squares" (std::invalid_argument otherwise). `d_steps` >= 1.
  /// `micro_batches` >= 1: each update accumulates that many backward passes, each loss
  /// divided by it. `grad_clip` > 0 clips each model's global gradient norm.
  /// `r1_gamma` > 0 adds the R1 penalty (gamma / 2) E[||grad_x D(x)||^2] on real images
  /// (Mescheder et al. 2018, Eq. 9) to D's loss on every `r1_every`-th D update, scaled by
  /// r1_every (StyleGAN2's lazy regularization, Karras et al. 2020, Sec. 3.1), through
  /// ShardedModel::begin_higher_order (D is gathered whole for that real pass).
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
  /// data alone, and G is asked to match them. Under set_split D's side adds G's term to
  /// the loss whose image gradient it returns. 0 turns it off. Throws
  /// std::invalid_argument for w < 0, and with set_paired. Local; call it
  /// alike on every rank.
  void set_aux_class_weight(double w);
  /// train.placement split (split_placement.h): this rank holds one of the models, and
  /// step() runs that model's side (the other TrainedModel is never touched: its members
  /// may be null). Both update rules give the shared placement's updates: G's side makes
  /// the images and backpropagates the gradients D's side returns; D's side scores them,
  /// returns dL_G/dx for G's pass and trains on them. With the simultaneous update D's
  /// side returns dL_G/dx before its own update, so G's backward, update and next forward
  /// run while D updates. The model's votes and norms use the group's communicator.
  /// With set_paired (alternating update only) G's ranks read their slices' pairs too: A
  /// is G's input and B the target of G's L1 term, which G's side adds to the adversarial
  /// gradient D's side returns; D's side scores {G(A), A} with its own slices' A. Throws
  /// std::invalid_argument with set_paired and set_simultaneous both on (set_paired
  /// already refuses that pair). `p` must outlive the objective.
  /// step() then returns this rank's own figures only: see post_split_figures.
  void set_split(SplitPlacement* p);
  /// set_split: the step's figures that need both groups (the losses, D's outputs, the
  /// skip and non-finite verdicts, the gradient norms, each group's idle and busy time,
  /// the bytes between the groups) travel in one all-gather over the world communicator
  /// that this starts and does not wait for (collective: every rank posts it after every
  /// step, in the same order). `local`: the metrics step() returned (fields the caller
  /// filled since are kept); `votes`: caller values of which finish_split_figures gives
  /// the world's maximum (the trainer's preemption and time-limit votes). Waiting for a
  /// step's figures only after the next step's work is what lets G's ranks run that next
  /// step's forward while D's ranks finish their update (ParaGAN, Shi, Li and You 2024,
  /// Sec. 4: neither model waits for the other's update). Throws std::logic_error without
  /// a split step since the last post.
  void post_split_figures(const StepMetrics& local, const std::vector<double>& votes = {});
  /// Waits for the oldest figures in flight (CollectiveTimeout after the world
  /// communicator's timeout) and returns its step's metrics, identical on every rank,
  /// with the world's maxima of the votes in `votes` when given. The wait counts as idle
  /// time in the next split step. Throws std::logic_error when none is in flight.
  StepMetrics finish_split_figures(std::vector<double>* votes = nullptr);
  /// How many steps' figures are in flight (posted, not finished).
  size_t split_figures_in_flight() const { return split_figures_.size(); }
  GanObjective(std::string loss, int64_t d_steps, int64_t micro_batches, double grad_clip,
               Communicator& comm, double r1_gamma = 0.0, int64_t r1_every = 1);
  ~GanObjective();  // waits for split figures still in flight

  /// D's loss on logits [B] of real images and of fake images, each a mean over the batch;
  /// the D loss is their sum. Local.
  /// least_squares: mean (D(x) - 1)^2 and mean D(G(z))^2; G's mean (D(G(z)) - 1)^2 (LSGAN,
  /// Mao et al. 2017, Eq. 9 with a = 0, b = c = 1, as the pix2pix code's MSE loss).
  at::Tensor d_loss_real(const at::Tensor& real_logits) const;
  at::Tensor d_loss_fake(const at::Tensor& fake_logits) const;
  /// G's loss on D's logits [B] of fake images. Local.
  at::Tensor g_loss(const at::Tensor& fake_logits) const;

  /// Collective. d_steps D updates (G under no_grad; real and fake images each get a
  /// forward and a backward of their own, so that D's units are released as in any single
  /// backward, or one joint pass with set_d_joint_pass), then one G update with D frozen
  /// (input gradients only, no D reduce-scatter). With set_simultaneous, G's pass comes
  /// first and both models update against the other's weights of before the step.
  /// Fills every field but step and step_time_s.
  StepMetrics step(TrainedModel g, TrainedModel d, const StepInputs& in);

 private:
  /// One micro-batch of G's images (detached) and their labels (undefined if unconditional).
  struct MicroFakes {
    at::Tensor images, labels;
  };
  /// D update `s` of the step: k micro-batches of real images and of G's images (`given`,
  /// one per micro-batch, or drawn here from fresh latents under no_grad), then the update.
  void d_update(TrainedModel g, TrainedModel d, const StepInputs& in, int64_t s,
                const std::vector<MicroFakes>* given, StepMetrics& r, at::Tensor& stats);
  /// G's k micro-batches against the frozen D (input gradients only), without the update;
  /// keeps each micro-batch's images in `keep` when given. Returns whether G's losses were
  /// finite on this rank.
  bool g_pass(TrainedModel g, TrainedModel d, const StepInputs& in, std::vector<MicroFakes>* keep, at::Tensor& stats);
  /// set_shared_d_forward: D's first update of a simultaneous step. `images(j)` gives G's
  /// images of micro-batch j (detached; labels from `lat`), `image_grad(j, gx)` takes
  /// dL_G/dx (divided by k, scaled by G's loss scale) before D's update. Sets
  /// `g_loss_finite` to whether G's losses were finite on this rank.
  void d_update_sharing_forward(TrainedModel d, DynamicLossScaler* g_scaler, const StepInputs& in,
                                const TensorList& lat, const std::function<at::Tensor(int64_t)>& images,
                                const std::function<void(int64_t, const at::Tensor&)>& image_grad, StepMetrics& r,
                                at::Tensor& stats, bool& g_loss_finite);
  bool shared_d_forward_ = false;
  /// set_aux_class_weight: the mean cross-entropy of D's class logits (`d_out`[1], rows
  /// [start, start + n), all when n < 0) against labels `y`, in `md`, before the weight;
  /// undefined when the weight is 0. Throws std::invalid_argument when D returned no class
  /// logits or `y` is undefined.
  at::Tensor class_loss(const TensorList& d_out, const at::Tensor& y, at::ScalarType md, int64_t start = 0,
                        int64_t n = -1) const;
  double aux_class_weight_ = 0;
  /// set_split: one side of a split step (split_step.cpp).
  StepMetrics split_step(TrainedModel g, TrainedModel d, const StepInputs& in);
  void split_g_side(TrainedModel g, const StepInputs& in, StepMetrics& r, at::Tensor& stats);
  void split_d_side(TrainedModel d, DynamicLossScaler* g_scaler, const StepInputs& in, StepMetrics& r,
                    at::Tensor& stats);
  /// G's pass on D's side: scores the images G's ranks send for micro-batch j (with D's
  /// condition `y`: labels, A images when paired, or undefined) against the frozen D and
  /// sends back dL_G/dx; returns the images (detached).
  MicroFakes split_d_score(TrainedModel d, const at::Tensor& y, at::ScalarType md, at::Tensor& stats);
  /// The communicator of this rank's model updates: the world's, or split's group.
  Communicator& update_comm() const;
  SplitPlacement* split_ = nullptr;
  /// The last split_step's figures (split_step.cpp's slots, each divided by the group size).
  at::Tensor split_stats_;
  struct SplitFigures;  // post_split_figures: one step's exchange in flight
  std::deque<std::shared_ptr<SplitFigures>> split_figures_;  // shared_ptr: SplitFigures is incomplete here
  double split_figures_wait_s_ = 0;  // finish_split_figures' waits since the last split step
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
  /// D's real-image loss of one micro-batch (divided by k), with the R1 penalty when due
  /// and the class term when on; runs the backward.
  RealPass d_real_pass(TrainedModel d, const TensorList& real, at::ScalarType md);

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
