#include "shardgan/train/trainer.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <stdexcept>
#include <thread>

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "shardgan/device/device.h"
#include "shardgan/train/inference.h"
#include "shardgan/train/plots.h"
#include "shardgan/train/preemption.h"
#include "shardgan/train/run_summary.h"
#include "shardgan/util/progress.h"
#include "shardgan/util/test_control.h"

namespace shardgan {
namespace {

const ModelFamily& family_of(const TrainConfig& cfg) {
  if (!cfg.family) throw ConfigError(cfg.source + ": no model family (model.arch) was read");
  return *cfg.family;
}

}  // namespace

Trainer::Trainer(TrainConfig cfg, Communicator& comm, at::Tensor images, at::Tensor labels)
    : cfg_(std::move(cfg)), comm_(comm), family_(family_of(cfg_)) {
  for (auto [key, sc] : {std::pair{"generator", &cfg_.g_sharding}, std::pair{"discriminator", &cfg_.d_sharding}}) {
    if (sc->compute_dtype == at::kHalf && !cfg_.compute_device.is_cuda()) {
      throw ConfigError(cfg_.source + ": sharding." + key + ".compute_dtype=float16 needs a GPU: "
                        "LibTorch's CPU build has no float16 convolution or matmul. Use bfloat16 "
                        "on CPUs (no loss scaling needed), or run.device=cuda");
    }
  }
  // The groups first (split placement: a rank holds G or D), then the data, which fails
  // early on a missing dataset, then the models. A rank reads real images only when it
  // holds D, or, with paired data, G's input images A (and B, the target of G's L1 term);
  // the counters of the real batches come from D's ranks.
  models_ = std::make_unique<ModelSet>(cfg_, comm_, family_);
  Communicator& batch_comm = models_->batch_comm();
  data_ = std::make_unique<DataPipeline>(cfg_, family_, batch_comm.rank(), batch_comm.world_size(),
                                         models_->holds_discriminator() || family_.condition_channels() > 0,
                                         comm_.rank() == 0, std::move(images), std::move(labels));
  for (OptimizerConfig* oc : {&cfg_.g_optim, &cfg_.d_optim}) {
    if (oc->offload.optimizer != OffloadDevice::kDisk || !oc->offload.path.empty()) continue;
    oc->offload.path = cfg_.run_dir + "/offload";  // the default; an explicit path must exist
    std::filesystem::create_directories(oc->offload.path);
  }
  models_->build();
  objective_ = std::make_unique<GanObjective>(cfg_.loss, cfg_.d_steps, cfg_.micro_batches, cfg_.grad_clip, comm_,
                                              cfg_.r1_gamma, cfg_.r1_every);
  objective_->set_d_joint_pass(cfg_.d_joint_pass);
  objective_->set_simultaneous(cfg_.update == "simultaneous");
  objective_->set_shared_d_forward(cfg_.shared_d_forward);
  objective_->set_paired(family_.condition_channels() > 0, cfg_.l1_weight, cfg_.adversarial_weight);
  objective_->set_aux_class_weight(cfg_.aux_class_weight);
  objective_->set_separate_regularization(family_.separate_regularization());
  objective_->set_path_length({cfg_.pl_weight, cfg_.pl_every, cfg_.pl_batch_shrink, cfg_.pl_decay});
  if (cfg_.augment.enabled()) {  // ADA: every image D sees is augmented
    augment_ = std::make_unique<AdaptiveAugment>(cfg_.augment, cfg_.seed, cfg_.global_batch);
    objective_->set_augment(augment_.get());
  }
  if (SplitPlacement* split = models_->split_placement()) {
    executor_ = std::make_unique<SplitStepExecutor>(*objective_, *split);  // collective: the schedule check
  } else {
    executor_ = std::make_unique<SharedStepExecutor>(*objective_);
  }
  if (cfg_.preempt_grace_s > 0) {
    if (SplitPlacement* split = models_->split_placement()) {
      split->set_before_transfer([this] { grace_vote(); });
    } else {
      for (ShardedModel* m : models_->held()) m->set_unit_hook([this] { grace_vote(); });
    }
    objective_->set_before_update([this] { before_first_update(); });
  }
  periodic_ = std::make_unique<PeriodicActions>(cfg_, comm_);
  // Evaluation generates images: G's ranks (split) or every rank.
  if (cfg_.eval_enabled && models_->holds_generator()) {
    evaluator_ = std::make_unique<Evaluator>(cfg_, batch_comm, family_);
  }
  fixed_inputs_ = fixed_sample_inputs(cfg_, &sample_nrow_);
  ckpt_ = std::make_unique<CheckpointManager>(
      cfg_, comm_, counters_,
      CheckpointManager::Source{[this] { fill_counters(); }, [this] { return models_->checkpoint_models(); },
                                [this] { return data_->pause_reads(); }});
}

Trainer::~Trainer() {
  // Explicit order. A checkpoint write in flight (which no longer reads the models)
  // finishes first. The evaluator, periodic actions, executor and objective refer to the
  // models; the model set destroys its EMA, models, optimizers and groups in its own order
  // (model_set.h); the data loader's read-ahead thread stops before the dataset it reads.
  ckpt_.reset();
  evaluator_.reset();
  periodic_.reset();
  executor_.reset();
  objective_.reset();
  models_.reset();
  data_.reset();
}

ShardedModel& Trainer::generator() {
  if (ShardedModel* g = models_->generator()) return *g;
  throw std::logic_error("Trainer::generator: this rank holds D under split placement, not G");
}

ShardedModel& Trainer::discriminator() {
  if (ShardedModel* d = models_->discriminator()) return *d;
  throw std::logic_error("Trainer::discriminator: this rank holds G under split placement, not D");
}

StepMetrics Trainer::train_step() {
  StepMetrics r = run_step();
  if (executor_->defers_figures()) {
    executor_->post_figures(r);
    r = executor_->finish_figures();
  }
  check_nonfinite(r);
  return r;
}

StepMetrics Trainer::run_step() {
  const auto t0 = std::chrono::steady_clock::now();
  step_t0_ = t0;
  if (cfg_.preempt_grace_s > 0) capture_step_start();
  StepInputs in;
  in.real = [this](int64_t micro) { return data_->real_micro(micro, counters_); };
  in.latents = [this] { return data_->draw_latents(); };
  in.local = [this](const at::Tensor& t, int64_t micro) { return data_->local_micro(t, micro); };
  in.normal = [this](at::IntArrayRef sizes, at::ScalarType dtype) { return data_->draw_normal(sizes, dtype); };
  in.step = counters_.step;
  const ModelSetTimes before = models_->times();
  const ModelSetCommBytes bytes_before = models_->comm_bytes();
  struct rusage ru0 {};
  getrusage(RUSAGE_SELF, &ru0);
  StepMetrics r = executor_->step(models_->generator_side(), models_->discriminator_side(), in);
  abandonable_ = false;
  finish_grace_vote();  // normally none is left: the first update read the last one
  const ModelSetTimes after = models_->times();
  r.time_collective_s = after.collective_s - before.collective_s;
  r.time_offload_read_s = after.offload_read_s - before.offload_read_s;
  r.time_optimizer_s = after.optimizer_s - before.optimizer_s;
  r.time_optimizer_io_s = after.optimizer_io_s - before.optimizer_io_s;
  r.time_offload_grad_s = after.offload_grad_s - before.offload_grad_s;
  const ModelSetCommBytes bytes_after = models_->comm_bytes();
  r.comm_bytes_world = bytes_after.world - bytes_before.world;
  r.comm_bytes_shard_group = bytes_after.shard_group - bytes_before.shard_group;
  r.comm_bytes_replicate = bytes_after.replicate - bytes_before.replicate;
  r.comm_bytes_secondary = bytes_after.secondary - bytes_before.secondary;
  if (augment_) {  // ADA's heuristic, from the step's signs over every rank: the same p everywhere
    augment_->after_step(counters_.step + 1, r.real_signs, r.real_logits);
    r.ada_p = augment_->p();
    r.ada_rt = augment_->last_rt();
  }
  // Numbered by training steps, 1-based (StyleGAN2's G reg is a second G optimizer step).
  if (ShardedEma* ema = models_->ema(); ema && !r.skipped_g) ema->update(counters_.step + 1);
  ++counters_.step;
  r.step = counters_.step;
  // Split placement: the waits for step figures since the last step (Trainer::run) count too.
  r.step_time_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() + figures_wait_s_;
  figures_wait_s_ = 0;
  last_step_s_ = r.step_time_s;
  struct rusage ru1 {};
  getrusage(RUSAGE_SELF, &ru1);
  auto secs = [](const timeval& a, const timeval& b) { return (b.tv_sec - a.tv_sec) + 1e-6 * (b.tv_usec - a.tv_usec); };
  r.minor_faults = ru1.ru_minflt - ru0.ru_minflt;
  r.system_s = secs(ru0.ru_stime, ru1.ru_stime);
  r.user_s = secs(ru0.ru_utime, ru1.ru_utime);
  r.device_mem_used_bytes = device_memory_used_bytes();
  r.device_mem_peak_allocated_bytes = take_device_peak_allocated_bytes();
  return r;
}

void Trainer::await_generator_ranks(const char* what) {
  if (!models_->split()) return;
  const double t = comm_.timeout_s();
  comm_.set_timeout_s(t + cfg_.eval_timeout_s);
  try {
    comm_.barrier();
  } catch (const CollectiveTimeout& e) {
    comm_.set_timeout_s(t);
    throw CollectiveTimeout(std::string(e.what()) + " (rank " + std::to_string(comm_.rank()) + ", waiting for G's ranks " +
                            "to finish " + what + " under split placement: raise eval.timeout_s, now " +
                            fmt::format("{}", cfg_.eval_timeout_s) + " s beyond dist.timeout_s)");
  }
  comm_.set_timeout_s(t);
}

void Trainer::check_nonfinite(StepMetrics& r) {
  if (!r.nonfinite_d && !r.nonfinite_g) {
    nonfinite_in_a_row_ = 0;
    r.nonfinite_steps = nonfinite_steps_;
    return;
  }
  r.nonfinite_steps = ++nonfinite_steps_;
  ++nonfinite_in_a_row_;
  const std::string which = r.nonfinite_d && r.nonfinite_g ? "discriminator and the generator"
                            : r.nonfinite_d ? "discriminator" : "generator";
  const std::string what = "step " + std::to_string(r.step) + ": a NaN or Inf in the " + which +
                           "'s loss or gradients (all ranks agreed)";
  const std::string hint = ". HINT: lower the learning rate, set train.grad_clip, or resume from an earlier checkpoint";
  if (cfg_.on_nonfinite == "abort") throw NonFiniteError(what + "; train.on_nonfinite is abort" + hint);
  if (nonfinite_in_a_row_ > cfg_.max_nonfinite_steps) {
    throw NonFiniteError(what + "; that is " + std::to_string(nonfinite_in_a_row_) +
                         " such steps in a row, more than train.max_nonfinite_steps = " +
                         std::to_string(cfg_.max_nonfinite_steps) + hint);
  }
  if (comm_.rank() == 0) {
    spdlog::warn("{}: skipped the update, parameters and optimizer state untouched ({} in a row, {} in this run)",
                 what, nonfinite_in_a_row_, nonfinite_steps_);
  }
}

std::string Trainer::write_samples() {
  ShardedModel* g = models_->generator();
  if (!g) return {};  // split placement: G's ranks write them
  // Test-only (split_eval_wait): a sample grid that takes longer than dist.timeout_s.
  if (test_control("slow_samples")) std::this_thread::sleep_for(std::chrono::duration<double>(1.5 * cfg_.timeout_s));
  return periodic_->write_samples(*g, models_->ema(), fixed_inputs_, counters_.step, sample_nrow_);
}

void Trainer::fill_counters() {
  if (SplitPlacement* split = models_->split_placement()) {  // collective: D's ranks count the real batches
    at::Tensor pos = torch::tensor({counters_.epoch, counters_.batch_in_epoch}, torch::kLong);
    comm_.broadcast(pos, split->generator_ranks());
    counters_.epoch = pos[0].item<int64_t>();
    counters_.batch_in_epoch = pos[1].item<int64_t>();
  }
  counters_.noise_rng_state = data_->noise_state();
  models_->put_scaler_state(counters_.scalars);
  counters_.scalars["nonfinite_steps"] = static_cast<double>(nonfinite_steps_);
  counters_.scalars["nonfinite_in_a_row"] = static_cast<double>(nonfinite_in_a_row_);
  counters_.scalars["pl_mean"] = objective_->pl_mean();  // path length's running mean (exact: a float32 or double)
  if (augment_) augment_->put_state(counters_.scalars);  // ADA's p and its sums since the last adjustment
}

std::string Trainer::save() { return ckpt_->save(); }

std::string Trainer::save_async() { return ckpt_->save_async(); }

void Trainer::resume(const std::string& path) {
  load_resolved(agree_checkpoint_dir(path, comm_, /*none_is_fresh=*/false));
}

void Trainer::load_resolved(const std::string& dir) {
  load_checkpoint(dir, counters_, models_->checkpoint_models(), comm_);
  models_->load_scaler_state(counters_.scalars);
  // Control "resume_skips_noise_rng": the latents after a resume come from the generator's
  // state at start-up, not the checkpoint's (benchmarks/chaos.py's resumes must then differ:
  // ctest chaos_smoke_control).
  if (!test_control("resume_skips_noise_rng")) data_->set_noise_state(counters_.noise_rng_state);
  auto scalar = [&](const char* k) {
    auto it = counters_.scalars.find(k);
    return it == counters_.scalars.end() ? int64_t{0} : static_cast<int64_t>(it->second);
  };
  nonfinite_steps_ = scalar("nonfinite_steps");
  nonfinite_in_a_row_ = scalar("nonfinite_in_a_row");
  const auto pl = counters_.scalars.find("pl_mean");  // absent in checkpoints of runs without it: 0
  objective_->set_pl_mean(pl == counters_.scalars.end() ? 0.0 : pl->second);
  if (augment_) augment_->load_state(counters_.scalars);
  data_->restart(counters_.epoch, counters_.batch_in_epoch);
  if (comm_.rank() == 0) spdlog::info("resumed from {} at step {}", dir, counters_.step);
}

bool Trainer::resume_auto() {
  const std::string dir = agree_checkpoint_dir(cfg_.run_dir, comm_, /*none_is_fresh=*/true);
  if (dir.empty()) {  // nothing committed there (as rank 0 sees it): a first start on every rank
    if (comm_.rank() == 0) spdlog::info("--resume auto: no committed checkpoint under {}; starting fresh", cfg_.run_dir);
    return false;
  }
  load_resolved(dir);
  return true;
}

nlohmann::json Trainer::evaluate() {
  if (!cfg_.eval_enabled) throw ConfigError(cfg_.source + ": evaluate() needs eval.enabled: true");
  if (!evaluator_) return nlohmann::json::object();  // split placement: G's ranks evaluate
  nlohmann::json j = {{"step", counters_.step}};
  double time_s = 0;
  // Keys: fid, class_acc, l1, psnr, ssim, class_fractions, each with `suffix`: "" for G,
  // "_ema" for its EMA, then "_trunc" for the same model on truncated latents.
  auto record = [&](const std::string& suffix, double truncation) {
    const EvalResult r = evaluator_->evaluate(generator(), false, truncation);
    put_scores(j, r, suffix);
    j["eval_samples"] = r.samples;
    time_s += r.time_s;
  };
  auto untruncated_and_truncated = [&](const std::string& suffix) {
    record(suffix, 0);
    if (cfg_.eval_truncation > 0) record(suffix + "_trunc", cfg_.eval_truncation);
  };
  untruncated_and_truncated("");
  if (ShardedEma* ema = models_->ema()) {
    EmaSwap swap(*ema);
    untruncated_and_truncated("_ema");
  }
  if (cfg_.eval_truncation > 0) j["truncation"] = cfg_.eval_truncation;
  j["eval_time_s"] = time_s;
  periodic_->log_eval(j);
  return j;
}

void Trainer::run(const nlohmann::json& preflight) {
  const auto t_start = std::chrono::steady_clock::now();
  const int64_t first_step = counters_.step;
  std::filesystem::create_directories(cfg_.run_dir);
  if (comm_.rank() == 0) {
    const MemoryStats mg = models_->generator_stats(), md = models_->discriminator_stats();
    spdlog::info("model {}: G {} parameters, D {} parameters", family_.arch(), models_->generator_numel(),
                 models_->discriminator_numel());
    spdlog::info("world size {}, backend {}, G stage {} ({} param-shard bytes), D stage {} ({} param-shard bytes)",
                 comm_.world_size(), comm_.backend(), cfg_.g_sharding.stage,
                 mg.param_shard_bytes, cfg_.d_sharding.stage, md.param_shard_bytes);
    spdlog::info("model-state bytes per rank: G {}  D {}", mg.model_state_bytes(), md.model_state_bytes());
  }
  ProgressLine::enable(comm_.rank() == 0 && stdout_is_terminal());
  RunSummary summary;
  std::string last_ckpt, last_samples;
  double avg_step_s = 0;
  bool saved = false, evaluated = false;  // at the last step run
  // One step's metrics once complete: the NaN/Inf verdict, the progress line, the log.
  auto complete = [&](StepMetrics& m) {
    check_nonfinite(m);
    avg_step_s = avg_step_s == 0 ? m.step_time_s : 0.9 * avg_step_s + 0.1 * m.step_time_s;
    ProgressLine::show(progress_text(m, cfg_.steps, cfg_.global_batch, avg_step_s, summary));
    if (periodic_->log_due(m.step)) {
      periodic_->log_step(m, models_->generator_stats().model_state_bytes(),
                          models_->discriminator_stats().model_state_bytes());
    }
  };
  // Split placement: completes the oldest step whose figures are in flight, and takes its
  // votes (the preemption signal, the time limit).
  auto finish_figures = [&](int& sig, bool& time_up) {
    std::vector<double> votes;
    const auto t0 = std::chrono::steady_clock::now();
    StepMetrics done = executor_->finish_figures(&votes);
    figures_wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    complete(done);
    sig = std::max(sig, static_cast<int>(votes.at(0)));
    time_up = time_up || votes.at(1) > 0.5;
  };
  while (counters_.step < cfg_.steps) {
    StepMetrics m;
    try {
      m = run_step();
    } catch (...) {
      if (!abandoning_) throw;
      if (models_->split()) {  // the last finished step's figures first: its log row, its verdicts
        int sig = 0;
        bool time_up = false;
        while (executor_->figures_in_flight() > 0) finish_figures(sig, time_up);
      }
      abandon_step_and_save();
      return;
    }
    const int64_t step = m.step;
    ckpt_->check_write();  // a background write hung past dist.timeout_s ends the job now
    evaluated = cfg_.eval_enabled && cfg_.eval_every > 0 && step % cfg_.eval_every == 0 && step != cfg_.steps;
    const bool sampled = periodic_->sample_due(step);
    saved = periodic_->checkpoint_due(step);
    // Preemption: any rank's signal stops every rank after the same step.
    bool time_up = false;
    int sig = 0;
    auto elapsed_s = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count(); };
    if (!models_->split()) {
      complete(m);
    } else {
      // Split placement: this step's figures and votes are posted now and finished after
      // the next step (the previous step's now), unless something world-wide follows.
      executor_->post_figures(m, local_votes(elapsed_s()));
      const bool settle = !cfg_.defer_figures || evaluated || sampled || saved || step == cfg_.steps;
      while (executor_->figures_in_flight() > (settle ? 0u : 1u)) finish_figures(sig, time_up);
      if (sig != 0 || time_up) {
        while (executor_->figures_in_flight() > 0) finish_figures(sig, time_up);
      }
    }
    if (evaluated) summary.add_eval(evaluate());
    if (sampled) {
      last_samples = write_samples();
      if (comm_.rank() == 0 && cfg_.plots) write_plots(cfg_.run_dir);
    }
    if (evaluated || sampled) await_generator_ranks(evaluated ? "an evaluation" : "a sample grid");
    if (saved) {
      last_ckpt = save_async();  // synchronous unless checkpoint.async
      if (comm_.rank() == 0) spdlog::info("checkpoint {}", last_ckpt);
    }
    if (!models_->split()) sig = preemption_vote(elapsed_s(), time_up);
    if (sig != 0) {
      ckpt_->wait_for_write("preemption");
      if (!saved) last_ckpt = save();
      ProgressLine::finish();
      if (comm_.rank() == 0) {
        spdlog::warn("received {} (preemption): finished step {} on every rank and saved checkpoint {}; "
                     "exiting 0. Continue with --resume auto (or --resume {})",
                     sig == SIGTERM ? "SIGTERM" : sig == SIGUSR1 ? "SIGUSR1" : "signal " + std::to_string(sig),
                     counters_.step, last_ckpt, cfg_.run_dir);
      }
      return;
    }
    if (time_up) {
      if (comm_.rank() == 0) {
        spdlog::info("train.time_limit_s: {:.0f} s reached after step {} of {}; stopping there", cfg_.time_limit_s,
                     counters_.step, cfg_.steps);
      }
      break;
    }
  }
  // The peak of training itself, before the final evaluation, save and sample grid add theirs.
  const std::vector<int64_t> training_rss = gather_peak_rss(comm_);
  if (cfg_.eval_enabled && !evaluated) {
    summary.add_eval(evaluate());  // once, also at a time-limit stop
    await_generator_ranks("the final evaluation");
  }
  if (!saved && cfg_.final_checkpoint) {
    last_ckpt = save();  // waits for a background write in flight first
  } else {
    // The last step already saved (a time-limit stop at a periodic checkpoint), or
    // train.final_checkpoint is false: only a background write in flight is waited for.
    ckpt_->wait_for_write("end of run");
  }
  ckpt_->log_totals();
  last_samples = write_samples();
  await_generator_ranks("the final sample grid");
  ProgressLine::finish();
  const std::vector<int64_t> rss =
      report_memory(cfg_, comm_, models_->generator_stats(), models_->discriminator_stats(), preflight, training_rss);
  if (comm_.rank() == 0) {
    const bool plotted = cfg_.plots && write_plots(cfg_.run_dir);
    summary.steps_run = counters_.step - first_step;
    summary.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
    summary.log(cfg_, counters_.step, rss, last_samples, plotted, last_ckpt);
  }
}

}  // namespace shardgan
