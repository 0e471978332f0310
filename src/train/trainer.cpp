#include "shardgan/train/trainer.h"

#include <sys/resource.h>

#include <algorithm>
#include <array>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <thread>

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "shardgan/comm/hybrid_communicator.h"
#include "shardgan/device/device.h"
#include "shardgan/optim/factory.h"
#include "shardgan/optim/offloaded_adam.h"
#include "shardgan/sharding/deferred.h"
#include "shardgan/train/inference.h"
#include "train/model_groups.h"
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
  // Split placement: a rank holds G or D and reads real images only when it holds D, or,
  // with paired data, G's input images A (and B, the target of G's L1 term).
  const bool split = cfg_.placement == "split";
  const bool holds_g = split ? make_split_placement() : true, holds_d = !split || !holds_g;
  // G's ranks read no data unless paired; the counters of the real batches come from D's ranks.
  data_ = std::make_unique<DataPipeline>(cfg_, family_, group_comm_ ? group_comm_->rank() : comm_.rank(),
                                         group_comm_ ? group_comm_->world_size() : comm_.world_size(),
                                         holds_d || family_.condition_channels() > 0, comm_.rank() == 0,
                                         std::move(images), std::move(labels));
  // Deferred sharded initialization: each unit is built, initialized and sharded in turn.
  // SyncBatchNorm and the data stay on the world communicator (split: the group's); a
  // model shards over its own (the replica group's under HSDP, the group's under split).
  Communicator& batch_comm = group_comm_ ? *group_comm_ : comm_;
  // HSDP's replica groups and hpZ's secondary groups split the ranks a model runs on:
  // under split placement its group's (a collective over that group only, so each group
  // builds its own model's).
  if (holds_g) g_comm_ = hsdp_communicator(batch_comm, cfg_.g_replicate_degree, "generator", cfg_.source);
  if (holds_d) d_comm_ = hsdp_communicator(batch_comm, cfg_.d_replicate_degree, "discriminator", cfg_.source);
  if (holds_g) g_hpz_ = hpz_secondary_group(batch_comm, cfg_.g_sharding.hpz_partition_size, "generator", cfg_.source);
  if (holds_d) d_hpz_ = hpz_secondary_group(batch_comm, cfg_.d_sharding.hpz_partition_size, "discriminator", cfg_.source);
  for (OptimizerConfig* oc : {&cfg_.g_optim, &cfg_.d_optim}) {
    if (oc->offload.optimizer != OffloadDevice::kDisk || !oc->offload.path.empty()) continue;
    oc->offload.path = cfg_.run_dir + "/offload";  // the default; an explicit path must exist
    std::filesystem::create_directories(oc->offload.path);
  }
  if (holds_g) {
    std::tie(g_, opt_g_) = build_model_and_optimizer(family_.generator(batch_comm), g_comm(), cfg_.g_sharding,
                                                     cfg_.g_optim, cfg_.seed + 1);
  }
  if (holds_d) {
    std::tie(d_, opt_d_) = build_model_and_optimizer(family_.discriminator(batch_comm), d_comm(), cfg_.d_sharding,
                                                     cfg_.d_optim, cfg_.seed + 2);
  }
  if (g_ && g_hpz_) g_->set_secondary_group(g_hpz_.get());
  if (d_ && d_hpz_) d_->set_secondary_group(d_hpz_.get());
  at::Tensor numels = torch::tensor({g_ ? g_->numel() : 0, d_ ? d_->numel() : 0}, torch::kLong);
  if (split) comm_.all_reduce(numels, ReduceOp::kMax);
  g_numel_ = numels[0].item<int64_t>();
  d_numel_ = numels[1].item<int64_t>();
  auto compute = [&](const ShardingConfig& s) { return s.compute_dtype.value_or(cfg_.model_dtype); };
  scaler_g_ = std::make_unique<DynamicLossScaler>(cfg_.loss_scale, compute(cfg_.g_sharding));
  scaler_d_ = std::make_unique<DynamicLossScaler>(cfg_.loss_scale, compute(cfg_.d_sharding));
  if (cfg_.ema_enabled && g_) ema_ = std::make_unique<ShardedEma>(*g_, cfg_.ema);
  objective_ = std::make_unique<GanObjective>(cfg_.loss, cfg_.d_steps, cfg_.micro_batches, cfg_.grad_clip, comm_,
                                              cfg_.r1_gamma, cfg_.r1_every);
  objective_->set_d_joint_pass(cfg_.d_joint_pass);
  objective_->set_simultaneous(cfg_.update == "simultaneous");
  objective_->set_shared_d_forward(cfg_.shared_d_forward);
  objective_->set_paired(family_.condition_channels() > 0, cfg_.l1_weight, cfg_.adversarial_weight);
  objective_->set_aux_class_weight(cfg_.aux_class_weight);
  if (split_) {
    executor_ = std::make_unique<SplitStepExecutor>(*objective_, *split_);  // collective: the schedule check
  } else {
    executor_ = std::make_unique<SharedStepExecutor>(*objective_);
  }
  if (cfg_.preempt_grace_s > 0) {
    if (split_) {
      split_->set_before_transfer([this] { grace_vote(); });
    } else {
      g_->set_unit_hook([this] { grace_vote(); });
      d_->set_unit_hook([this] { grace_vote(); });
    }
    objective_->set_before_update([this] { abandonable_ = false; });
  }
  periodic_ = std::make_unique<PeriodicActions>(cfg_, comm_);
  // Evaluation generates images: G's ranks (split) or every rank.
  if (cfg_.eval_enabled && g_) evaluator_ = std::make_unique<Evaluator>(cfg_, batch_comm, family_);
  fixed_inputs_ = fixed_sample_inputs(cfg_, &sample_nrow_);
  ckpt_ = std::make_unique<CheckpointManager>(
      cfg_, comm_, counters_,
      CheckpointManager::Source{[this] { fill_counters(); }, [this] { return checkpoint_models(); },
                                [this] { return data_->pause_reads(); }});
}

Trainer::~Trainer() {
  // Explicit order (issue 22). The evaluator, periodic actions, objective and EMA refer to
  // the models and optimizers. The models go before the optimizers: with parameter offload
  // their units read the master shards from the optimizer (ShardSource), so the source
  // must outlive them; an optimizer's destructor does not touch its model. The data
  // loader's read-ahead thread stops before the dataset it reads. A checkpoint write in
  // flight (which no longer reads the models) finishes first.
  ckpt_.reset();
  evaluator_.reset();
  periodic_.reset();
  executor_.reset();
  objective_.reset();
  ema_.reset();
  g_.reset();
  d_.reset();
  opt_g_.reset();
  opt_d_.reset();
  data_.reset();
}

bool Trainer::make_split_placement() {
  const int n = comm_.world_size();
  const std::string where = cfg_.source + ": train.placement split on " + std::to_string(n) + " ranks: ";
  if (n < 2) throw ConfigError(where + "needs at least 2 ranks (one for G, one for D); use train.placement: shared");
  const int k = split_generator_ranks(cfg_, n);
  if (k >= n) {
    throw ConfigError(where + "placement.generator_ranks = " + fmt::format("{}", cfg_.generator_ranks) +
                      " leaves no rank for D; give G 1 to " + std::to_string(n - 1) + " ranks");
  }
  const int64_t micro = cfg_.global_batch / cfg_.micro_batches;
  if (micro % k != 0 || micro % (n - k) != 0) {
    throw ConfigError(where + "each micro-batch of " + std::to_string(micro) + " images (train.global_batch / " +
                      "train.micro_batches) must divide among G's " + std::to_string(k) + " ranks and D's " +
                      std::to_string(n - k) + " (set placement.generator_ranks or train.global_batch)");
  }
  check_split_group_divisors(cfg_, n, k);  // on every rank, before only a group's ranks split it
  const bool holds_g = comm_.rank() < k;
  group_comm_ = comm_.split(holds_g ? 0 : 1, comm_.rank());
  const ImageShape shape = family_.image_shape();
  split_ = std::make_unique<SplitPlacement>(comm_, *group_comm_, k, micro,
                                            std::vector<int64_t>{shape.channels, shape.height, shape.width},
                                            cfg_.g_sharding.compute_dtype.value_or(cfg_.model_dtype));
  if (comm_.rank() == 0) {
    spdlog::info("split placement: G on ranks 0-{}, D on ranks {}-{}; {} images and their gradients cross per "
                 "micro-batch", k - 1, k, n - 1, micro);
  }
  return holds_g;
}

std::pair<std::unique_ptr<ShardedModel>, std::unique_ptr<ShardedOptimizer>> Trainer::build_model_and_optimizer(
    const ModelSpec& spec, Communicator& comm, const ShardingConfig& sc, const OptimizerConfig& oc, uint64_t seed) {
  if (oc.offload.param == OffloadDevice::kNone) {
    auto model = build_sharded_model(spec, comm, sc, seed, cfg_.model_dtype, cfg_.compute_device);
    auto opt = make_optimizer(*model, oc);
    return {std::move(model), std::move(opt)};
  }
  // Parameter offload: the optimizer's store first, then each unit's master shard into it
  // as the unit is built, so that a rank never holds all its master shards at once (they
  // are the size of the state offload exists to keep out of RAM).
  auto model = std::make_unique<ShardedModel>(spec.name, comm, sc);
  auto opt = std::make_unique<OffloadedAdam>(*model, adam_config(oc), oc.offload,
                                             unit_shard_numels(spec, comm.world_size(), sc.stage), cfg_.model_dtype);
  opt->set_schedule(LrSchedule(oc.lr, oc.schedule));
  populate_sharded_model(*model, spec, seed, cfg_.model_dtype, cfg_.compute_device,
                         [&](ShardedUnit& u) { opt->adopt_unit(u); });
  return {std::move(model), std::move(opt)};
}

std::array<int64_t, 4> Trainer::comm_bytes() {
  auto bytes = [](const CommStats& s) {
    return s.all_gather_bytes + s.reduce_scatter_bytes + s.all_reduce_bytes + s.broadcast_bytes + s.all_to_all_bytes;
  };
  std::array<int64_t, 4> b{bytes(comm_.stats()), 0, 0, 0};
  for (Communicator* c : {g_comm_.get(), d_comm_.get()}) {
    if (!c) continue;
    auto& h = static_cast<HybridCommunicator&>(*c);
    b[1] += bytes(h.stats());
    b[2] += bytes(h.replicate_group().stats());
  }
  for (Communicator* c : {g_hpz_.get(), d_hpz_.get()}) {
    if (c) b[3] += bytes(c->stats());
  }
  return b;
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
  auto times = [this] {
    std::array<double, 5> t{};
    for (auto [m, o] : {std::pair{g_.get(), opt_g_.get()}, std::pair{d_.get(), opt_d_.get()}}) {
      if (!m) continue;  // split placement: the other group's model
      const CommTimes& c = m->comm_times();
      t[0] += c.collective_s;
      t[1] += c.offload_read_s;
      t[2] += o->update_seconds();
      t[3] += o->update_io_seconds();
      t[4] += c.offload_grad_s;
    }
    return t;
  };
  const std::array<double, 5> before = times();
  const std::array<int64_t, 4> bytes_before = comm_bytes();
  struct rusage ru0 {};
  getrusage(RUSAGE_SELF, &ru0);
  StepMetrics r = executor_->step({g_.get(), opt_g_.get(), scaler_g_.get()},
                                  {d_.get(), opt_d_.get(), scaler_d_.get()}, in);
  abandonable_ = false;
  const std::array<double, 5> after = times();
  r.time_collective_s = after[0] - before[0];
  r.time_offload_read_s = after[1] - before[1];
  r.time_optimizer_s = after[2] - before[2];
  r.time_optimizer_io_s = after[3] - before[3];
  r.time_offload_grad_s = after[4] - before[4];
  const std::array<int64_t, 4> bytes_after = comm_bytes();
  r.comm_bytes_world = bytes_after[0] - bytes_before[0];
  r.comm_bytes_shard_group = bytes_after[1] - bytes_before[1];
  r.comm_bytes_replicate = bytes_after[2] - bytes_before[2];
  r.comm_bytes_secondary = bytes_after[3] - bytes_before[3];
  if (ema_ && !r.skipped_g) ema_->update(opt_g_->step_count());
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
  if (!split_) return;
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

MemoryStats Trainer::memory_stats(ShardedModel& m) const {
  MemoryStats s = m.memory_stats();
  ShardedOptimizer& o = *(&m == g_.get() ? opt_g_ : opt_d_);
  s.optimizer_state_bytes = o.state_bytes();
  s.offloaded_bytes = o.offloaded_bytes();
  return s;
}

std::string Trainer::write_samples() {
  if (!g_) return {};  // split placement: G's ranks write them
  // Test-only (split_eval_wait): a sample grid that takes longer than dist.timeout_s.
  if (test_control("slow_samples")) std::this_thread::sleep_for(std::chrono::duration<double>(1.5 * cfg_.timeout_s));
  return periodic_->write_samples(*g_, ema_.get(), fixed_inputs_, counters_.step, sample_nrow_);
}

std::vector<ModelAndOptimizer> Trainer::checkpoint_models() {
  // Split placement: a rank passes the model it holds, led by its group's lowest rank.
  const int d_leader = split_ ? split_->generator_ranks() : 0;
  std::vector<ModelAndOptimizer> out;
  if (g_) {
    ModelAndOptimizer g{g_.get(), opt_g_.get()};
    if (ema_) g.extra.push_back({"ema", [this](size_t i) { return ema_->unit_shard(i); }});
    out.push_back(std::move(g));
  }
  if (d_) out.push_back({d_.get(), opt_d_.get(), {}, d_leader});
  return out;
}

void Trainer::fill_counters() {
  if (split_) {  // collective: the real batches' position is counted by D's ranks
    at::Tensor pos = torch::tensor({counters_.epoch, counters_.batch_in_epoch}, torch::kLong);
    comm_.broadcast(pos, split_->generator_ranks());
    counters_.epoch = pos[0].item<int64_t>();
    counters_.batch_in_epoch = pos[1].item<int64_t>();
  }
  counters_.noise_rng_state = data_->noise_state();
  for (auto& [k, v] : scaler_g_->state()) counters_.scalars["g." + k] = v;
  for (auto& [k, v] : scaler_d_->state()) counters_.scalars["d." + k] = v;
  counters_.scalars["nonfinite_steps"] = static_cast<double>(nonfinite_steps_);
  counters_.scalars["nonfinite_in_a_row"] = static_cast<double>(nonfinite_in_a_row_);
}

std::string Trainer::save() { return ckpt_->save(); }

std::string Trainer::save_async() { return ckpt_->save_async(); }

void Trainer::resume(const std::string& path) {
  load_resolved(agree_checkpoint_dir(path, comm_, /*none_is_fresh=*/false));
}

void Trainer::load_resolved(const std::string& dir) {
  load_checkpoint(dir, counters_, checkpoint_models(), comm_);
  for (auto [prefix, scaler] : {std::pair{"g.", scaler_g_.get()}, std::pair{"d.", scaler_d_.get()}}) {
    std::vector<std::pair<std::string, double>> st;
    for (auto& [k, v] : counters_.scalars) {
      if (k.rfind(prefix, 0) == 0) st.emplace_back(k.substr(2), v);
    }
    scaler->load_state(st);
  }
  data_->set_noise_state(counters_.noise_rng_state);
  auto scalar = [&](const char* k) {
    auto it = counters_.scalars.find(k);
    return it == counters_.scalars.end() ? int64_t{0} : static_cast<int64_t>(it->second);
  };
  nonfinite_steps_ = scalar("nonfinite_steps");
  nonfinite_in_a_row_ = scalar("nonfinite_in_a_row");
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
    const EvalResult r = evaluator_->evaluate(*g_, false, truncation);
    put_scores(j, r, suffix);
    j["eval_samples"] = r.samples;
    time_s += r.time_s;
  };
  auto untruncated_and_truncated = [&](const std::string& suffix) {
    record(suffix, 0);
    if (cfg_.eval_truncation > 0) record(suffix + "_trunc", cfg_.eval_truncation);
  };
  untruncated_and_truncated("");
  if (ema_) {
    EmaSwap swap(*ema_);
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
    auto mg = stats_of(g_), md = stats_of(d_);
    spdlog::info("model {}: G {} parameters, D {} parameters", family_.arch(), g_numel_, d_numel_);
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
      periodic_->log_step(m, stats_of(g_).model_state_bytes(), stats_of(d_).model_state_bytes());
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
      if (split_) {  // the last finished step's figures first: its log row, its verdicts
        int sig = 0;
        bool time_up = false;
        while (executor_->figures_in_flight() > 0) finish_figures(sig, time_up);
      }
      abandon_step_and_save();
      return;
    }
    const int64_t step = m.step;
    evaluated = cfg_.eval_enabled && cfg_.eval_every > 0 && step % cfg_.eval_every == 0 && step != cfg_.steps;
    const bool sampled = periodic_->sample_due(step);
    saved = periodic_->checkpoint_due(step);
    // Preemption: any rank's signal stops every rank after the same step.
    bool time_up = false;
    int sig = 0;
    auto elapsed_s = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count(); };
    if (!split_) {
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
    if (!split_) sig = preemption_vote(elapsed_s(), time_up);
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
      report_memory(cfg_, comm_, stats_of(g_), stats_of(d_), preflight, training_rss);
  if (comm_.rank() == 0) {
    const bool plotted = cfg_.plots && write_plots(cfg_.run_dir);
    summary.steps_run = counters_.step - first_step;
    summary.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
    summary.log(cfg_, counters_.step, rss, last_samples, plotted, last_ckpt);
  }
}

}  // namespace shardgan
