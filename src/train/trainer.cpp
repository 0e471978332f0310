#include "shardgan/train/trainer.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "shardgan/optim/clip_grad.h"
#include "shardgan/optim/factory.h"
#include "shardgan/train/dcgan.h"
#include "shardgan/train/image_grid.h"

namespace shardgan {
namespace F = torch::nn::functional;

Trainer::Trainer(TrainConfig cfg, Communicator& comm, at::Tensor images)
    : cfg_(std::move(cfg)), comm_(comm), images_(std::move(images)) {
  for (auto [key, sc] : {std::pair{"generator", &cfg_.g_sharding}, std::pair{"discriminator", &cfg_.d_sharding}}) {
    if (sc->compute_dtype == at::kHalf && comm_.backend() == "mpi") {
      throw ConfigError(cfg_.source + ": sharding." + key + ".compute_dtype=float16 needs a GPU: "
                        "LibTorch's CPU build has no float16 convolution or matmul. Use bfloat16 "
                        "on CPUs (no loss scaling needed), or dist.backend=nccl");
    }
  }
  if (!images_.defined()) {
    images_ = cfg_.data_source == "synthetic"
                  ? make_synthetic_images(cfg_.synthetic_size, cfg_.seed + 17, cfg_.model.dtype)
                  : load_fashion_mnist(cfg_.data_path, cfg_.model.dtype);
  }
  sampler_ = std::make_unique<DistributedSampler>(images_.size(0), cfg_.global_batch,
                                                  comm_.rank(), comm_.world_size(), cfg_.seed,
                                                  cfg_.micro_batches);
  g_ = build_generator(cfg_.model, comm_, cfg_.g_sharding, cfg_.seed + 1);
  d_ = build_discriminator(cfg_.model, comm_, cfg_.d_sharding, cfg_.seed + 2);
  opt_g_ = make_optimizer(*g_, cfg_.g_optim);
  opt_d_ = make_optimizer(*d_, cfg_.d_optim);
  auto compute = [&](const ShardingConfig& s) { return s.compute_dtype.value_or(cfg_.model.dtype); };
  scaler_g_ = std::make_unique<DynamicLossScaler>(cfg_.loss_scale, compute(cfg_.g_sharding));
  scaler_d_ = std::make_unique<DynamicLossScaler>(cfg_.loss_scale, compute(cfg_.d_sharding));
  if (cfg_.ema_enabled) ema_ = std::make_unique<ShardedEma>(*g_, cfg_.ema);
  noise_gen_ = at::detail::createCPUGenerator(cfg_.seed + 3);
  auto fixed_gen = at::detail::createCPUGenerator(cfg_.seed + 4);
  fixed_z_ = at::randn({64, cfg_.model.z_dim, 1, 1}, fixed_gen,
                       torch::TensorOptions().dtype(cfg_.model.dtype));
}

Trainer::~Trainer() = default;

at::Tensor Trainer::draw_noise() {
  // Every rank draws the whole global batch and keeps its slices, so the latents do not
  // depend on the world size (required for parity with the one-rank reference).
  return at::randn({cfg_.global_batch, cfg_.model.z_dim, 1, 1}, noise_gen_,
                   torch::TensorOptions().dtype(cfg_.model.dtype));
}

at::Tensor Trainer::local_micro(const at::Tensor& global, int64_t micro) const {
  const int64_t per_micro = cfg_.global_batch / cfg_.micro_batches;
  const int64_t local = per_micro / comm_.world_size();
  return global.narrow(0, micro * per_micro + comm_.rank() * local, local).contiguous();
}

StepMetrics Trainer::train_step() {
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t k = cfg_.micro_batches;
  const int64_t epoch = counters_.epoch, batch = counters_.batch_in_epoch;
  if (++counters_.batch_in_epoch == sampler_->batches_per_epoch()) {
    counters_.batch_in_epoch = 0;
    ++counters_.epoch;
  }
  const at::ScalarType md = cfg_.model.dtype;
  at::Tensor stats = torch::zeros({4}, torch::kDouble);  // loss_d, loss_g, D(x), D(G(z))

  // D step over k micro-batches; the loss is divided by k so that the accumulated
  // gradient equals the one of the whole global batch. G runs without autograd, so G gets
  // no gradients.
  at::Tensor z_d = draw_noise();
  for (int64_t j = 0; j < k; ++j) {
    d_->set_gradient_sync(j == k - 1);
    at::Tensor real = images_.index_select(0, sampler_->indices(epoch, batch, j));
    at::Tensor fake;
    {
      torch::NoGradGuard no_grad;
      fake = g_->forward(local_micro(z_d, j));
    }
    at::Tensor d_real = d_->forward(real).view(-1).to(md);
    at::Tensor d_fake = d_->forward(fake).view(-1).to(md);
    at::Tensor loss_d = (F::softplus(-d_real).mean() + F::softplus(d_fake).mean()) / k;
    scaler_d_->scale_loss(loss_d).backward();
    stats[0] += loss_d.detach().to(at::kDouble);
    stats[2] += torch::sigmoid(d_real.detach()).mean().to(at::kDouble) / k;
    stats[3] += torch::sigmoid(d_fake.detach()).mean().to(at::kDouble) / k;
  }
  StepMetrics r;
  r.skipped_d = !finish_step(*d_, *opt_d_, *scaler_d_, r.grad_norm_d);

  // G step: D is frozen; it is gathered for forward and backward but yields input
  // gradients only (no D parameter gradients, no D reduce-scatter).
  d_->set_requires_grad(false);
  at::Tensor z_g = draw_noise();
  for (int64_t j = 0; j < k; ++j) {
    g_->set_gradient_sync(j == k - 1);
    at::Tensor out = d_->forward(g_->forward(local_micro(z_g, j))).view(-1).to(md);
    at::Tensor loss_g = F::softplus(-out).mean() / k;
    scaler_g_->scale_loss(loss_g).backward();
    stats[1] += loss_g.detach().to(at::kDouble);
  }
  d_->set_requires_grad(true);
  r.skipped_g = !finish_step(*g_, *opt_g_, *scaler_g_, r.grad_norm_g);
  if (ema_) ema_->update(opt_g_->step_count());
  ++counters_.step;
  r.loss_scale_d = scaler_d_->scale();
  r.loss_scale_g = scaler_g_->scale();

  comm_.all_reduce(stats, ReduceOp::kAvg);
  r.step = counters_.step;
  r.loss_d = stats[0].item<double>();
  r.loss_g = stats[1].item<double>();
  r.d_real = stats[2].item<double>();
  r.d_fake = stats[3].item<double>();
  r.step_time_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

bool Trainer::finish_step(ShardedModel& m, ShardedOptimizer& opt, DynamicLossScaler& scaler,
                          double& norm) {
  bool ok = scaler.unscale_and_vote({&m}, comm_);  // float16 only; else no collective
  if (ok && cfg_.grad_clip > 0) {
    ClipResult c = clip_grad_norm({&m}, cfg_.grad_clip, comm_);
    norm = c.total_norm;
    if (!c.finite) {
      ok = false;
      if (comm_.rank() == 0) {
        spdlog::warn("step {}: {} gradient norm is {}; skipping its optimizer step",
                     counters_.step + 1, m.name(), c.total_norm);
      }
    }
  }
  if (ok) {
    opt.step();
    m.after_optimizer_step();
  }
  m.zero_grad();
  return ok;
}

MemoryStats Trainer::memory_stats(ShardedModel& m) const {
  MemoryStats s = m.memory_stats();
  s.optimizer_state_bytes = (&m == g_.get() ? opt_g_ : opt_d_)->state_bytes();
  return s;
}

void Trainer::log_step(const StepMetrics& m) {
  if (comm_.rank() != 0) return;
  const double sps = cfg_.global_batch / std::max(m.step_time_s, 1e-9);
  spdlog::info("step {:>6}/{}  loss_d {:.4f}  loss_g {:.4f}  D(x) {:.3f}  D(G(z)) {:.3f}  {:.3f} s/step  {:.0f} img/s",
               m.step, cfg_.steps, m.loss_d, m.loss_g, m.d_real, m.d_fake, m.step_time_s, sps);
  nlohmann::json j = {{"step", m.step},       {"loss_d", m.loss_d},
                      {"loss_g", m.loss_g},   {"d_real", m.d_real},
                      {"d_fake", m.d_fake},   {"step_time_s", m.step_time_s},
                      {"images_per_s", sps},  {"world_size", comm_.world_size()},
                      {"g_model_state_bytes", memory_stats(*g_).model_state_bytes()},
                      {"d_model_state_bytes", memory_stats(*d_).model_state_bytes()}};
  std::ofstream(cfg_.run_dir + "/metrics.jsonl", std::ios::app) << j.dump() << "\n";
}

std::string Trainer::write_samples() {
  // As DCGAN's reference code does, sample in train mode (BatchNorm statistics of the fixed
  // batch); the running statistics are restored so that sampling never changes training.
  auto sample = [this] {
    torch::NoGradGuard no_grad;
    std::vector<at::Tensor> saved;
    for (auto& kv : g_->named_buffers()) saved.push_back(kv.second.clone());
    at::Tensor imgs = g_->forward(fixed_z_).to(at::kFloat);
    size_t i = 0;
    for (auto& kv : g_->named_buffers()) kv.second.copy_(saved[i++]);
    return imgs;
  };
  at::Tensor imgs = sample();
  at::Tensor ema_imgs;
  if (ema_) {
    EmaSwap swap(*ema_);
    ema_imgs = sample();
  }
  char name[48];
  std::snprintf(name, sizeof(name), "samples-step-%08lld.png", static_cast<long long>(counters_.step));
  const std::string path = cfg_.run_dir + "/samples/" + name;
  if (comm_.rank() == 0) {
    std::filesystem::create_directories(cfg_.run_dir + "/samples");
    write_png_grid(path, imgs.narrow(2, 2, 28).narrow(3, 2, 28), 8);
    if (ema_imgs.defined()) {
      std::snprintf(name, sizeof(name), "samples-ema-step-%08lld.png", static_cast<long long>(counters_.step));
      write_png_grid(cfg_.run_dir + "/samples/" + name, ema_imgs.narrow(2, 2, 28).narrow(3, 2, 28), 8);
    }
  }
  return path;
}

std::vector<ModelAndOptimizer> Trainer::checkpoint_models() {
  ModelAndOptimizer g{g_.get(), opt_g_.get()}, d{d_.get(), opt_d_.get()};
  if (ema_) g.extra.push_back({"ema", [this](size_t i) { return ema_->unit_shard(i); }});
  return {g, d};
}

std::string Trainer::save() {
  counters_.noise_rng_state = noise_gen_.get_state();
  for (auto& [k, v] : scaler_g_->state()) counters_.scalars["g." + k] = v;
  for (auto& [k, v] : scaler_d_->state()) counters_.scalars["d." + k] = v;
  SaveStats st;
  std::string dir = save_checkpoint(cfg_.run_dir, counters_, checkpoint_models(),
                                    cfg_.resolved_yaml, comm_, static_cast<int>(cfg_.keep_checkpoints), &st);
  if (comm_.rank() == 0) {
    spdlog::info("saved step {}: {:.2f} MB on rank 0, training stalled {:.3f} s", counters_.step,
                 st.bytes / 1e6, st.total_s);
  }
  return dir;
}

void Trainer::resume(const std::string& path) {
  const std::string dir = resolve_checkpoint_dir(path);
  load_checkpoint(dir, counters_, checkpoint_models(), comm_);
  for (auto [prefix, scaler] : {std::pair{"g.", scaler_g_.get()}, std::pair{"d.", scaler_d_.get()}}) {
    std::vector<std::pair<std::string, double>> st;
    for (auto& [k, v] : counters_.scalars) {
      if (k.rfind(prefix, 0) == 0) st.emplace_back(k.substr(2), v);
    }
    scaler->load_state(st);
  }
  noise_gen_.set_state(counters_.noise_rng_state);
  if (comm_.rank() == 0) spdlog::info("resumed from {} at step {}", dir, counters_.step);
}

void Trainer::run() {
  std::filesystem::create_directories(cfg_.run_dir);
  if (comm_.rank() == 0) {
    auto mg = memory_stats(*g_), md = memory_stats(*d_);
    spdlog::info("world size {}, backend {}, G stage {} ({} param-shard bytes), D stage {} ({} param-shard bytes)",
                 comm_.world_size(), comm_.backend(), cfg_.g_sharding.stage,
                 mg.param_shard_bytes, cfg_.d_sharding.stage, md.param_shard_bytes);
    spdlog::info("model-state bytes per rank: G {}  D {}", mg.model_state_bytes(), md.model_state_bytes());
  }
  std::string last_ckpt, last_samples;
  while (counters_.step < cfg_.steps) {
    StepMetrics m = train_step();
    if (m.step % cfg_.log_every == 0 || m.step == cfg_.steps) log_step(m);
    if (cfg_.sample_every > 0 && m.step % cfg_.sample_every == 0) last_samples = write_samples();
    if (cfg_.checkpoint_every > 0 && m.step % cfg_.checkpoint_every == 0 && m.step != cfg_.steps) {
      last_ckpt = save();
      if (comm_.rank() == 0) spdlog::info("checkpoint {}", last_ckpt);
    }
  }
  last_ckpt = save();
  last_samples = write_samples();
  if (comm_.rank() == 0) {
    spdlog::info("done: {} steps", counters_.step);
    spdlog::info("samples:     {}", last_samples);
    spdlog::info("metrics:     {}/metrics.jsonl", cfg_.run_dir);
    spdlog::info("checkpoints: {} (latest: {})", cfg_.run_dir + "/checkpoints", last_ckpt);
  }
}

}  // namespace shardgan
