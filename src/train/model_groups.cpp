// The communicators a model shards over besides the world's (model_groups.h): HSDP's
// replica groups and hpZ's secondary groups, both laid out by hsdp_layout.
#include "train/model_groups.h"

#include <tuple>

#include <spdlog/spdlog.h>

#include "shardgan/comm/hybrid_communicator.h"
#include "shardgan/train/config.h"

namespace shardgan {

std::unique_ptr<Communicator> hsdp_communicator(Communicator& world, int replicate_degree, const std::string& who,
                                                const std::string& source) {
  if (replicate_degree == 1) return nullptr;
  const std::string key = "sharding." + who + ".replicate_degree";
  HsdpLayout l;
  try {
    l = hsdp_layout(world, replicate_degree, launcher_local_rank_and_size(), key);
  } catch (const std::invalid_argument& e) {
    throw ConfigError(source + ": " + e.what());
  }
  if (world.rank() == 0) {
    spdlog::info("{}: hybrid sharding, {} replica groups of {} ranks ({})", who, l.replicate_degree, l.group_size,
                 l.by_node ? "one per node" : "blocks of consecutive ranks");
  }
  if (l.replicate_degree == 1) return nullptr;
  return make_hybrid_communicator(world, l);
}

std::unique_ptr<Communicator> hpz_secondary_group(Communicator& world, int partition_size, const std::string& who,
                                                  const std::string& source) {
  if (partition_size == 1) return nullptr;
  const std::string key = "sharding." + who + ".hpz_partition_size";
  const int n = world.world_size();
  if (partition_size > 1 && n % partition_size != 0) {
    throw ConfigError(source + ": key '" + key + "' is " + std::to_string(partition_size) +
                      ", which does not divide the world size " + std::to_string(n) +
                      " (each secondary group holds that many consecutive ranks; use a divisor, e.g. the ranks per "
                      "node, or 1 for off)");
  }
  HsdpLayout l;
  try {
    l = hsdp_layout(world, partition_size == 0 ? 0 : n / partition_size, launcher_local_rank_and_size(), key);
  } catch (const std::invalid_argument&) {
    throw ConfigError(source + ": key '" + key + "' is auto (one secondary group per node), but the "
                      "launcher's local ranks do not show equal blocks of consecutive ranks per node; launch with "
                      "mpirun --map-by slot or srun --distribution=block, or set it to the ranks per node");
  }
  if (l.group_size == 1) {  // auto with one rank per node: each rank would keep whole units
    if (world.rank() == 0) spdlog::info("{}: hpZ off: {} is auto and every node runs one rank", who, key);
    return nullptr;
  }
  if (world.rank() == 0) {
    spdlog::info("{}: hpZ, secondary groups of {} ranks ({}): gathers after a unit's first one since its last "
                 "update stay in the group", who, l.group_size, l.by_node ? "one per node" : "blocks of consecutive ranks");
  }
  return world.split(l.group, l.group_rank);
}

void check_split_group_divisors(const TrainConfig& cfg, int world_size, int generator_ranks) {
  const int k = generator_ranks;
  for (auto [who, R, K, ranks, what] :
       {std::tuple{"generator", cfg.g_replicate_degree, cfg.g_sharding.hpz_partition_size, k,
                   "G's ranks (placement.generator_ranks)"},
        std::tuple{"discriminator", cfg.d_replicate_degree, cfg.d_sharding.hpz_partition_size, world_size - k,
                   "D's ranks (the world size less placement.generator_ranks)"}}) {
    if (R > 1 && ranks % R != 0) {
      throw ConfigError(cfg.source + ": key 'sharding." + who + ".replicate_degree' is " + std::to_string(R) +
                        ", which does not divide " + what + " " + std::to_string(ranks) +
                        " (each replica group holds that many ranks' share of them; use a divisor, or 1 for off)");
    }
    if (K > 1 && ranks % K != 0) {
      throw ConfigError(cfg.source + ": key 'sharding." + who + ".hpz_partition_size' is " + std::to_string(K) +
                        ", which does not divide " + what + " " + std::to_string(ranks) +
                        " (each secondary group holds that many of the group's consecutive ranks; use a divisor, or 1 "
                        "for off)");
    }
  }
}

}  // namespace shardgan
