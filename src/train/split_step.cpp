// One training step under train.placement: split (step_executor.h's SplitStepExecutor):
// G's ranks run G's side, D's ranks D's side, and the images and their gradients cross
// between them (split_placement.h) in the order of the step's schedule (step_schedule.h).
// The order of the latent draws, forwards and updates is the shared placement's, so both
// placements give the same updates.
#include <chrono>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <utility>

#include <torch/torch.h>

#include "shardgan/comm/communicator.h"
#include "shardgan/optim/loss_scaler.h"
#include "shardgan/optim/optimizer.h"
#include "shardgan/sharding/sharded_model.h"
#include "shardgan/train/split_placement.h"
#include "shardgan/train/step_executor.h"
#include "shardgan/util/test_control.h"

namespace shardgan {

namespace {
using T = ScheduledTransfer;
}  // namespace

SplitStepExecutor::SplitStepExecutor(GanObjective& obj, SplitPlacement& split)
    : obj_(obj), split_(split), figures_(split.world()),
      role_(split.holds_generator() ? RankRole::kGenerator : RankRole::kDiscriminator) {
  if (obj_.paired_ && obj_.simultaneous_) {
    throw std::invalid_argument("split placement does not take paired data with the simultaneous update");
  }
  if (obj_.separate_reg_ && (obj_.r1_gamma_ > 0 || obj_.pl_.weight > 0)) {
    throw std::invalid_argument("split placement does not run separate regularization updates (StyleGAN2)");
  }
  obj_.set_update_comm(&split_.group());
  schedule_ = split_schedule(obj_.shape());
  std::vector<ScheduledTransfer> declared = schedule_;
  // Negative control of step_schedule_control: D's side declares two transfers swapped,
  // as a reordered loop on one side would; set_schedule must refuse it on every rank.
  if (!split_.holds_generator() && test_control("split_schedule_reorder") && declared.size() >= 3) {
    std::swap(declared[1], declared[2]);
  }
  split_.set_schedule(declared);  // collective: the two sides' fingerprints compared
}

SplitStepExecutor::~SplitStepExecutor() { obj_.set_update_comm(nullptr); }

at::Tensor SplitStepExecutor::images(int32_t d_step, int32_t j, const at::Tensor& mine) {
  return split_.images_to_d({T::kImagesToD, d_step, j}, mine);
}

at::Tensor SplitStepExecutor::grads(int32_t j, const at::Tensor& mine) {
  return split_.grads_to_g({T::kGradsToG, T::kGPass, j}, mine);
}

StepMetrics SplitStepExecutor::step(TrainedModel g, TrainedModel d, const StepInputs& in) {
  const auto t0 = std::chrono::steady_clock::now();
  if (obj_.aug_) throw std::invalid_argument("ADA (augment.mode) needs train.placement shared");
  StepStats st;
  const bool is_g = split_.holds_generator();
  // G's loss scale lives on G's ranks: D's side returns unscaled dL_G/dx, which G's side
  // scales, except for the shared D forward, which scales by D's rank's copy of G's
  // scaler. float16 compute, the only kind that scales, runs only on GPUs, where split
  // placement is refused (the NCCL backend); a D side that scales must first get G's
  // current scale each step.
  if (g.scaler && g.scaler->enabled()) {
    throw std::logic_error("split placement does not take float16 loss scaling yet");
  }
  split_.begin_step();
  if (is_g) {
    g_side(g, in, st);
  } else {
    d_side(d, g.scaler, in, st);
  }
  split_.end_step();
  const double busy = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double idle_transfers = split_.take_idle_s();
  const double idle = idle_transfers + figures_wait_s_;  // the figures' wait came before t0
  figures_wait_s_ = 0;
  (is_g ? st.idle_g_s : st.idle_d_s) = idle;
  (is_g ? st.busy_g_s : st.busy_d_s) = busy - idle_transfers;
  st.bytes_between_groups = split_.take_sent_bytes();
  last_ = st;
  stepped_ = true;
  StepMetrics r;
  static_cast<StepStats&>(r) = st;
  r.loss_scale_d = d.scaler ? d.scaler->scale() : 1.0;
  r.loss_scale_g = g.scaler ? g.scaler->scale() : 1.0;
  return r;
}

void SplitStepExecutor::post_figures(const StepMetrics& local, const std::vector<double>& votes) {
  if (!stepped_) throw std::logic_error("post_figures: no split step since the last post");
  figures_.post(last_, role_, votes);
  pending_local_.push_back(local);
  stepped_ = false;
}

StepMetrics SplitStepExecutor::finish_figures(std::vector<double>* votes) {
  if (pending_local_.empty()) throw std::logic_error("finish_figures: no split figures in flight");
  double waited = 0;
  const StepStats all = figures_.finish(votes, &waited);
  figures_wait_s_ += waited;
  StepMetrics r = std::move(pending_local_.front());
  pending_local_.pop_front();
  static_cast<StepStats&>(r) = all;
  return r;
}

void SplitStepExecutor::g_side(TrainedModel g, const StepInputs& in, StepStats& st) {
  GanObjective& o = obj_;
  const auto k = static_cast<int32_t>(o.micro_);
  // Images for D steps that draw them from G under no_grad (every D step of the
  // alternating update; D steps 2.. of the simultaneous one). Paired: G translates the A
  // of its slice of the D step's real batch, and keeps {z, A, B} for G's pass, as
  // d_update does under shared placement.
  auto d_step_images = [&](int32_t s) {
    TensorList lat = in.latents();
    if (o.paired_) o.paired_batch_.clear();
    for (int32_t j = 0; j < k; ++j) {
      at::Tensor y = lat[1].defined() ? in.local(lat[1], j) : at::Tensor();
      if (o.paired_) {
        TensorList real = in.real(j);
        y = real.at(1);
        o.paired_batch_.push_back({in.local(lat[0], j), y, real.at(0)});
      }
      at::Tensor fake;
      {
        torch::NoGradGuard no_grad;
        fake = g.model->forward(TensorList{in.local(lat[0], j), y}).at(0);
      }
      images(s, j, fake);
    }
  };
  // G's pass: each micro-batch's images go to D's side, which returns dL_G/dx (already
  // divided by k), or NaN where D's side found G's loss not finite; G backpropagates it.
  // A non-finite gradient received makes this rank's loss verdict false, so the update's
  // vote skips G's update as the shared placement does for a non-finite G loss. Paired:
  // the pairs of the last D step, no new latents (as g_pass), and G's side adds the L1
  // term, which needs B and no D: adversarial_weight * dL_G/dx + l1_weight * dL1/dx in one
  // backward.
  auto g_pass = [&] {
    const TensorList lat = o.g_pass_latents(in);
    bool finite = true;
    for (int32_t j = 0; j < k; ++j) {
      g.model->set_gradient_sync(j == k - 1);
      const auto [z, y, target, md] = o.g_pass_micro(in, lat, j);
      at::Tensor fake = g.model->forward(TensorList{z, y}).at(0);
      images(T::kGPass, j, fake.detach());
      at::Tensor grad = grads(j).to(fake.scalar_type());
      finite = finite && std::isfinite(grad.sum(at::kDouble).item<double>());
      if (split_.grad_scale() != 1.0) grad.mul_(split_.grad_scale());
      if (!o.paired_) {
        fake.backward(g.scaler->scale_loss(grad));
        continue;
      }
      at::Tensor l1 = (fake.to(md) - target.to(fake.device(), md)).abs().mean() / k;
      if (test_control("split_drop_l1")) l1 = l1 * 0;  // negative control of split_placement's pix2pix parity
      if (o.adversarial_weight_ != 1.0) grad.mul_(o.adversarial_weight_);
      torch::autograd::backward({fake, l1 * o.l1_weight_}, {grad, torch::ones_like(l1)});
      st.loss_l1 += l1.item<double>();
    }
    return finite;
  };
  auto update_g = [&](bool finite) {
    if (o.before_update_) o.before_update_();
    st.skipped_g = !o.finish_update(g, st.grad_norm_g, 0, finite, st.nonfinite_g);
  };
  if (!o.simultaneous_) {
    for (int32_t s = 0; s < o.d_steps_; ++s) d_step_images(s);
    update_g(g_pass());
  } else {
    const bool finite = g_pass();  // D's first step trains on these images
    if (o.d_steps_ == 1) update_g(finite);
    for (int32_t s = 1; s < o.d_steps_; ++s) d_step_images(s);
    if (o.d_steps_ > 1) update_g(finite);
  }
}

namespace {
// D's verdict on G's loss, sent with the gradient: NaN gradients when the loss of the
// micro-batch is not finite on this rank.
at::Tensor with_verdict(at::Tensor gx, bool g_loss_finite) {
  if (test_control("split_drop_g_verdict")) return gx;  // negative control of split_nonfinite
  return g_loss_finite ? gx : torch::full_like(gx, std::numeric_limits<double>::quiet_NaN());
}
}  // namespace

GanObjective::MicroFakes SplitStepExecutor::score_for_g(TrainedModel d, int32_t j, const at::Tensor& y,
                                                        at::ScalarType md, StepStats& st) {
  GanObjective& o = obj_;
  const int64_t k = o.micro_;
  at::Tensor x = images(T::kGPass, j);
  x.requires_grad_(true);
  const TensorList d_out = d.model->forward(TensorList{x, y});
  at::Tensor loss = o.g_loss(d_out.at(0).reshape({-1}).to(md)) / k;
  const at::Tensor class_fake = o.class_loss(d_out, y, md);  // AC-GAN, as the shared g_pass
  // Negative control of split_placement's class-term parity: D's side leaves G's class term out.
  const bool with_class = class_fake.defined() && !test_control("split_drop_class_fake");
  const at::Tensor total = with_class ? loss + class_fake * (o.aux_class_weight_ / k) : loss;
  total.backward();
  // Summed over micro-batches, as g_pass; the same host values give D's verdict on the loss.
  const double loss_v = loss.item<double>();
  const double class_v = class_fake.defined() ? class_fake.item<double>() : 0.0;
  st.loss_g += loss_v;
  st.class_fake += class_v / k;
  grads(j, with_verdict(x.grad(), std::isfinite(loss_v) && (!with_class || std::isfinite(class_v))));
  return {x.detach(), y};
}

void SplitStepExecutor::d_side(TrainedModel d, DynamicLossScaler* g_scaler, const StepInputs& in, StepStats& st) {
  GanObjective& o = obj_;
  const auto k = static_cast<int32_t>(o.micro_);
  auto receive = [&](int32_t s, const TensorList& lat) {
    std::vector<GanObjective::MicroFakes> fakes;
    for (int32_t j = 0; j < k; ++j) {
      fakes.push_back({images(s, j), lat[1].defined() ? in.local(lat[1], j) : at::Tensor()});
    }
    return fakes;
  };
  // G's pass on D's side: D frozen (input gradients only, no D reduce-scatter). Paired:
  // D's condition is the A of the last D step's pairs, and no latents are drawn (as G's
  // side and g_pass); the loss is in the model dtype (the latents' or B's).
  auto g_pass = [&] {
    d.model->set_requires_grad(false);
    const TensorList lat = o.g_pass_latents(in);
    std::vector<GanObjective::MicroFakes> kept;
    for (int32_t j = 0; j < k; ++j) {
      const GanObjective::GPassMicro m = o.g_pass_micro(in, lat, j);
      kept.push_back(score_for_g(d, j, m.y, m.md, st));
    }
    d.model->set_requires_grad(true);
    return kept;
  };
  // d_update draws G's images only when given none: here they always come from G's side.
  // With the simultaneous update D's first step trains on G's pass (its images, or, with
  // the shared D forward, the pass itself, which makes that update); every other D step
  // receives images of its own.
  TrainedModel no_g{nullptr, nullptr, nullptr};
  std::vector<GanObjective::MicroFakes> pass_fakes;
  int32_t first_d_step = 0;
  if (o.simultaneous_ && o.shared_d_forward_) {
    // One D forward per micro-batch: dL_G/dx with D_t goes back to G's ranks before D's
    // fake term's backward and real pass, so G's backward overlaps them.
    bool g_finite = true;
    o.d_update_sharing_forward(
        d, g_scaler, in, in.latents(), [&](int64_t j) { return images(T::kGPass, static_cast<int32_t>(j)); },
        [&](int64_t j, const at::Tensor& gx, const at::Tensor& lg) {
          grads(static_cast<int32_t>(j), with_verdict(gx, std::isfinite(lg.item<double>())));
        },
        st, g_finite);
    first_d_step = 1;
  } else if (o.simultaneous_) {
    pass_fakes = g_pass();  // dL_G/dx with D_t, sent before D updates
  }
  for (int32_t s = first_d_step; s < o.d_steps_; ++s) {
    std::vector<GanObjective::MicroFakes> fakes =
        o.simultaneous_ && s == 0 ? std::move(pass_fakes) : receive(s, in.latents());
    o.d_update(no_g, d, in, s, &fakes, st);
  }
  if (!o.simultaneous_) g_pass();
}

namespace {

using Alive = PhaseBuilder::Alive;

// Split placement, G's ranks: GanObjective::split_g_side.
void split_g_phases(const PhaseShape& s, PhaseBuilder& b) {
  const Alive g_pass{true, false, true, true}, g_update{false, false, false, true}, none{};
  if (!s.step.simultaneous) {
    for (int64_t i = 0; i < s.step.d_steps; ++i) {
      b.add("images for " + PhaseBuilder::d_update_name(i), "split_g_side's d_step_images (G forward under no_grad)",
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
    b.add("images for " + PhaseBuilder::d_update_name(i), "split_g_side's d_step_images (G forward under no_grad)",
          {true, false, false, true}, none);
  }
  if (s.step.d_steps > 1) b.add("G update", "GanObjective::finish_update from split_g_side's update_g", g_update, none);
}

// Split placement, D's ranks: GanObjective::split_d_side. D's updates train on the k
// micro-batches of images received from G's ranks (`fakes`, all received first).
void split_d_phases(const PhaseShape& s, PhaseBuilder& b) {
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
    b.add(PhaseBuilder::d_update_name(i), "split_d_side -> GanObjective::d_update on G's ranks' images", none, d_training, k);
    b.add(PhaseBuilder::d_update_name(i) + ": optimizer step", "GanObjective::finish_update from d_update", none, d_update, k);
  }
  if (!s.step.simultaneous) {
    b.add("G pass on D's side", "split_d_side's g_pass (split_d_score: D's input gradients only)", none, d_frozen);
  }
}

}  // namespace

std::vector<StepPhase> SplitStepExecutor::phases(const PhaseShape& shape) {
  PhaseBuilder b(shape);
  if (shape.placement == PhaseShape::Placement::kSplitGenerator) {
    split_g_phases(shape, b);
  } else {
    split_d_phases(shape, b);
  }
  return b.take();
}

}  // namespace shardgan
