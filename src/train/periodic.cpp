#include "shardgan/train/periodic.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "shardgan/optim/sharded_ema.h"
#include "shardgan/train/config.h"
#include "shardgan/train/image_grid.h"
#include "shardgan/train/inference.h"
#include "shardgan/train/metrics_record.h"
#include "shardgan/util/proc_status.h"
#include "shardgan/util/progress.h"
#include "shardgan/util/test_control.h"

namespace shardgan {

int64_t peak_rss_bytes() { return std::max<int64_t>(0, proc_status_bytes("VmHWM")); }

namespace {

nlohmann::json stats_json(const MemoryStats& m) {
  return {{"param_shard_bytes", m.param_shard_bytes},
          {"grad_shard_bytes", m.grad_shard_bytes},
          {"optimizer_state_bytes", m.optimizer_state_bytes},
          {"offloaded_bytes", m.offloaded_bytes},
          {"model_state_bytes", m.model_state_bytes()},
          {"peak_full_param_bytes", m.peak_full_param_bytes},
          {"comm_buffer_bytes", m.comm_buffer_bytes}};
}

}  // namespace

std::vector<int64_t> gather_peak_rss(Communicator& comm) {
  const int n = comm.world_size();
  at::Tensor mine = torch::full({1}, static_cast<double>(peak_rss_bytes()), torch::kDouble);
  at::Tensor all = torch::empty({n}, torch::kDouble);
  comm.all_gather(all, mine);
  std::vector<int64_t> per_rank;
  for (int r = 0; r < n; ++r) per_rank.push_back(static_cast<int64_t>(all[r].item<double>()));
  return per_rank;
}

std::vector<int64_t> report_memory(const TrainConfig& cfg, Communicator& comm, const MemoryStats& g,
                                   const MemoryStats& d, const nlohmann::json& preflight,
                                   const std::vector<int64_t>& training_peak) {
  const int n = comm.world_size();
  const std::vector<int64_t> per_rank = gather_peak_rss(comm);
  int64_t sum = 0;
  std::string text;
  for (int r = 0; r < n; ++r) {
    sum += per_rank[r];
    text += fmt::format("{}{:.2f}", r ? ", " : "", per_rank[r] / 1073741824.0);
  }
  if (comm.rank() != 0) return per_rank;
  spdlog::info("peak RSS (VmHWM) per rank: [{}] GiB, summed {:.2f} GiB", text, sum / 1073741824.0);
  nlohmann::json j = {{"world_size", n},
                      {"peak_rss_bytes_per_rank", per_rank},
                      {"peak_rss_bytes_sum", sum},
                      {"generator_accounting_rank0", stats_json(g)},
                      {"discriminator_accounting_rank0", stats_json(d)},
                      {"preflight", preflight}};
  if (!training_peak.empty()) j["peak_rss_bytes_per_rank_training"] = training_peak;
  std::filesystem::create_directories(cfg.run_dir);
  std::ofstream(cfg.run_dir + "/memory.json") << j.dump(2) << "\n";
  return per_rank;
}

PeriodicActions::PeriodicActions(const TrainConfig& cfg, Communicator& comm) : cfg_(cfg), comm_(comm) {
  // Not from the memory probe's stand-in world (activation_probe.h), which every rank builds.
  if (comm_.rank() != 0 || comm_.backend() == "shadow") return;
  for (const std::string& w : cfg_.warnings) spdlog::warn("{}", w);  // keys set that have no effect
}

bool PeriodicActions::log_due(int64_t step) const {
  return step % cfg_.log_every == 0 || step == cfg_.steps;
}

bool PeriodicActions::sample_due(int64_t step) const {
  return cfg_.sample_every > 0 && step % cfg_.sample_every == 0;
}

bool PeriodicActions::checkpoint_due(int64_t step) const {
  return cfg_.checkpoint_every > 0 && step % cfg_.checkpoint_every == 0 && step != cfg_.steps;
}

void PeriodicActions::log_step(const StepMetrics& m, int64_t g_state_bytes, int64_t d_state_bytes) const {
  if (comm_.rank() != 0) return;
  const double sps = cfg_.global_batch / std::max(m.step_time_s, 1e-9);
  const int64_t rss = peak_rss_bytes();
  spdlog::info("step {:>6}/{}  loss_d {:.4f}  loss_g {:.4f}  D(x) {:.3f}  D(G(z)) {:.3f}  {:.3f} s/step  {} img/s  peak RSS {:.2f} GiB",
               m.step, cfg_.steps, m.loss_d, m.loss_g, m.d_real, m.d_fake, m.step_time_s, format_rate(sps),
               rss / 1073741824.0);
  nlohmann::json j = {{"step", m.step},       {"loss_d", m.loss_d},
                      {"loss_g", m.loss_g},   {"d_real", m.d_real},
                      {"d_fake", m.d_fake},   {"step_time_s", m.step_time_s},
                      {"images_per_s", sps},  {"world_size", comm_.world_size()},
                      {"g_model_state_bytes", g_state_bytes},
                      {"d_model_state_bytes", d_state_bytes},
                      {"peak_rss_bytes_rank0", rss},
                      {"nonfinite_steps", m.nonfinite_steps},
                      {"time_collective_s", m.time_collective_s},
                      // The compute thread's time inside the models' collective calls
                      // (starts and waits of all-gathers and reduce-scatters, blocking
                      // all-reduces): communication not hidden behind compute. The
                      // world's SyncBatchNorm all-reduces and votes are not in it.
                      {"exposed_comm_s", m.time_collective_s},
                      {"minor_faults", m.minor_faults},
                      {"system_s", m.system_s},
                      {"user_s", m.user_s},
                      {"time_offload_read_s", m.time_offload_read_s},
                      {"time_offload_grad_s", m.time_offload_grad_s},
                      {"time_optimizer_s", m.time_optimizer_s},
                      {"time_optimizer_io_s", m.time_optimizer_io_s},
                      {"comm_bytes_world", m.comm_bytes_world},
                      {"comm_bytes_shard_group", m.comm_bytes_shard_group},
                      {"comm_bytes_replicate", m.comm_bytes_replicate},
                      {"comm_bytes_secondary", m.comm_bytes_secondary}};
  if (m.time_offload_read_s > 0 || m.time_optimizer_io_s > 0) {
    spdlog::info("step {:>6} time: collectives {:.2f} s, offload reads for all-gathers {:.2f} s, gradient offload "
                 "{:.2f} s, optimizer {:.2f} s (offload I/O {:.2f} s), forward/backward and the rest {:.2f} s",
                 m.step, m.time_collective_s, m.time_offload_read_s, m.time_offload_grad_s, m.time_optimizer_s,
                 m.time_optimizer_io_s,
                 m.step_time_s - m.time_collective_s - m.time_offload_read_s - m.time_offload_grad_s - m.time_optimizer_s);
  }
  if (cfg_.placement == "split") {
    // Bytes between the groups against the formula: the images of every transfer (one per
    // D step that draws from G, plus G's pass) and their gradients (G's pass), at G's
    // compute dtype.
    const ImageShape s = cfg_.family->image_shape();
    const int64_t image_bytes = s.channels * s.height * s.width *
        static_cast<int64_t>(c10::elementSize(cfg_.g_sharding.compute_dtype.value_or(cfg_.model_dtype)));
    const int64_t transfers = (cfg_.update == "simultaneous" ? cfg_.d_steps - 1 : cfg_.d_steps) + 2;
    j["bytes_between_groups"] = m.bytes_between_groups;
    j["bytes_between_groups_formula"] = image_bytes * cfg_.global_batch * transfers;
    j["idle_g_s"] = m.idle_g_s;
    j["idle_d_s"] = m.idle_d_s;
    j["busy_g_s"] = m.busy_g_s;
    j["busy_d_s"] = m.busy_d_s;
    spdlog::info("step {:>6} split placement: G busy {:.3f} s idle {:.3f} s, D busy {:.3f} s idle {:.3f} s, {:.2f} MB "
                 "between the groups", m.step, m.busy_g_s, m.idle_g_s, m.busy_d_s, m.idle_d_s, m.bytes_between_groups / 1e6);
  }
  if (cfg_.r1_gamma > 0) j["r1"] = m.r1;
  if (cfg_.pl_weight > 0) {
    if ((m.step - 1) % cfg_.pl_every == 0) j["pl"] = m.pl;  // on the steps that ran the path-length update
    j["pl_mean"] = m.pl_mean;
  }
  // ADA's overfitting heuristic of this step alone: the mean sign of D's logits on (augmented)
  // real images over every rank; and ADA's p with the r_t of its last adjustment.
  if (m.real_logits > 0) j["r_t"] = m.real_signs / m.real_logits;
  if (cfg_.augment.enabled()) {
    j["ada_p"] = m.ada_p;
    if (std::isfinite(m.ada_rt)) j["ada_rt"] = m.ada_rt;
  }
  if (cfg_.aux_class_weight > 0) {
    j["class_real"] = m.class_real;  // AC-GAN: D's class head on real images and on G's
    j["class_fake"] = m.class_fake;
  }
  if (cfg_.family && cfg_.family->condition_channels() > 0) j["loss_l1"] = m.loss_l1;
  if (m.device_mem_used_bytes >= 0) j["device_mem_used_bytes"] = m.device_mem_used_bytes;
  if (m.device_mem_peak_allocated_bytes >= 0) j["device_mem_peak_allocated_bytes"] = m.device_mem_peak_allocated_bytes;
  // Negative control of ctest metrics_reference_control: a field docs/metrics.md does not
  // list, which append_metrics_record must refuse.
  if (test_control("metrics_unlisted_field")) j["unlisted_control_field"] = 1;
  append_metrics_record(cfg_.run_dir, j, MetricsRecord::kStep);
}

void PeriodicActions::log_eval(const nlohmann::json& record) const {
  if (comm_.rank() != 0) return;
  std::string text = fmt::format("eval step {}: FID {:.2f}", record.value("step", int64_t{0}),
                                 record.value("fid", 0.0));
  if (record.contains("class_acc")) text += fmt::format(", class accuracy {:.3f}", record["class_acc"].get<double>());
  if (record.contains("l1")) {
    text += fmt::format(", held-out L1 {:.4f}, PSNR {:.2f} dB, SSIM {:.4f}", record["l1"].get<double>(),
                        record["psnr"].get<double>(), record["ssim"].get<double>());
  }
  if (record.contains("fid_ema")) text += fmt::format("; EMA: FID {:.2f}", record["fid_ema"].get<double>());
  if (record.contains("l1_ema")) {
    text += fmt::format(", L1 {:.4f}, PSNR {:.2f} dB, SSIM {:.4f}", record["l1_ema"].get<double>(),
                        record["psnr_ema"].get<double>(), record["ssim_ema"].get<double>());
  }
  if (record.contains("class_acc_ema")) {
    text += fmt::format(", class accuracy {:.3f}", record["class_acc_ema"].get<double>());
  }
  auto covered = [&](const char* key) {  // classes given at least 2% of the images (10% each in the data)
    int n = 0;
    for (const auto& f : record.value(key, nlohmann::json::array())) n += f.get<double>() >= 0.02;
    return n;
  };
  if (record.contains("class_fractions")) {
    text += fmt::format("; classes covered (>= 2% of samples): {}", covered("class_fractions"));
    if (record.contains("class_fractions_ema")) text += fmt::format(", EMA {}", covered("class_fractions_ema"));
  }
  if (record.contains("truncation")) {  // eval.truncation: the same models on truncated latents
    text += fmt::format("; latents truncated at {}: FID {:.2f}", record["truncation"].get<double>(),
                        record.value("fid_trunc", 0.0));
    if (record.contains("class_acc_trunc")) {
      text += fmt::format(", class accuracy {:.3f}", record["class_acc_trunc"].get<double>());
    }
    if (record.contains("fid_ema_trunc")) text += fmt::format("; EMA: FID {:.2f}", record["fid_ema_trunc"].get<double>());
    if (record.contains("class_acc_ema_trunc")) {
      text += fmt::format(", class accuracy {:.3f}", record["class_acc_ema_trunc"].get<double>());
    }
  }
  spdlog::info("{} ({} samples, {:.1f} s)", text, record.value("eval_samples", int64_t{0}),
               record.value("eval_time_s", 0.0));
  append_metrics_record(cfg_.run_dir, record, MetricsRecord::kEvaluation);
}

std::string PeriodicActions::write_samples(ShardedModel& g, ShardedEma* ema, const TensorList& inputs,
                                           int64_t step, int nrow) const {
  auto sample = [&] {
    torch::NoGradGuard no_grad;
    std::vector<at::Tensor> saved;
    for (auto& kv : g.named_buffers()) saved.push_back(kv.second.clone());
    at::Tensor imgs = sample_grid(inputs, g.forward(inputs).at(0));
    size_t i = 0;
    for (auto& kv : g.named_buffers()) kv.second.copy_(saved[i++]);
    return imgs;
  };
  at::Tensor imgs = sample();
  at::Tensor ema_imgs;
  if (ema) {
    EmaSwap swap(*ema);
    ema_imgs = sample();
  }
  char name[64];
  std::snprintf(name, sizeof(name), "samples-step-%08lld.png", static_cast<long long>(step));
  const std::string path = cfg_.run_dir + "/samples/" + name;
  if (comm_.rank() == 0) {
    std::filesystem::create_directories(cfg_.run_dir + "/samples");
    write_png_grid(path, imgs, nrow);
    if (ema_imgs.defined()) {
      std::snprintf(name, sizeof(name), "samples-ema-step-%08lld.png", static_cast<long long>(step));
      write_png_grid(cfg_.run_dir + "/samples/" + name, ema_imgs, nrow);
    }
  }
  return path;
}

}  // namespace shardgan
