// The sharding section of the training configuration (config_sections.h): each model's
// ZeRO stage, mixed precision, ZeRO++ quantized collectives (qwZ, qgZ), hybrid sharding
// (HSDP) and hpZ, with their rules against each other and against dist.backend.
#include <cstdlib>

#include "shardgan/train/config_sections.h"

namespace shardgan::config_sections {
namespace {

ShardingConfig read_model_sharding(Reader& r, const std::string& who) {
  ShardingConfig c;
  const std::string k = "sharding." + who + ".stage";
  c.stage = r.get<int>(k, 3,
      "ZeRO stage of this model: 0 replicates everything, 1 shards optimizer state, 2 also gradients, 3 also "
      "parameters (gathered per unit)");
  require(c.stage >= 0 && c.stage <= 3, r, k, "must be 0, 1, 2 or 3");
  c.reshard_after_forward = r.get<bool>("sharding." + who + ".reshard_after_forward", true,
      "stage 3: free gathered parameters after forward and gather again for backward (FSDP's reshard_after_forward)");
  c.activation_checkpointing = r.get<bool>("sharding." + who + ".activation_checkpointing", false,
      "recompute each unit's forward in backward, keeping only its inputs (bit-identical results)");
  c.checkpoint_segments = r.get<bool>("sharding." + who + ".checkpoint_segments", false,
      "with activation checkpointing: also checkpoint the segments a model family marks inside a unit");
  require(!c.checkpoint_segments || c.activation_checkpointing, r, "sharding." + who + ".checkpoint_segments",
          "needs sharding." + who + ".activation_checkpointing: true (segments are checkpointed inside a "
          "checkpointed unit)");
  c.read_ahead = r.get<bool>("sharding." + who + ".read_ahead", true,
      "stage 3 with parameter offload: read the unit after next's master shard on a worker thread");
  c.node_shared_gather = r.get<bool>("sharding." + who + ".node_shared_gather", false,
      "stage 3 on the CPU, one host: gathered parameters live once per node in shared memory");
  for (const char* what : {"compute_dtype", "reduce_dtype"}) {
    const std::string key = "sharding." + who + "." + what;
    const std::string v = r.get<std::string>(
        key, "auto",
        std::string(what) == "compute_dtype"
            ? "mixed precision: dtype the gathered parameters are computed in (auto: the master dtype)"
            : "mixed precision: dtype gradients are reduced in (auto: the master dtype)");
    require(v == "auto" || v == "float32" || v == "float64" || v == "bfloat16" || v == "float16",
            r, key, "must be auto (the model dtype), float32, float64, bfloat16 or float16");
    c10::optional<at::ScalarType> t;
    if (v == "float32") t = at::kFloat;
    if (v == "float64") t = at::kDouble;
    if (v == "bfloat16") t = at::kBFloat16;
    if (v == "float16") t = at::kHalf;
    (std::string(what) == "compute_dtype" ? c.compute_dtype : c.reduce_dtype) = t;
  }
  // ZeRO++'s quantized collectives (comm/quantize.h).
  const std::string qw = "sharding." + who + ".quantized_weights", qg = "sharding." + who + ".quantized_gradients";
  const std::string w = r.get<std::string>(qw, "none",
      "stage 3: gather parameters as int8 blocks with a float32 scale each (ZeRO++ qwZ): none or int8");
  require(w == "none" || w == "int8", r, qw, "must be none or int8");
  require(w == "none" || c.stage == 3, r, qw, "needs sharding." + who + ".stage 3 (qwZ quantizes the per-unit "
          "all-gather of parameter shards)");
  c.quantized_weights_bits = w == "int8" ? 8 : 0;
  const std::string g = r.get<std::string>(qg, "none",
      "stages 2-3: reduce-scatter gradients as int8 or int4 blocks through an all-to-all, summed in float32 "
      "(ZeRO++ qgZ; under HSDP also the cross-replica average): none, int8 or int4");
  require(g == "none" || g == "int8" || g == "int4", r, qg, "must be none, int8 or int4");
  require(g == "none" || c.stage >= 2, r, qg, "needs sharding." + who + ".stage 2 or 3 (qgZ quantizes the "
          "reduce-scatter of every micro-batch's gradients)");
  c.quantized_gradients_bits = g == "none" ? 0 : g == "int8" ? 8 : 4;
  const std::string qb = "sharding." + who + ".quantization_block";
  c.quantization_block = r.get<int64_t>(qb, c.quantization_block,
      "elements per float32 scale of the quantized collectives");
  require(c.quantization_block >= 2 && c.quantization_block % 2 == 0 && c.quantization_block <= (int64_t{1} << 24),
          r, qb, "must be even, from 2 to 16777216");
  r.warn_if_ignored(c.quantized_weights_bits == 0 && c.quantized_gradients_bits == 0, qb,
                    "has no effect without quantized collectives: sharding." + who + ".quantized_weights and "
                    "sharding." + who + ".quantized_gradients are none");
  return c;
}

// `key`: an integer >= 1 (default 1), or auto, returned as 0 (one group per node).
int read_group_count(Reader& r, const std::string& key, const char* meaning, const std::string& what) {
  const std::string v = r.get<std::string>(key, "1", meaning);
  if (v == "auto") return 0;
  char* end = nullptr;
  const long x = std::strtol(v.c_str(), &end, 10);
  require(!v.empty() && *end == '\0' && x >= 1 && x <= 1 << 20, r, key, "must be auto (one group per node) or " + what);
  return static_cast<int>(x);
}

// sharding.<who>.replicate_degree: an integer >= 1, or auto (0: one group per node).
int read_replicate_degree(Reader& r, const std::string& who, const ShardingConfig& sc) {
  const std::string key = "sharding." + who + ".replicate_degree";
  const int R = read_group_count(r, key,
      "hybrid sharding (HSDP): replica groups; the model is sharded inside a group and replicated across groups (auto: "
      "one group per node)",
      "an integer >= 1 (the number of replica groups)");
  require(R == 1 || sc.stage >= 1, r, key,
          "needs sharding." + who + ".stage 1, 2 or 3: stage 0 already replicates everything on every rank");
  return R;
}

// sharding.<who>.hpz_partition_size: an integer >= 1 (1: off), or auto (0: one group per node).
void read_hpz(Reader& r, const std::string& who, ShardingConfig& sc, int replicate_degree) {
  const std::string key = "sharding." + who + ".hpz_partition_size";
  const int K = read_group_count(r, key,
      "stage 3, ZeRO++ hpZ: ranks of a secondary group (usually a node's) that keeps a copy of each gathered unit "
      "split K ways, so that its later gathers until the next update stay in the group (1: off; auto: one group per "
      "node)",
      "an integer >= 1 (ranks per secondary group; 1 turns hpZ off)");
  require(K == 1 || sc.stage == 3, r, key,
          "needs sharding." + who + ".stage 3: hpZ keeps a secondary copy of the parameters that stage 3 gathers");
  require(K == 1 || replicate_degree == 1, r, key,
          "cannot be combined with sharding." + who + ".replicate_degree (HSDP already keeps the gathers inside a "
          "replica group; set one of them to 1)");
  sc.hpz_partition_size = K;
}

// sharding.<who>.node_shared_gather takes a free pool slot before qwZ's int8 gather and
// hpZ's secondary copy are considered (UnitCollectives::start_shared_gather), so it would
// silently bypass them: refused, naming both keys.
void check_node_shared_gather(Reader& r, const std::string& who, const ShardingConfig& sc) {
  const std::string key = "sharding." + who + ".node_shared_gather";
  require(!sc.node_shared_gather || sc.quantized_weights_bits == 0, r, key,
          "cannot be combined with sharding." + who + ".quantized_weights int8 (qwZ): the node-shared gather "
          "bypasses the int8 weights whenever a pool slot is free (set one of them off)");
  require(!sc.node_shared_gather || sc.hpz_partition_size == 1, r, key,
          "cannot be combined with sharding." + who + ".hpz_partition_size other than 1 (hpZ): the node-shared "
          "gather bypasses hpZ's secondary copy whenever a pool slot is free (set one of them off)");
}

}  // namespace

void read_sharding(Reader& r, TrainConfig& c) {
  c.g_sharding = read_model_sharding(r, "generator");
  c.d_sharding = read_model_sharding(r, "discriminator");
  c.g_replicate_degree = read_replicate_degree(r, "generator", c.g_sharding);
  c.d_replicate_degree = read_replicate_degree(r, "discriminator", c.d_sharding);
  read_hpz(r, "generator", c.g_sharding, c.g_replicate_degree);
  read_hpz(r, "discriminator", c.d_sharding, c.d_replicate_degree);
  check_node_shared_gather(r, "generator", c.g_sharding);
  check_node_shared_gather(r, "discriminator", c.d_sharding);
}

void check_sharding_quantized_backend(Reader& r, const TrainConfig& c) {
  for (auto [who, sc] : {std::pair{"generator", &c.g_sharding}, std::pair{"discriminator", &c.d_sharding}}) {
    require(sc->quantized_gradients_bits == 0 || c.backend == "mpi", r,
            std::string("sharding.") + who + ".quantized_gradients",
            "needs dist.backend mpi: the NCCL backend has no all-to-all yet (set it to none)");
  }
}

void check_sharding_groups_backend(Reader& r, const TrainConfig& c) {
  for (auto [who, R] : {std::pair{"generator", c.g_replicate_degree}, std::pair{"discriminator", c.d_replicate_degree}}) {
    require(R == 1 || c.backend == "mpi", r, std::string("sharding.") + who + ".replicate_degree",
            "> 1 needs dist.backend mpi: the NCCL communicator cannot split into replica groups yet");
  }
  for (auto [who, K] : {std::pair{"generator", c.g_sharding.hpz_partition_size},
                        std::pair{"discriminator", c.d_sharding.hpz_partition_size}}) {
    require(K == 1 || c.backend == "mpi", r, std::string("sharding.") + who + ".hpz_partition_size",
            "needs dist.backend mpi: the NCCL communicator cannot split into secondary groups yet (set it to 1)");
  }
}

}  // namespace shardgan::config_sections
