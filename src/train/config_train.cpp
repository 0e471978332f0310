// The train section of the training configuration (config_sections.h), read in parts: the
// loop's schedule, the update rule and placement, the losses, the run's guards, plots and
// gradient clipping.
#include <cmath>
#include <string>

#include "shardgan/models/family.h"
#include "shardgan/train/config_sections.h"

namespace shardgan::config_sections {

void read_train_loop(Reader& r, TrainConfig& c) {
  c.steps = r.get<int64_t>("train.steps", c.steps,
      "total training steps (each: train.d_steps D updates, then one G update)");
  require(c.steps >= 0, r, "train.steps", "must be >= 0");
  c.global_batch = r.get<int64_t>("train.global_batch", c.global_batch, "images per step over all ranks, split evenly");
  require(c.global_batch > 0, r, "train.global_batch", "must be > 0");
  c.micro_batches = r.get<int64_t>("train.micro_batches", c.micro_batches,
      "gradient accumulation: micro-batches per step (divides the global batch)");
  require(c.micro_batches > 0 && c.global_batch % c.micro_batches == 0, r, "train.micro_batches",
          "must be > 0 and divide train.global_batch");
  c.log_every = r.get<int64_t>("train.log_every", c.log_every, "steps between log lines and metrics.jsonl records");
  require(c.log_every > 0, r, "train.log_every", "must be > 0");
  c.sample_every = r.get<int64_t>("train.sample_every", c.sample_every,
      "steps between sample grids (0: only at the end)");
  require(c.sample_every >= 0, r, "train.sample_every", "must be >= 0");
  c.checkpoint_every = r.get<int64_t>("train.checkpoint_every", c.checkpoint_every,
      "steps between checkpoints (0: only at the end)");
  require(c.checkpoint_every >= 0, r, "train.checkpoint_every", "must be >= 0");
  c.keep_checkpoints = r.get<int64_t>("train.keep_checkpoints", c.keep_checkpoints,
      "newest committed checkpoints kept");
  require(c.keep_checkpoints >= 1, r, "train.keep_checkpoints", "must be >= 1");
  c.final_checkpoint = r.get<bool>("train.final_checkpoint", c.final_checkpoint,
      "save a checkpoint at the end of the run (false: only the periodic and preemption saves)");
  c.threads = r.get<int64_t>("train.threads", c.threads, "torch threads per rank (0: the node's cores / local ranks)");
  require(c.threads >= 0 && c.threads <= 1024, r, "train.threads", "must be 0 (cores / ranks) to 1024");
}

void read_train_update(Reader& r, TrainConfig& c) {
  c.d_steps = r.get<int64_t>("train.d_steps", c.d_steps, "D updates per G update (BigGAN uses 2)");
  require(c.d_steps >= 1, r, "train.d_steps", "must be >= 1 (D steps per G step)");
  c.d_joint_pass = r.get<bool>("train.d_joint_pass", c.d_joint_pass,
      "D sees fake and real images of a micro-batch in one forward and backward (BigGAN-PyTorch's G_D)");
  c.update = r.get<std::string>("train.update", c.update,
      "alternating (D's steps, then G against the updated D) or simultaneous (ParaGAN: G and D each against the "
      "other's weights of before the step; one G forward serves both)");
  require(c.update == "alternating" || c.update == "simultaneous", r, "train.update",
          "must be alternating or simultaneous");
  c.shared_d_forward = r.get<bool>("train.shared_d_forward", c.shared_d_forward,
      "train.update simultaneous: one D forward on the fakes serves G's image gradient and D's fake term (D "
      "gathered whole for that pass at stage 3, as for R1); false: two forwards, D released unit by unit");
  r.warn_if_ignored(c.update == "alternating", "train.shared_d_forward",
                    "has no effect with train.update alternating: only the simultaneous update shares D's forward on "
                    "G's images between G's and D's terms");
  c.placement = r.get<std::string>("train.placement", c.placement,
      "shared (G and D each sharded over every rank) or split (ParaGAN: ranks [0, K) hold only G, the rest only "
      "D; only images and their gradients cross)");
  require(c.placement == "shared" || c.placement == "split", r, "train.placement", "must be shared or split");
  read_placement(r, c);
}

void read_train_losses(Reader& r, TrainConfig& c) {
  c.loss = r.get<std::string>("train.loss", c.loss,
      "nonsaturating (DCGAN, pix2pix's vanilla), hinge (BigGAN) or least_squares (LSGAN)");
  require(c.loss == "nonsaturating" || c.loss == "hinge" || c.loss == "least_squares", r, "train.loss",
          "must be nonsaturating (DCGAN), hinge (BigGAN) or least_squares (LSGAN)");
  const bool paired = c.family->condition_channels() > 0;
  c.l1_weight = r.get<double>("train.l1_weight", paired ? 100.0 : 0.0,
      "image-to-image models: weight of the L1 term mean|G(A) - B| in G's loss (pix2pix: 100)");
  require(c.l1_weight >= 0 && std::isfinite(c.l1_weight), r, "train.l1_weight", "must be >= 0");
  c.adversarial_weight = r.get<double>("train.adversarial_weight", c.adversarial_weight,
      "image-to-image models: weight of the adversarial term in G's loss (0: G trains on L1 alone, the paper's L1 "
      "baseline; D still trains)");
  require(c.adversarial_weight >= 0 && std::isfinite(c.adversarial_weight), r, "train.adversarial_weight", "must be >= 0");
  require(paired || c.adversarial_weight == 1, r, "train.adversarial_weight",
          "needs an image-to-image model (model.arch: pix2pix); set it to 1");
  require(paired || c.l1_weight == 0, r, "train.l1_weight",
          "needs an image-to-image model (model.arch: pix2pix); set it to 0");
  require(paired || c.data_source != "paired", r, "data.source",
          "paired needs an image-to-image model (model.arch: pix2pix)");
  require(c.data_source != "paired" || c.family->condition_channels() == c.family->image_shape().channels, r,
          "model.in_channels", "must equal model.channels with data.source paired (A and B halves of one image)");
  c.aux_class_weight = r.get<double>("train.aux_class_weight", c.aux_class_weight,
      "AC-GAN: weight of the cross-entropy of D's class head, on real images in D's loss and on G's images "
      "in G's loss (0: off)");
  require(c.aux_class_weight >= 0 && std::isfinite(c.aux_class_weight), r, "train.aux_class_weight", "must be >= 0");
  require(c.aux_class_weight == 0 || c.family->discriminator_classifies(), r, "train.aux_class_weight",
          "needs a discriminator with a class head (model.arch biggan with model.d_class_head: true); set it to 0");
  require(!c.family->discriminator_classifies() || c.aux_class_weight > 0, r, "model.d_class_head",
          "adds a class head to D that only train.aux_class_weight > 0 trains: set that weight, or remove the head");
  require(!paired || c.update == "alternating", r, "train.update",
          "must be alternating for an image-to-image model (model.arch pix2pix): G's pass trains on the pairs of "
          "D's update");
}

void read_train_guards(Reader& r, TrainConfig& c) {
  c.skip_memory_check = r.get<bool>("train.skip_memory_check", c.skip_memory_check,
      "skip the memory pre-flight that refuses a config that would not fit");
  c.skip_disk_check = r.get<bool>("train.skip_disk_check", c.skip_disk_check,
      "skip the disk pre-flight that refuses a run whose offload files or checkpoints would not fit on their disk");
  c.memory_probe = r.get<bool>("train.memory_probe", c.memory_probe,
      "the pre-flight measures one step's transient memory on a stand-in world (CPU, no HSDP)");
  c.on_nonfinite = r.get<std::string>("train.on_nonfinite", c.on_nonfinite,
      "a NaN/Inf in a model's loss or gradients: skip that update, or abort the job");
  require(c.on_nonfinite == "skip" || c.on_nonfinite == "abort", r, "train.on_nonfinite",
          "must be skip or abort");
  c.max_nonfinite_steps = r.get<int64_t>("train.max_nonfinite_steps", c.max_nonfinite_steps,
      "skipped steps in a row before the job ends anyway");
  require(c.max_nonfinite_steps >= 1, r, "train.max_nonfinite_steps", "must be >= 1");
  c.preempt_grace_s = r.get<double>("train.preempt_grace_s", c.preempt_grace_s,
      "seconds between a preemption signal and the kill (0: finish the step, then save)");
  require(c.preempt_grace_s >= 0, r, "train.preempt_grace_s", "must be >= 0 (seconds; 0 = off)");
  c.time_limit_s = r.get<double>("train.time_limit_s", c.time_limit_s,
      "stop after the first step that ends this many seconds into training, then evaluate, save and "
      "sample as at train.steps (0: off; runs of equal wall time)");
  require(c.time_limit_s >= 0, r, "train.time_limit_s", "must be >= 0 (seconds; 0 = off)");
}

void read_train_regularization(Reader& r, TrainConfig& c) {
  const bool separate = c.family && c.family->separate_regularization();
  c.r1_gamma = r.get<double>("train.r1_gamma", c.r1_gamma, "R1 penalty weight on real images (0: off)");
  require(c.r1_gamma >= 0, r, "train.r1_gamma", "must be >= 0 (0 = off)");
  c.r1_every = r.get<int64_t>("train.r1_every", c.r1_every,
      "lazy R1 every k-th D update (StyleGAN2: 16; model.arch stylegan2: every k-th step, as an update of its own)");
  require(c.r1_every >= 1, r, "train.r1_every", "must be >= 1");
  r.warn_if_ignored(c.r1_gamma == 0, "train.r1_every", "has no effect with train.r1_gamma 0 (R1 off)");
  c.pl_weight = r.get<double>("train.pl_weight", c.pl_weight,
      "path-length regularization weight (StyleGAN2: 2; 0: off), an update of its own every train.pl_every steps");
  require(c.pl_weight >= 0 && std::isfinite(c.pl_weight), r, "train.pl_weight", "must be a finite value >= 0 (0 = off)");
  const bool styles = c.family && c.family->generator_returns_styles();
  require(c.pl_weight == 0 || (styles && separate), r, "train.pl_weight",
          "must be 0 for a model family without path-length regularization (a G that returns its styles, and "
          "separate regularization updates: model.arch stylegan2)");
  c.pl_every = r.get<int64_t>("train.pl_every", c.pl_every, "the path-length update runs every k-th step (StyleGAN2: 4)");
  require(c.pl_every >= 1, r, "train.pl_every", "must be >= 1");
  c.pl_batch_shrink = r.get<int64_t>("train.pl_batch_shrink", c.pl_batch_shrink,
      "the path-length update's batch is train.global_batch divided by this (StyleGAN2: 2)");
  require(c.pl_batch_shrink >= 1 && c.global_batch % (c.pl_batch_shrink * c.micro_batches) == 0, r,
          "train.pl_batch_shrink",
          "must be >= 1 and, times train.micro_batches, divide train.global_batch (each micro-batch gets an equal part)");
  c.pl_decay = r.get<double>("train.pl_decay", c.pl_decay,
      "the running mean of path lengths moves this far towards each micro-batch's mean (StyleGAN2: 0.01)");
  require(c.pl_decay > 0 && c.pl_decay <= 1, r, "train.pl_decay", "must be in (0, 1]");
  for (const char* key : {"train.pl_every", "train.pl_batch_shrink", "train.pl_decay"}) {
    r.warn_if_ignored(c.pl_weight == 0, key, "has no effect with train.pl_weight 0 (path length off)");
  }
  const bool reg_updates = separate && (c.r1_gamma > 0 || c.pl_weight > 0);
  const std::string why = "with R1 or path length on, a family that runs them as updates of their own "
                          "(model.arch stylegan2) needs ";
  require(!reg_updates || c.placement == "shared", r, "train.placement", why + "train.placement shared");
  require(!reg_updates || c.update == "alternating", r, "train.update", why + "train.update alternating");
}

void read_train_plots(Reader& r, TrainConfig& c) {
  c.plots = r.get<bool>("train.plots", c.plots, "write plots/*.png with gnuplot (warns once if gnuplot is missing)");
}

void read_train_grad_clip(Reader& r, TrainConfig& c) {
  c.grad_clip = r.get<double>("train.grad_clip", c.grad_clip, "global gradient-norm bound per model (0: off)");
  require(c.grad_clip >= 0, r, "train.grad_clip", "must be >= 0 (0 = off)");
}

}  // namespace shardgan::config_sections

namespace shardgan {

double lazy_regularization_ratio(const TrainConfig& c, bool generator) {
  if (!c.family || !c.family->separate_regularization()) return 1.0;
  const bool on = generator ? c.pl_weight > 0 : c.r1_gamma > 0;
  const double interval = static_cast<double>(generator ? c.pl_every : c.r1_every);
  return on ? interval / (interval + 1) : 1.0;
}

}  // namespace shardgan
