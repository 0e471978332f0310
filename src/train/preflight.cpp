#include "shardgan/train/preflight.h"

#include <malloc.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <system_error>

#include <torch/torch.h>

#include "shardgan/checkpoint/async_checkpoint.h"
#include "shardgan/models/family.h"
#include "shardgan/optim/factory.h"
#include "shardgan/optim/offloaded_adam.h"
#include "shardgan/sharding/deferred.h"
#include "shardgan/sharding/flat_layout.h"
#include "shardgan/sharding/memory_estimate.h"
#include "shardgan/sharding/sharded_model.h"
#include "shardgan/train/activation_probe.h"
#include "shardgan/util/proc_status.h"
#include "data/image_files.h"
#include "shardgan/data/images.h"
#include "shardgan/train/step_phases.h"

namespace shardgan {
namespace {
// checkpoint.snapshot: whether the snapshot copies (copy, or auto resolved to copy on this
// rank's transports: choose_snapshot_kind is local) rather than forks.
bool snapshot_copies(const TrainConfig& cfg) {
  if (cfg.checkpoint_snapshot == "auto") return choose_snapshot_kind().kind == SnapshotKind::kCopy;
  return cfg.checkpoint_snapshot == "copy";
}

int dtype_bytes(at::ScalarType t) { return static_cast<int>(c10::elementSize(t)); }

// The most bytes of Adam state any rank holds for `model` under a reduced-dtype policy:
// per rank, the sum over units of its shard's StateLayout.
// The bytes of reduced optimizer states (optim.<model>.state_dtype) on the rank holding the
// most, from the layouts the optimizer allocates from (make_flat_layout, make_state_layout):
// all of them in RAM (ShardedAdam), or, offloaded (OffloadedAdam), the absmax and float32
// elements it keeps in RAM plus, with `in_store_bytes` > 0 (the cpu tier), the store's
// shard-shaped arrays of that many bytes per element.
int64_t reduced_state_bytes(const ModelSpec& model, const std::vector<UnitParams>& params, const ShardingConfig& sc,
                            const StatePolicy& policy, int states, int world_size, bool offloaded,
                            int64_t in_store_bytes) {
  const int ranks = sc.stage == 0 ? 1 : world_size;
  std::vector<int64_t> per_rank(static_cast<size_t>(ranks), 0);
  for (size_t u = 0; u < params.size(); ++u) {
    const FlatLayout fl = make_flat_layout(params[u].numels, sc.flat_align, world_size, sc.stage);
    std::vector<StateParam> sp;
    for (size_t k = 0; k < params[u].names.size(); ++k) {
      sp.push_back({model.units[u].name + "." + params[u].names[k], fl.offsets[k], params[u].numels[k]});
    }
    for (int r = 0; r < ranks; ++r) {
      const StateLayout l = make_state_layout(sp, fl.padded_numel, r * fl.shard_numel, fl.shard_numel, policy);
      per_rank[static_cast<size_t>(r)] +=
          offloaded ? states * l.resident_bytes(policy.dtype) + in_store_bytes * fl.shard_numel
                    : states * l.state_bytes(policy.dtype);
    }
  }
  return *std::max_element(per_rank.begin(), per_rank.end());
}

ModelMemorySpec spec_for(const TrainConfig& cfg, const ModelSpec& model, const ShardingConfig& sc,
                         const OptimizerConfig& oc, bool ema, int world_size, int local_ranks) {
  ModelMemorySpec s;
  const std::vector<UnitParams> params = unit_params(model);
  for (const UnitParams& up : params) {
    int64_t t = 0;
    for (int64_t n : up.numels) t += n;
    s.unit_numels.push_back(t);
    s.unit_param_numels.push_back(up.numels);
  }
  s.flat_align = sc.flat_align;
  s.world_size = world_size;
  s.stage = sc.stage;
  s.master_bytes = dtype_bytes(cfg.model_dtype);
  s.compute_bytes = dtype_bytes(sc.compute_dtype.value_or(cfg.model_dtype));
  s.reduce_bytes = dtype_bytes(sc.reduce_dtype.value_or(cfg.model_dtype));
  s.optimizer_states = optimizer_states(to_string(oc.type), oc.momentum, oc.centered);
  const bool adam = oc.type == OptimizerType::kAdam || oc.type == OptimizerType::kAdamW;
  const bool offloaded = oc.offload.optimizer != OffloadDevice::kNone;
  // m is not stored with beta1 0 where the CPU kernel steps (offloaded states always).
  if (adam) s.optimizer_states = adam_stores_m(oc.beta1, offloaded || cfg.compute_device.is_cpu()) ? 2 : 1;
  if (adam && oc.state.dtype != StateDtype::kFloat32) {
    // Reduced states by the same layout the optimizer allocates from (make_flat_layout,
    // make_state_layout). Offloaded to cpu, the store's state arrays (offload_arrays) are RAM
    // too (its master and gradient arrays are counted with the parameters and gradients).
    const int states = s.optimizer_states;
    OptimizerConfig o = oc;
    resolve_state_float32(o, model.sparse_params);
    int64_t in_store = 0;
    if (oc.offload.optimizer == OffloadDevice::kCpu) {
      const OffloadArrays a = offload_arrays(oc.offload, states == 2, oc.state.dtype, dtype_bytes(cfg.model_dtype));
      in_store = states * a.elem_bytes[static_cast<size_t>(a.v)];  // m and v, one element size
    }
    for (int st = 0; st <= 3; ++st) {
      ShardingConfig at = sc;
      at.stage = st;
      const int64_t ram = reduced_state_bytes(model, params, at, o.state, states, world_size, offloaded, in_store);
      s.optimizer_state_bytes_by_stage.push_back(ram);
      if (o.state.dtype == StateDtype::kInt8) {  // checkpoints store 8-bit states as held: all of them
        s.checkpoint_state_bytes_by_stage.push_back(
            offloaded ? reduced_state_bytes(model, params, at, o.state, states, world_size, false, 0) : ram);
      }
    }
  }
  s.ema = ema;
  if (oc.offload.optimizer != OffloadDevice::kNone) {
    s.offload_ring_bytes = oc.offload.buffer_count * oc.offload.buffer_bytes;
    s.offload_to_disk = oc.offload.optimizer == OffloadDevice::kDisk;
    s.offload_params_to_disk = oc.offload.param == OffloadDevice::kDisk;
    s.offload_grads_to_disk = oc.offload.gradient == OffloadDevice::kDisk;
    s.offload_grads = oc.offload.gradient != OffloadDevice::kNone;
  }
  s.reshard_after_forward = sc.reshard_after_forward;
  // hpZ: auto is the ranks on this node, as for HSDP's auto below. A size that does not
  // divide the world is refused when the trainer builds the group.
  const int k = sc.hpz_partition_size == 0 ? local_ranks : sc.hpz_partition_size;
  s.hpz_partition_size = k > 1 && world_size % k == 0 ? k : 1;
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
          {"hpz_secondary_bytes", e.secondary_param_bytes},
          {"grads_released_bytes", e.grad_released_bytes},
          {"largest_gathered_unit_bytes", e.gathered_unit_bytes},
          {"transient_bytes", e.transient_bytes()},
          {"peak_bytes", e.peak_bytes()}};
}

// This process's resident set now (VmRSS): LibTorch, MPI and the allocator before any
// model exists. -1 if unreadable.
int64_t current_rss_bytes() { return proc_status_bytes("VmRSS"); }

// Bytes of one training image in the model dtype with its label, or, for an image-to-image
// model, its input image A.
int64_t image_bytes(const TrainConfig& cfg) {
  const ImageShape s = cfg.family->image_shape();
  const int64_t label = cfg.family->condition_channels() > 0
                            ? cfg.family->condition_channels() * s.height * s.width * dtype_bytes(cfg.model_dtype)
                            : 8;
  return s.channels * s.height * s.width * dtype_bytes(cfg.model_dtype) + label;
}

// The training images the trainer keeps in memory (model dtype) with their labels or input
// images A (data_image_count of them); hdf5 streams them (data.prefetch_batches micro-batches
// ahead).
int64_t data_bytes(const TrainConfig& cfg, int world_size) {
  if (cfg.data_source == "hdf5") {
    return (cfg.prefetch_batches + 1) * std::max<int64_t>(1, cfg.global_batch / cfg.micro_batches / world_size) *
           image_bytes(cfg);
  }
  return data_image_count(cfg) * image_bytes(cfg);
}

// What decoding the training images holds beyond them, before any model exists.
// data.source fashion-mnist: load_fashion_mnist's uint8 file and one chunk
// (fashion_mnist_decode_bytes, the loader's own count). data.source paired:
// read_paired_folder's uint8 A and B of every pair, alive while the trainer scales them to
// the model dtype (DataPipeline).
int64_t decode_bytes(const TrainConfig& cfg) {
  if (cfg.data_source == "fashion-mnist") {
    return fashion_mnist_decode_bytes(data_image_count(cfg), dtype_bytes(cfg.model_dtype));
  }
  if (cfg.data_source != "paired") return 0;
  const ImageShape s = cfg.family->image_shape();
  return data_image_count(cfg) * 2 * s.channels * s.height * s.width;
}

// One local micro-batch of G's images (model dtype) and their labels: what a phase that
// keeps G's images holds per micro-batch (StepPhase::kept_image_micro_batches).
int64_t image_micro_batch_bytes(const TrainConfig& cfg, int data_ranks) {
  const ImageShape s = cfg.family->image_shape();
  const int64_t micro = std::max<int64_t>(1, cfg.global_batch / cfg.micro_batches / std::max(data_ranks, 1));
  return micro * (s.channels * s.height * s.width * dtype_bytes(cfg.model_dtype) + 8);
}

}  // namespace
}  // namespace shardgan

// gperftools' C API, present when shardgan-train links tcmalloc (weak: absent otherwise).
extern "C" void MallocExtension_ReleaseFreeMemory() __attribute__((weak));

namespace shardgan {
namespace {

// Returns freed heap pages to the OS (tcmalloc's page heap, glibc's arenas), so that VmRSS
// afterwards is what the process holds rather than what its allocator keeps for reuse.
void release_free_memory() {
  if (MallocExtension_ReleaseFreeMemory) MallocExtension_ReleaseFreeMemory();
  malloc_trim(0);
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

std::vector<int> contiguous_node_ranks(int rank, int local_ranks, int world_size) {
  const int n = std::max(local_ranks, 1);
  const int first = std::max(rank, 0) / n * n;
  std::vector<int> r;
  for (int i = first; i < std::min(first + n, std::max(world_size, 1)); ++i) r.push_back(i);
  return r;
}

std::pair<int64_t, int64_t> split_ranks_on_node(int k, const std::vector<int>& node_world_ranks) {
  const auto g = std::count_if(node_world_ranks.begin(), node_world_ranks.end(), [k](int r) { return r < k; });
  return {static_cast<int64_t>(g), static_cast<int64_t>(node_world_ranks.size()) - static_cast<int64_t>(g)};
}

int64_t data_image_count(const TrainConfig& cfg) {
  if (cfg.data_source == "synthetic") return cfg.synthetic_size;
  if (cfg.data_source == "paired") {
    // read_paired_folder's files: the regular files directly in the folder with an image
    // extension (a listing, nothing decoded); 0 when the folder cannot be read (the
    // reader then names it).
    namespace fs = std::filesystem;
    std::error_code ec;
    int64_t n = 0;
    for (fs::directory_iterator it(cfg.data_path, ec), end; !ec && it != end; it.increment(ec)) {
      if (it->is_regular_file(ec) && data::is_image_file(it->path())) ++n;
    }
    return n;
  }
  if (cfg.data_source == "hdf5") return 0;
  return 60000;  // fashion-mnist's training images
}

nlohmann::json memory_preflight(const TrainConfig& cfg, Communicator& comm, int world_size, int local_ranks,
                                const std::vector<int>& node_world_ranks) {
  // Under HSDP a model is sharded over its replica group only (world size / R ranks; with
  // R = auto, one node's ranks).
  auto shard_ways = [&](int R) { return R == 1 ? world_size : R == 0 ? std::max(local_ranks, 1) : std::max(world_size / R, 1); };
  // Split placement: G sharded over its K ranks, D over the other N - K, each rank one model
  // (under HSDP over a replica group of them: K / R ranks).
  const bool split = cfg.placement == "split" && world_size >= 2;
  const int k = split ? split_generator_ranks(cfg, world_size) : 0;
  // The data sampler's refusal, here too, so that --dry-run refuses what the run would: the
  // world's ranks split every global batch. (Split placement checks its two groups, with its
  // own message, where it forms them.)
  if (!split) DistributedSampler(cfg.global_batch, cfg.global_batch, 0, world_size, 0, cfg.micro_batches);
  auto group_ways = [](int ranks, int R) { return std::max(R > 1 ? ranks / R : ranks, 1); };
  ModelMemorySpec g = spec_for(cfg, cfg.family->generator(comm), cfg.g_sharding, cfg.g_optim, cfg.ema_enabled,
                               split ? group_ways(k, cfg.g_replicate_degree) : shard_ways(cfg.g_replicate_degree),
                               local_ranks);
  ModelMemorySpec d = spec_for(cfg, cfg.family->discriminator(comm), cfg.d_sharding, cfg.d_optim, false,
                               split ? group_ways(world_size - k, cfg.d_replicate_degree)
                                     : shard_ways(cfg.d_replicate_degree),
                               local_ranks);
  auto ge = estimate_all_stages(g), de = estimate_all_stages(d);
  auto sum = [](const std::vector<int64_t>& v) {
    int64_t n = 0;
    for (auto x : v) n += x;
    return n;
  };
  const int gs = cfg.g_sharding.stage, ds = cfg.d_sharding.stage;
  // The step's phases (step_phases.h) at stages `sg` and `sd`, for a rank holding both
  // models, or under split one of them; each count is the largest phase's.
  auto phases = [&](int sg, int sd, PhaseShape::Placement where) {
    PhaseShape shape = phase_shape(cfg, split, where != PhaseShape::Placement::kSplitDiscriminator);
    shape.placement = where;
    shape.g_stage = sg;
    shape.d_stage = sd;
    return step_phases(shape);
  };
  const int64_t kept_image_bytes = image_micro_batch_bytes(cfg, split ? world_size - k : world_size);
  // checkpoint.async: a rank's checkpoint (its master shards, optimizer states and EMA) is
  // held twice while a save is in flight. Copy snapshots keep staging buffers of that size in
  // this process for the whole run; a fork snapshot costs the node at most as much (the pages
  // training rewrites before the child has written them), outside this process's RSS.
  const int64_t master_elem = dtype_bytes(cfg.model_dtype);
  // The master shard, every optimizer state (wherever its tier keeps it) and the EMA, in
  // the master dtype.
  // 8-bit states are stored as held (their RAM bytes); other states as flat master-dtype
  // tensors (bfloat16 ones widened).
  auto ckpt_bytes = [&](const ModelMemoryEstimate& e, const ModelMemorySpec& s) {
    const int64_t states = s.checkpoint_state_bytes_by_stage.size() == 4
                               ? s.checkpoint_state_bytes_by_stage[static_cast<size_t>(e.stage)]
                               : e.shard_numel * master_elem * s.optimizer_states;
    return e.shard_numel * master_elem + states + e.ema_bytes;
  };
  const bool copy = snapshot_copies(cfg);
  auto snapshot = [&](int sg, int sd) {
    return cfg.checkpoint_async ? ckpt_bytes(ge[sg], g) + ckpt_bytes(de[sd], d) : 0;
  };
  nlohmann::json j;
  j["generator_params"] = sum(g.unit_numels);
  j["discriminator_params"] = sum(d.unit_numels);
  j["world_size"] = world_size;
  j["ranks_on_node"] = local_ranks;
  j["generator_largest_unit_params"] = *std::max_element(g.unit_numels.begin(), g.unit_numels.end());
  j["discriminator_largest_unit_params"] = *std::max_element(d.unit_numels.begin(), d.unit_numels.end());
  const int64_t images = data_image_count(cfg);
  j["data"] = {{"source", cfg.data_source},
               {"images", images},
               {"bytes_per_rank", data_bytes(cfg, split ? std::max(world_size - k, 1) : world_size)},
               {"decode_bytes_per_rank", decode_bytes(cfg)}};
  for (int s = 0; s < 4; ++s) {
    const std::string key = "stage" + std::to_string(s);
    const auto ph = phases(s, s, PhaseShape::Placement::kShared);
    j["per_rank"][key]["generator"] = stage_json(ge[s]);
    j["per_rank"][key]["discriminator"] = stage_json(de[s]);
    j["per_rank"][key]["state_bytes"] = step_peak(ph, ge[s], de[s], false).bytes;
    j["per_rank"][key]["total_peak_bytes"] = step_peak(ph, ge[s], de[s], true, kept_image_bytes).bytes;
    j["per_rank"][key]["state_bytes_without_phases"] = gan_state_bytes(ge[s], de[s]);
    j["per_rank"][key]["checkpoint_snapshot_bytes"] = snapshot(s, s);
    j["per_rank"][key]["checkpoint_staging_bytes"] = copy ? snapshot(s, s) : 0;
  }
  const ModelMemoryEstimate& eg = ge[gs];
  const ModelMemoryEstimate& ed = de[ds];
  const auto shared_phases = phases(gs, ds, PhaseShape::Placement::kShared);
  const StepPeak state_peak = step_peak(shared_phases, eg, ed, false);
  const StepPeak peak = step_peak(shared_phases, eg, ed, true, kept_image_bytes);
  const int64_t ckpt_snapshot = snapshot(gs, ds);
  const int64_t in_process = copy ? ckpt_snapshot : 0;
  const int64_t outside = ckpt_snapshot - in_process;
  const int64_t per_rank = peak.bytes + in_process;
  nlohmann::json phase_list = nlohmann::json::array();
  for (const StepPhase& p : shared_phases) {
    phase_list.push_back({{"name", p.name},
                          {"source", p.source},
                          {"state_bytes", phase_bytes(p, eg, ed, false)},
                          {"bytes", phase_bytes(p, eg, ed, true, kept_image_bytes)}});
  }
  j["configured"] = {{"generator_stage", gs},
                     {"discriminator_stage", ds},
                     {"step_phases", phase_list},
                     {"state_bytes", state_peak.bytes},
                     {"state_phase", shared_phases[state_peak.phase].name},
                     {"state_bytes_without_phases", gan_state_bytes(eg, ed)},
                     {"peak_phase", shared_phases[peak.phase].name},
                     {"checkpoint_snapshot_bytes", ckpt_snapshot},
                     {"per_rank_peak_bytes", per_rank},
                     {"node_peak_bytes", (per_rank + outside) * local_ranks},
                     {"node_bytes_checked", (with_margin(per_rank) + outside) * local_ranks}};
  // The disk tier, per rank and model: OffloadedAdam's store (offload_arrays: the moments
  // in the state dtype, the master shard, the gradient shard in its dtype), S elements each.
  auto disk_bytes = [&](const ModelMemoryEstimate& e, const OptimizerConfig& oc) -> int64_t {
    const OffloadConfig& o = oc.offload;
    if (o.optimizer != OffloadDevice::kDisk) return 0;
    const bool stores_m = adam_stores_m(oc.beta1, /*device_is_cpu=*/true);
    return e.shard_numel * offload_arrays(o, stores_m, oc.state.dtype, master_elem).bytes_per_element();
  };
  j["configured"]["offload_disk_bytes"] = {{"generator", disk_bytes(eg, cfg.g_optim)},
                                           {"discriminator", disk_bytes(ed, cfg.d_optim)}};
  // The node's memory is read once, before the probe: the ranks' probes are transient.
  const HostMemory host = read_host_memory();
  // This node's ranks holding G and holding D: every one holds both, except under split
  // placement, where world ranks [0, K) hold G: this node's own world ranks (given, from a
  // shared-memory split; else the aligned block of local_ranks around this rank).
  const std::vector<int> node_ranks =
      node_world_ranks.empty() ? contiguous_node_ranks(comm.rank(), local_ranks, world_size) : node_world_ranks;
  const auto [k_on_node, d_on_node] =
      split ? split_ranks_on_node(k, node_ranks) : std::pair<int64_t, int64_t>{local_ranks, local_ranks};
  // The disk: every rank of this node writes its offload files and checkpoint shards.
  j["disk"] = disk_report(cfg, disk_bytes(eg, cfg.g_optim) * k_on_node + disk_bytes(ed, cfg.d_optim) * d_on_node,
                          ckpt_bytes(eg, g) * k_on_node + ckpt_bytes(ed, d) * d_on_node);
  if (split) {
    // Each rank holds one model's state and transient buffers in its side's phases (and
    // D's ranks the data, and G's too for an image-to-image model, whose input images G's
    // ranks read): every rank of a group needs the same, and the node holds its own ranks
    // of each group. checkpoint.async: a rank snapshots only the model it holds (in the
    // rank for copy, outside it, on the node, for fork).
    const int64_t g_snap = cfg.checkpoint_async ? ckpt_bytes(eg, g) : 0;
    const int64_t d_snap = cfg.checkpoint_async ? ckpt_bytes(ed, d) : 0;
    const int64_t g_data = cfg.family->condition_channels() > 0 ? data_bytes(cfg, k) : 0;
    const auto g_phases = phases(gs, ds, PhaseShape::Placement::kSplitGenerator);
    const auto d_phases = phases(gs, ds, PhaseShape::Placement::kSplitDiscriminator);
    const int64_t g_step = step_peak(g_phases, eg, ed, true).bytes;
    const int64_t d_step = step_peak(d_phases, eg, ed, true, kept_image_bytes).bytes;
    const int64_t d_data = data_bytes(cfg, std::max(world_size - k, 1));
    const int64_t g_rank = std::max(g_step, g_data > 0 ? decode_bytes(cfg) : 0) + g_data + (copy ? g_snap : 0),
                  d_rank = std::max(d_step, decode_bytes(cfg)) + d_data + (copy ? d_snap : 0);
    const int64_t g_out = copy ? 0 : g_snap, d_out = copy ? 0 : d_snap;
    const int64_t node = (with_margin(g_rank) + g_out) * k_on_node + (with_margin(d_rank) + d_out) * d_on_node;
    j["split"] = {{"generator_ranks", k},
                  {"discriminator_ranks", world_size - k},
                  {"generator_ranks_on_node", k_on_node},
                  {"discriminator_ranks_on_node", d_on_node},
                  {"node_world_ranks", node_ranks},
                  {"generator_rank_peak_bytes", g_rank},
                  {"discriminator_rank_peak_bytes", d_rank},
                  {"generator_rank_snapshot_bytes", g_snap},
                  {"discriminator_rank_snapshot_bytes", d_snap},
                  {"generator_state_bytes", step_peak(g_phases, eg, ed, false).bytes},
                  {"discriminator_state_bytes", step_peak(d_phases, eg, ed, false).bytes}};
    j["configured"]["checkpoint_snapshot_bytes"] = std::max(g_snap, d_snap);
    j["configured"]["per_rank_peak_bytes"] = std::max(g_rank, d_rank);
    j["configured"]["state_bytes"] = std::max(j["split"]["generator_state_bytes"].get<int64_t>(),
                                              j["split"]["discriminator_state_bytes"].get<int64_t>());
    j["configured"]["node_peak_bytes"] = (g_rank + g_out) * k_on_node + (d_rank + d_out) * d_on_node;
    j["configured"]["node_bytes_checked"] = node;
    j["node_memory"] = {{"total_bytes", host.total_bytes}, {"available_bytes", host.available_bytes}};
    return j;  // the probe measures a rank holding both models: not run here
  }
  const int64_t data = data_bytes(cfg, world_size), decode = decode_bytes(cfg);
  // The prediction: what this process holds once the probe has run (LibTorch, oneDNN and
  // OpenMP loaded and used once, MPI; the probe's own memory given back to the OS), the
  // persistent training state of the step's largest phase (exact, the code's own
  // accounting; both models' gradient shards where a phase holds both), the data, and one
  // step's transient bytes as the probe measured them at this micro-batch, plus
  // kPredictionMarginBytes.
  const int64_t rss_before = current_rss_bytes();
  if (cfg.memory_probe && !cfg.compute_device.is_cuda() && cfg.g_replicate_degree == 1 && cfg.d_replicate_degree == 1 &&
      rss_before > 0) {
    const int64_t micro = std::max<int64_t>(1, cfg.global_batch / cfg.micro_batches / world_size);
    const int64_t persistent = state_peak.bytes;
    // The probe holds what a rank of the real run holds outside the gathered units: at stages
    // 0-2 the replicated parameters (and more). When the persistent state alone cannot fit,
    // refuse without it, using the estimate's bound on the transient buffers instead.
    const int64_t floor_bytes = rss_before + persistent + data + kPredictionMarginBytes;
    int64_t rss_now = rss_before, transient = 0, grad_writes = 0;
    if (floor_bytes * local_ranks > host.available_bytes) {
      transient = peak.bytes - state_peak.bytes;  // the estimate's bound, gradient writers included
      j["probe"] = {{"skipped", "the persistent state alone exceeds the available memory; the transient "
                                "term is the estimate's bound"}};
    } else {
      ActivationProbe probe =
          probe_step_memory(cfg, cfg.run_dir + "/.preflight-probe-rank" + std::to_string(comm.rank()), micro);
      release_free_memory();
      rss_now = current_rss_bytes();
      transient = probe.bytes_at(micro);
      // Gradient offload: the probe's step runs without it, so the reduce-scatter outputs
      // waiting for each model's gradient writer (its own thread) are added, both models'.
      grad_writes = eg.grad_write_pending_bytes + ed.grad_write_pending_bytes;
      j["probe"] = {{"micro_batches", {probe.micro_batch_a, probe.micro_batch_b}},
                    {"peak_bytes", {probe.peak_a_bytes, probe.peak_b_bytes}},
                    {"bytes_per_sample", static_cast<int64_t>(probe.bytes_per_sample())},
                    {"shadow_world_size", probe.shadow_world},
                    {"seconds", probe.seconds}};
    }
    // node_shared_gather: every rank maps and touches its models' whole pools (so each rank's
    // RSS counts them), kept for the run. The probe runs without them (its communicator is
    // a stand-in), so they are added here.
    auto pool = [&](const ShardingConfig& sc, int R, const ModelMemoryEstimate& e) -> int64_t {
      const bool on = ShardedModel::node_shared_gather_applies(sc, world_size, R, !cfg.compute_device.is_cuda()) &&
                      local_ranks == world_size;
      return on ? ShardedModel::kSharedSlots * e.gathered_unit_bytes : 0;
    };
    const int64_t shared_pools =
        pool(cfg.g_sharding, cfg.g_replicate_degree, ge[3]) + pool(cfg.d_sharding, cfg.d_replicate_degree, de[3]);
    // The step, or the paired folder's decoding before it (the data's uint8 copy).
    const int64_t step = persistent + transient + shared_pools + in_process + grad_writes;
    const int64_t predicted = rss_now + std::max(step, decode) + data + kPredictionMarginBytes;
    j["configured"]["predicted"] = {{"process_rss_bytes", rss_now},
                                    {"process_rss_before_probe_bytes", rss_before},
                                    {"persistent_state_bytes", persistent},
                                    {"data_bytes", data},
                                    {"data_decode_bytes", decode},
                                    {"step_transient_bytes", transient},
                                    {"node_shared_pool_bytes", shared_pools},
                                    {"grad_write_pending_bytes", grad_writes},
                                    {"checkpoint_staging_bytes", in_process},
                                    {"micro_batch", micro},
                                    {"margin_bytes", kPredictionMarginBytes},
                                    {"vmhwm_bytes_per_rank", predicted}};
    j["configured"]["node_bytes_checked"] = (predicted + outside) * local_ranks;
  }
  j["node_memory"] = {{"total_bytes", host.total_bytes}, {"available_bytes", host.available_bytes}};
  return j;
}

int64_t stage_need_bytes(const nlohmann::json& report, int stage) {
  const int ranks = report["ranks_on_node"].get<int>();
  const nlohmann::json& at = report["per_rank"]["stage" + std::to_string(stage)];
  // bytes(s, model, key): one model's figure at stage s. The state of both models
  // ("state_bytes", per stage and configured) is the step's largest phase's (step_phases.h).
  auto bytes = [&](int s, const char* model, const char* key) {
    return report["per_rank"]["stage" + std::to_string(s)][model][key].get<int64_t>();
  };
  // checkpoint.async at `stage`: the copy snapshot's staging buffers in the rank, and the
  // fork snapshot's pages outside it (absent from reports without async: 0).
  const int64_t staging = at.value("checkpoint_staging_bytes", int64_t{0});
  const int64_t outside = at.value("checkpoint_snapshot_bytes", int64_t{0}) - staging;
  const nlohmann::json& c = report["configured"];
  if (!c.contains("predicted")) {
    return (with_margin(at["total_peak_bytes"].get<int64_t>() + staging) + outside) * ranks;
  }
  // The prediction of the configured stages with their persistent state and staging buffers
  // swapped for those of `stage`. The measured transient stays (activations do not depend on
  // the stage); where the estimate's transient bound is larger at `stage` (more gathered
  // units), the difference is added.
  const int gs = c["generator_stage"].get<int>(), ds = c["discriminator_stage"].get<int>();
  const int64_t configured_persistent = c["state_bytes"].get<int64_t>();
  const int64_t configured_staging = c["predicted"].value("checkpoint_staging_bytes", int64_t{0});
  const int64_t configured_transient =
      bytes(gs, "generator", "transient_bytes") + bytes(ds, "discriminator", "transient_bytes");
  const int64_t stage_persistent = at["state_bytes"].get<int64_t>();
  const int64_t extra_transient = std::max<int64_t>(
      0, bytes(stage, "generator", "transient_bytes") + bytes(stage, "discriminator", "transient_bytes") -
             configured_transient);
  const int64_t per_rank = c["predicted"]["vmhwm_bytes_per_rank"].get<int64_t>() - configured_persistent +
                           stage_persistent + extra_transient - configured_staging + staging;
  return (per_rank + outside) * ranks;
}

void check_memory(const TrainConfig& cfg, const nlohmann::json& report) {
  const int ranks = report["ranks_on_node"].get<int>();
  // The prediction when the probe ran, else the padded estimate (memory_preflight sets both).
  const int64_t need = report["configured"]["node_bytes_checked"].get<int64_t>();
  const int64_t avail = report["node_memory"]["available_bytes"].get<int64_t>();
  if (need <= avail) return;
  if (report.contains("split")) {
    const nlohmann::json& sp = report["split"];
    throw MemoryPreflightError(
        cfg.source + ": memory pre-flight: train.placement split with placement.generator_ranks = " +
        std::to_string(sp["generator_ranks"].get<int>()) + " needs about " + gib(need) + " on the " +
        std::to_string(ranks) + " ranks of this node (a G rank " + gib(sp["generator_rank_peak_bytes"].get<int64_t>()) +
        ", a D rank " + gib(sp["discriminator_rank_peak_bytes"].get<int64_t>()) + ", with margins), but only " +
        gib(avail) + " are available. Give the larger model more ranks (placement.generator_ranks), raise its ZeRO "
        "stage, offload it, or set train.skip_memory_check: true to run anyway. `shardgan-train CONFIG --dry-run` "
        "prints the whole estimate.");
  }
  std::string fits;
  for (int s = 0; s < 4 && fits.empty(); ++s) {
    const int64_t n = stage_need_bytes(report, s);
    if (n <= avail) fits = "ZeRO stage " + std::to_string(s) + " for both models would need " + gib(n) + " and fits";
  }
  if (fits.empty()) {
    fits = "no ZeRO stage fits at this world size: use more nodes/ranks with stage 3, bfloat16 "
           "compute, or offload to disk (offload.<model>.optimizer, offload.<model>.gradient at stages 2-3 and "
           "offload.<model>.param at stage 3)";
  }
  const int64_t snap = report["configured"].value("checkpoint_snapshot_bytes", int64_t{0});
  if (snap > 0) {
    fits += ". checkpoint.async counts " + gib(snap) + " per rank at the configured stages for the checkpoint "
            "snapshot, and each stage's figure above its own (" +
            (!snapshot_copies(cfg) ? "the fork snapshot's worst case, pages rewritten while the child writes"
                                               : "copy snapshot: staging buffers") +
            "); set checkpoint.async: false to save synchronously";
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
