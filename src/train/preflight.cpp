#include "shardgan/train/preflight.h"

#include <cstdio>

#include <torch/torch.h>

#include "shardgan/models/family.h"
#include "shardgan/optim/factory.h"
#include "shardgan/sharding/memory_estimate.h"

namespace shardgan {
namespace {

int dtype_bytes(at::ScalarType t) { return static_cast<int>(c10::elementSize(t)); }

ModelMemorySpec spec_for(const TrainConfig& cfg, const ModelSpec& model, const ShardingConfig& sc,
                         const OptimizerConfig& oc, bool ema, int world_size) {
  ModelMemorySpec s;
  s.unit_numels = unit_numels(model);
  s.world_size = world_size;
  s.stage = sc.stage;
  s.master_bytes = dtype_bytes(cfg.model_dtype);
  s.compute_bytes = dtype_bytes(sc.compute_dtype.value_or(cfg.model_dtype));
  s.reduce_bytes = dtype_bytes(sc.reduce_dtype.value_or(cfg.model_dtype));
  s.optimizer_states = optimizer_states(to_string(oc.type), oc.momentum, oc.centered);
  s.ema = ema;
  if (oc.offload.optimizer != OffloadDevice::kNone) {
    s.offload_ring_bytes = oc.offload.buffer_count * oc.offload.buffer_bytes;
    s.offload_to_disk = oc.offload.optimizer == OffloadDevice::kDisk;
    s.offload_params_to_disk = oc.offload.param == OffloadDevice::kDisk;
  }
  s.reshard_after_forward = sc.reshard_after_forward;
  // A frozen D is released unit by unit in the G step's backward (input gradients), so it
  // is gathered like a trained model.
  s.frozen_backward = false;
  return s;
}

nlohmann::json stage_json(const ModelMemoryEstimate& e) {
  return {{"params_bytes", e.param_bytes},
          {"grads_bytes", e.grad_bytes},
          {"optimizer_state_bytes", e.optimizer_state_bytes},
          {"ema_bytes", e.ema_bytes},
          {"largest_gathered_unit_bytes", e.gathered_unit_bytes},
          {"transient_bytes", e.transient_bytes()},
          {"peak_bytes", e.peak_bytes()}};
}

int64_t with_margin(int64_t per_rank_bytes) {
  return static_cast<int64_t>(kPreflightFactor * static_cast<double>(per_rank_bytes)) + kPreflightRankOverheadBytes;
}

std::string gib(int64_t b) {
  char s[32];
  std::snprintf(s, sizeof(s), "%.2f GiB", b / 1073741824.0);
  return s;
}

}  // namespace

nlohmann::json memory_preflight(const TrainConfig& cfg, Communicator& comm, int world_size, int local_ranks) {
  // Under HSDP a model is sharded over its replica group only (world size / R ranks; with
  // R = auto, one node's ranks).
  auto shard_ways = [&](int R) { return R == 1 ? world_size : R == 0 ? std::max(local_ranks, 1) : std::max(world_size / R, 1); };
  ModelMemorySpec g = spec_for(cfg, cfg.family->generator(comm), cfg.g_sharding, cfg.g_optim, cfg.ema_enabled,
                               shard_ways(cfg.g_replicate_degree));
  ModelMemorySpec d = spec_for(cfg, cfg.family->discriminator(comm), cfg.d_sharding, cfg.d_optim, false,
                               shard_ways(cfg.d_replicate_degree));
  auto ge = estimate_all_stages(g), de = estimate_all_stages(d);
  auto sum = [](const std::vector<int64_t>& v) {
    int64_t n = 0;
    for (auto x : v) n += x;
    return n;
  };
  nlohmann::json j;
  j["generator_params"] = sum(g.unit_numels);
  j["discriminator_params"] = sum(d.unit_numels);
  j["world_size"] = world_size;
  j["ranks_on_node"] = local_ranks;
  j["generator_largest_unit_params"] = *std::max_element(g.unit_numels.begin(), g.unit_numels.end());
  j["discriminator_largest_unit_params"] = *std::max_element(d.unit_numels.begin(), d.unit_numels.end());
  for (int s = 0; s < 4; ++s) {
    const std::string k = "stage" + std::to_string(s);
    j["per_rank"][k]["generator"] = stage_json(ge[s]);
    j["per_rank"][k]["discriminator"] = stage_json(de[s]);
    j["per_rank"][k]["total_peak_bytes"] = ge[s].peak_bytes() + de[s].peak_bytes();
  }
  const int64_t per_rank = ge[cfg.g_sharding.stage].peak_bytes() + de[cfg.d_sharding.stage].peak_bytes();
  j["configured"] = {{"generator_stage", cfg.g_sharding.stage},
                     {"discriminator_stage", cfg.d_sharding.stage},
                     {"per_rank_peak_bytes", per_rank},
                     {"node_peak_bytes", per_rank * local_ranks},
                     {"node_bytes_checked", with_margin(per_rank) * local_ranks}};
  HostMemory host = read_host_memory();
  j["node_memory"] = {{"total_bytes", host.total_bytes}, {"available_bytes", host.available_bytes}};
  return j;
}

void check_memory(const TrainConfig& cfg, const nlohmann::json& report) {
  const int ranks_here = report["ranks_on_node"].get<int>();
  const int64_t need = with_margin(report["configured"]["per_rank_peak_bytes"].get<int64_t>()) * ranks_here;
  const int64_t avail = report["node_memory"]["available_bytes"].get<int64_t>();
  if (need <= avail) return;
  const int ranks = report["ranks_on_node"].get<int>();
  std::string fits;
  for (int s = 0; s < 4 && fits.empty(); ++s) {
    const int64_t n = with_margin(report["per_rank"]["stage" + std::to_string(s)]["total_peak_bytes"].get<int64_t>()) * ranks;
    if (n <= avail) fits = "ZeRO stage " + std::to_string(s) + " for both models would need " + gib(n) + " and fits";
  }
  if (fits.empty()) {
    fits = "no ZeRO stage fits at this world size: use more nodes/ranks with stage 3, bfloat16 "
           "compute, or offload to disk (offload.<model>.optimizer and, at stage 3, offload.<model>.param)";
  }
  throw MemoryPreflightError(
      cfg.source + ": memory pre-flight: G stage " + std::to_string(cfg.g_sharding.stage) + " and D stage " +
      std::to_string(cfg.d_sharding.stage) + " on " + std::to_string(ranks) + " ranks of this node need about " +
      std::to_string(need) + " bytes (" + gib(need) + ": training state plus measured overhead), but only " + std::to_string(avail) +
      " bytes (" + gib(avail) + ") are available. " + fits +
      " (set sharding.generator.stage / sharding.discriminator.stage), or set train.skip_memory_check: true "
      "to run anyway. `shardgan-train CONFIG --dry-run` prints the whole estimate.");
}

}  // namespace shardgan
