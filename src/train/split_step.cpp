// One training step under train.placement: split (objective.h's set_split): G's ranks run
// G's side, D's ranks D's side, and the images and their gradients cross between them
// (split_placement.h). The order of the latent draws, forwards and updates is the shared
// placement's, so both placements give the same updates.
#include <chrono>
#include <cmath>
#include <stdexcept>

#include <torch/torch.h>

#include "shardgan/comm/communicator.h"
#include "shardgan/optim/loss_scaler.h"
#include "shardgan/optim/optimizer.h"
#include "shardgan/sharding/sharded_model.h"
#include "shardgan/train/objective.h"
#include "shardgan/train/split_placement.h"

namespace shardgan {

namespace {
at::Tensor host(const at::Tensor& t) { return t.to(at::kCPU, at::kDouble); }

// The split step's world figures: each group's, divided by its size, in separate slots,
// so that one sum over the world gives every rank both groups' averages.
enum Slot : int64_t {
  kLossD, kLossG, kDReal, kDFake, kLossL1, kClassReal, kClassFake,  // as the shared step's stats
  kSkippedD, kSkippedG, kNonfiniteD, kNonfiniteG, kNormD, kNormG, kR1,
  kIdleG, kIdleD, kBusyG, kBusyD, kBytes, kSlots
};
}  // namespace

struct GanObjective::SplitFigures {
  StepMetrics local;
  at::Tensor mine, all;  // [kSlots + votes] this rank's; [N, kSlots + votes] every rank's
  int64_t votes = 0;
  std::unique_ptr<Work> work;
};

GanObjective::~GanObjective() = default;  // SplitFigures' Work waits for what is in flight

void GanObjective::set_split(SplitPlacement* p) {
  if (p && paired_ && simultaneous_) {
    throw std::invalid_argument("split placement does not take paired data with the simultaneous update");
  }
  split_ = p;
}

Communicator& GanObjective::update_comm() const { return split_ ? split_->group() : comm_; }

StepMetrics GanObjective::split_step(TrainedModel g, TrainedModel d, const StepInputs& in) {
  const auto t0 = std::chrono::steady_clock::now();
  StepMetrics r;
  at::Tensor stats = torch::zeros({kSlots}, torch::kDouble);
  const bool is_g = split_->holds_generator();
  // G's loss scale lives on G's ranks: D's side returns unscaled dL_G/dx, which G's side
  // scales, except for the shared D forward, which scales by D's rank's copy of G's
  // scaler. float16 compute, the only kind that scales, runs only on GPUs, where split
  // placement is refused (the NCCL backend); a D side that scales must first get G's
  // current scale each step.
  if (g.scaler && g.scaler->enabled()) {
    throw std::logic_error("split placement does not take float16 loss scaling yet");
  }
  if (is_g) {
    split_g_side(g, in, r, stats);
  } else {
    split_d_side(d, g.scaler, in, r, stats);
  }
  const double busy = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double idle_transfers = split_->take_idle_s();
  const double idle = idle_transfers + split_figures_wait_s_;  // the figures' wait came before t0
  split_figures_wait_s_ = 0;
  const double n = split_->group().world_size();
  auto put = [&](Slot s, double v) { stats[s] = v / n; };
  if (is_g) {
    stats[kLossL1] /= n;
    put(kSkippedG, r.skipped_g);
    put(kNonfiniteG, r.nonfinite_g);
    put(kNormG, r.grad_norm_g);
  } else {
    stats.narrow(0, 0, kClassFake + 1).div_(n);
    put(kSkippedD, r.skipped_d);
    put(kNonfiniteD, r.nonfinite_d);
    put(kNormD, r.grad_norm_d);
    put(kR1, r.r1);
  }
  put(is_g ? kIdleG : kIdleD, idle);
  put(is_g ? kBusyG : kBusyD, busy - idle_transfers);
  stats[kBytes] = static_cast<double>(split_->take_sent_bytes());
  split_stats_ = stats;
  r.loss_scale_d = d.scaler ? d.scaler->scale() : 1.0;
  r.loss_scale_g = g.scaler ? g.scaler->scale() : 1.0;
  return r;
}

void GanObjective::post_split_figures(const StepMetrics& local, const std::vector<double>& votes) {
  if (!split_stats_.defined()) throw std::logic_error("post_split_figures: no split step since the last post");
  auto f = std::make_shared<SplitFigures>();
  f->local = local;
  f->votes = static_cast<int64_t>(votes.size());
  f->mine = torch::zeros({kSlots + f->votes}, torch::kDouble);
  f->mine.narrow(0, 0, kSlots).copy_(split_stats_);
  for (int64_t i = 0; i < f->votes; ++i) f->mine[kSlots + i] = votes[static_cast<size_t>(i)];
  split_stats_ = at::Tensor();
  f->all = torch::empty({comm_.world_size() * f->mine.numel()}, torch::kDouble);
  f->work = comm_.all_gather_async(f->all, f->mine);
  split_figures_.push_back(std::move(f));
}

StepMetrics GanObjective::finish_split_figures(std::vector<double>* votes) {
  if (split_figures_.empty()) throw std::logic_error("finish_split_figures: no split figures in flight");
  std::shared_ptr<SplitFigures> f = std::move(split_figures_.front());
  split_figures_.pop_front();
  const auto t0 = std::chrono::steady_clock::now();
  f->work->wait();
  split_figures_wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const at::Tensor all = f->all.view({comm_.world_size(), -1});
  const at::Tensor stats = all.narrow(1, 0, kSlots).sum(0);  // rank order: the same sum on every rank
  if (votes) {
    votes->clear();
    if (f->votes > 0) {
      const at::Tensor v = std::get<0>(all.narrow(1, kSlots, f->votes).max(0));
      for (int64_t i = 0; i < f->votes; ++i) votes->push_back(v[i].item<double>());
    }
  }
  StepMetrics r = f->local;
  r.loss_d = stats[kLossD].item<double>();
  r.loss_g = stats[kLossG].item<double>();
  r.d_real = stats[kDReal].item<double>();
  r.d_fake = stats[kDFake].item<double>();
  r.loss_l1 = stats[kLossL1].item<double>();
  r.class_real = stats[kClassReal].item<double>();
  r.class_fake = stats[kClassFake].item<double>();
  r.skipped_d = stats[kSkippedD].item<double>() > 0.5;
  r.skipped_g = stats[kSkippedG].item<double>() > 0.5;
  r.nonfinite_d = stats[kNonfiniteD].item<double>() > 0.5;
  r.nonfinite_g = stats[kNonfiniteG].item<double>() > 0.5;
  r.grad_norm_d = stats[kNormD].item<double>();
  r.grad_norm_g = stats[kNormG].item<double>();
  r.r1 = stats[kR1].item<double>();
  r.idle_g_s = stats[kIdleG].item<double>();
  r.idle_d_s = stats[kIdleD].item<double>();
  r.busy_g_s = stats[kBusyG].item<double>();
  r.busy_d_s = stats[kBusyD].item<double>();
  r.bytes_between_groups = static_cast<int64_t>(stats[kBytes].item<double>());
  return r;
}

void GanObjective::split_g_side(TrainedModel g, const StepInputs& in, StepMetrics& r, at::Tensor& stats) {
  const int64_t k = micro_;
  // Images for D steps that draw them from G under no_grad (every D step of the
  // alternating update; D steps 2.. of the simultaneous one). Paired: G translates the A
  // of its slice of the D step's real batch, and keeps {z, A, B} for G's pass, as
  // d_update does under shared placement.
  auto d_step_images = [&] {
    TensorList lat = in.latents();
    if (paired_) paired_batch_.clear();
    for (int64_t j = 0; j < k; ++j) {
      at::Tensor y = lat[1].defined() ? in.local(lat[1], j) : at::Tensor();
      if (paired_) {
        TensorList real = in.real(j);
        y = real.at(1);
        paired_batch_.push_back({in.local(lat[0], j), y, real.at(0)});
      }
      at::Tensor fake;
      {
        torch::NoGradGuard no_grad;
        fake = g.model->forward(TensorList{in.local(lat[0], j), y}).at(0);
      }
      split_->images_to_d(fake);
    }
  };
  auto update_g = [&](bool finite) {
    if (before_update_) before_update_();
    r.skipped_g = !finish_update(g, r.grad_norm_g, 0, finite, r.nonfinite_g);
  };
  // G's pass: each micro-batch's images go to D's side, which returns dL_G/dx (already
  // divided by k); G backpropagates it. D's side checks the loss's finiteness; the vote
  // on G's gradients catches what a non-finite loss leaves there. Paired: the pairs of the
  // last D step, no new latents (as g_pass), and G's side adds the L1 term, which needs B
  // and no D: adversarial_weight * dL_G/dx + l1_weight * dL1/dx in one backward.
  auto g_pass = [&] {
    const TensorList lat = g_pass_latents(in);
    for (int64_t j = 0; j < k; ++j) {
      g.model->set_gradient_sync(j == k - 1);
      const auto [z, y, target, md] = g_pass_micro(in, lat, j);
      at::Tensor fake = g.model->forward(TensorList{z, y}).at(0);
      split_->images_to_d(fake.detach());
      at::Tensor grad = split_->grads_to_g(at::Tensor()).to(fake.scalar_type());
      if (split_->grad_scale() != 1.0) grad.mul_(split_->grad_scale());
      if (!paired_) {
        fake.backward(g.scaler->scale_loss(grad));
        continue;
      }
      const at::Tensor l1 = (fake.to(md) - target.to(fake.device(), md)).abs().mean() / k;
      if (adversarial_weight_ != 1.0) grad.mul_(adversarial_weight_);
      torch::autograd::backward({fake, l1 * l1_weight_}, {grad, torch::ones_like(l1)});
      stats[kLossL1] += host(l1.detach().reshape({1}))[0];
    }
  };
  if (!simultaneous_) {
    for (int64_t s = 0; s < d_steps_; ++s) d_step_images();
    g_pass();
    update_g(true);
  } else {
    g_pass();  // D's first step trains on these images
    if (d_steps_ == 1) update_g(true);
    for (int64_t s = 1; s < d_steps_; ++s) d_step_images();
    if (d_steps_ > 1) update_g(true);
  }
}

GanObjective::MicroFakes GanObjective::split_d_score(TrainedModel d, const at::Tensor& y, at::ScalarType md,
                                                     at::Tensor& stats) {
  const int64_t k = micro_;
  at::Tensor x = split_->images_to_d(at::Tensor());
  x.requires_grad_(true);
  const TensorList d_out = d.model->forward(TensorList{x, y});
  at::Tensor loss = g_loss(d_out.at(0).reshape({-1}).to(md)) / k;
  const at::Tensor class_fake = class_loss(d_out, y, md);  // AC-GAN, as the shared g_pass
  (class_fake.defined() ? loss + class_fake * (aux_class_weight_ / k) : loss).backward();
  stats[kLossG] += host(loss.detach().reshape({1}))[0];  // summed over micro-batches, as the shared g_pass
  if (class_fake.defined()) stats[kClassFake] += host(class_fake.detach().reshape({1}))[0] / k;
  split_->grads_to_g(x.grad());
  return {x.detach(), y};
}

void GanObjective::split_d_side(TrainedModel d, DynamicLossScaler* g_scaler, const StepInputs& in, StepMetrics& r,
                                at::Tensor& stats) {
  const int64_t k = micro_;
  auto receive = [&](const TensorList& lat) {
    std::vector<MicroFakes> fakes;
    for (int64_t j = 0; j < k; ++j) {
      fakes.push_back({split_->images_to_d(at::Tensor()),
                       lat[1].defined() ? in.local(lat[1], j) : at::Tensor()});
    }
    return fakes;
  };
  // G's pass on D's side: D frozen (input gradients only, no D reduce-scatter). Paired:
  // D's condition is the A of the last D step's pairs, and no latents are drawn (as G's
  // side and g_pass); the loss is in the model dtype (the latents' or B's).
  auto g_pass = [&] {
    d.model->set_requires_grad(false);
    const TensorList lat = g_pass_latents(in);
    std::vector<MicroFakes> kept;
    for (int64_t j = 0; j < k; ++j) {
      const GPassMicro m = g_pass_micro(in, lat, j);
      kept.push_back(split_d_score(d, m.y, m.md, stats));
    }
    d.model->set_requires_grad(true);
    return kept;
  };
  // d_update draws G's images only when given none: here they always come from G's side.
  // With the simultaneous update D's first step trains on G's pass (its images, or, with
  // the shared D forward, the pass itself, which makes that update); every other D step
  // receives images of its own.
  TrainedModel no_g{nullptr, nullptr, nullptr};
  std::vector<MicroFakes> pass_fakes;
  int64_t first_d_step = 0;
  if (simultaneous_ && shared_d_forward_) {
    // One D forward per micro-batch: dL_G/dx with D_t goes back to G's ranks before D's
    // fake term's backward and real pass, so G's backward overlaps them.
    bool g_finite = true;
    d_update_sharing_forward(
        d, g_scaler, in, in.latents(), [&](int64_t) { return split_->images_to_d(at::Tensor()); },
        [&](int64_t, const at::Tensor& gx) { split_->grads_to_g(gx); }, r, stats, g_finite);
    first_d_step = 1;
  } else if (simultaneous_) {
    pass_fakes = g_pass();  // dL_G/dx with D_t, sent before D updates
  }
  for (int64_t s = first_d_step; s < d_steps_; ++s) {
    std::vector<MicroFakes> fakes = simultaneous_ && s == 0 ? std::move(pass_fakes) : receive(in.latents());
    d_update(no_g, d, in, s, &fakes, r, stats);
  }
  if (!simultaneous_) g_pass();
}

}  // namespace shardgan
