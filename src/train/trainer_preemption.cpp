// The trainer's preemption: the votes on a signal and the time limit after a step, and,
// with train.preempt_grace_s, the votes inside a step and the abandoning of it (the
// state captured at its start given back, the last completed step saved).
#include "shardgan/train/trainer.h"

#include <chrono>
#include <stdexcept>

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "shardgan/train/preemption.h"
#include "shardgan/train/split_placement.h"
#include "shardgan/util/progress.h"

namespace shardgan {

std::vector<double> Trainer::local_votes(double elapsed_s) const {
  const bool up = comm_.rank() == 0 && cfg_.time_limit_s > 0 && elapsed_s >= cfg_.time_limit_s;
  return {static_cast<double>(preemption_signal()), up ? 1.0 : 0.0};
}

int Trainer::preemption_vote(double elapsed_s, bool& time_up) {
  at::Tensor v = torch::tensor(local_votes(elapsed_s), torch::kDouble);
  comm_.all_reduce(v, ReduceOp::kMax);
  time_up = v[1].item<double>() > 0.5;
  return static_cast<int>(v[0].item<double>());
}

void Trainer::capture_step_start() {
  torch::NoGradGuard no_grad;
  step_start_.counters = counters_;
  step_start_.data = data_->position();
  step_start_.buffers = models_->clone_buffers();
  abandonable_ = true;
}

namespace {

// Thrown on every rank at the same unit boundary to abandon a step (train.preempt_grace_s).
struct StepAbandoned : std::runtime_error {
  StepAbandoned() : std::runtime_error("step abandoned for preemption") {}
};

}  // namespace

std::array<double, 3> Trainer::grace_ballot() {
  const double age = preemption_signal_age_s();
  bool want = false;
  if (age >= 0 && abandonable_) {  // the estimates are needed only once a signal came
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - step_t0_).count();
    double save_s = ckpt_->last_save_s();
    if (save_s <= 0) {  // no save yet: the model state at an assumed 200 MB/s
      save_s = static_cast<double>(models_->generator_stats().model_state_bytes() +
                                   models_->discriminator_stats().model_state_bytes()) / 200e6;
    }
    want = must_abandon_step(cfg_.preempt_grace_s, age, last_step_s_, elapsed, save_s);
  }
  return {age >= 0 ? 1.0 : 0.0, want ? 1.0 : 0.0, abandonable_ ? 0.0 : 1.0};
}

bool Trainer::finish_grace_vote() {
  if (!grace_vote_) return false;
  std::unique_ptr<GraceVote> v = std::move(grace_vote_);
  v->work->wait();
  const at::Tensor world = std::get<0>(v->all.view({-1, 3}).max(0));
  return world[1].item<double>() != 0 && world[2].item<double>() == 0;
}

void Trainer::grace_vote() {
  if (models_->split()) {
    // Split: every transfer votes on every rank; a rank that has updated blocks the abandon.
    const std::array<double, 3> b = grace_ballot();
    at::Tensor v = torch::tensor({b[0], b[1], b[2]}, torch::kDouble);
    comm_.all_reduce(v, ReduceOp::kMax);
    if (v[1].item<double>() == 0 || v[2].item<double>() != 0) return;
  } else {
    // Shared: every rank runs the same units, so all return here alike, and read the vote
    // posted one unit ago.
    if (!abandonable_) return;
    if (!finish_grace_vote()) {
      auto v = std::make_unique<GraceVote>();
      const std::array<double, 3> b = grace_ballot();
      v->ballot = torch::tensor({b[0], b[1], b[2]}, torch::kDouble);
      v->all = torch::empty({3 * comm_.world_size()}, torch::kDouble);
      v->work = comm_.all_gather_async(v->all, v->ballot);
      grace_vote_ = std::move(v);
      return;
    }
  }
  abandonable_ = false;
  abandoning_ = true;
  throw StepAbandoned();
}

void Trainer::before_first_update() {
  if (abandonable_ && finish_grace_vote()) {  // shared: the last unit's vote
    abandonable_ = false;
    abandoning_ = true;
    throw StepAbandoned();
  }
  abandonable_ = false;
}

std::string Trainer::abandon_step_and_save() {
  torch::NoGradGuard no_grad;
  const int64_t abandoned = counters_.step + 1;
  const double into = std::chrono::duration<double>(std::chrono::steady_clock::now() - step_t0_).count();
  counters_ = step_start_.counters;
  data_->restore(step_start_.data);
  models_->abandon_step(step_start_.buffers);
  const std::string dir = save();
  ProgressLine::finish();
  if (comm_.rank() == 0) {
    spdlog::warn("preemption: abandoned step {} ({:.1f} s into it; a step takes {:.1f} s, train.preempt_grace_s is {}), "
                 "saved step {} in {:.1f} s, {:.1f} s after the signal: {}. Continue with --resume auto",
                 abandoned, into, last_step_s_, cfg_.preempt_grace_s, counters_.step, ckpt_->last_save_s(), preemption_signal_age_s(), dir);
  }
  return dir;
}

}  // namespace shardgan
