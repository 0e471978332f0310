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
  step_start_.buffers.clear();
  for (ShardedModel* m : {g_.get(), d_.get()}) {
    if (!m) continue;  // split placement: the other group's model
    for (auto& kv : m->named_buffers()) step_start_.buffers.push_back(kv.second.clone());
  }
  abandonable_ = true;
}

namespace {

// Thrown on every rank at the same unit boundary to abandon a step (train.preempt_grace_s).
struct StepAbandoned : std::runtime_error {
  StepAbandoned() : std::runtime_error("step abandoned for preemption") {}
};

}  // namespace

void Trainer::grace_vote() {
  // Shared placement: every rank runs the same units, so all return here alike. Split:
  // every transfer votes on every rank; a rank that has updated blocks the abandon.
  if (!abandonable_ && !split_) return;
  const double age = preemption_signal_age_s();
  bool want = false;
  if (age >= 0 && abandonable_) {  // the estimates are needed only once a signal came
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - step_t0_).count();
    double save_s = ckpt_->last_save_s();
    if (save_s <= 0) {  // no save yet: the model state at an assumed 200 MB/s
      save_s = static_cast<double>(stats_of(g_).model_state_bytes() + stats_of(d_).model_state_bytes()) / 200e6;
    }
    want = must_abandon_step(cfg_.preempt_grace_s, age, last_step_s_, elapsed, save_s);
  }
  at::Tensor v = torch::tensor({age >= 0 ? 1.0 : 0.0, want ? 1.0 : 0.0, abandonable_ ? 0.0 : 1.0}, torch::kDouble);
  comm_.all_reduce(v, ReduceOp::kMax);
  if (v[1].item<double>() == 0 || v[2].item<double>() != 0) return;
  abandonable_ = false;
  abandoning_ = true;
  throw StepAbandoned();
}

std::string Trainer::abandon_step_and_save() {
  torch::NoGradGuard no_grad;
  const int64_t abandoned = counters_.step + 1;
  const double into = std::chrono::duration<double>(std::chrono::steady_clock::now() - step_t0_).count();
  counters_ = step_start_.counters;
  data_->restore(step_start_.data);
  size_t i = 0;
  for (ShardedModel* m : {g_.get(), d_.get()}) {
    if (!m) continue;  // split placement: the other group's model
    m->abandon_step();
    for (auto& kv : m->named_buffers()) kv.second.copy_(step_start_.buffers.at(i++));
  }
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
