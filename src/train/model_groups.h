#pragma once
// The communicators a model shards over besides the world's, built by the trainer before
// the models. Private to src/train.
#include <memory>
#include <string>

#include "shardgan/comm/communicator.h"

namespace shardgan {

struct TrainConfig;

/// sharding.<who>.replicate_degree R (0: one group per node): collective over `world`, the
/// ranks the model runs on (the world's, or its group's under split placement; the
/// layout's all-gather and two splits) unless R is 1; then nullptr. The HSDP communicator of
/// this rank (hybrid_communicator.h), or nullptr when the layout gives one group. Throws
/// ConfigError starting with `source` and naming the key when R does not divide the world
/// size or the nodes are not uniform.
std::unique_ptr<Communicator> hsdp_communicator(Communicator& world, int replicate_degree, const std::string& who,
                                                const std::string& source);

/// sharding.<who>.hpz_partition_size K (0: one group per node): collective over `world`,
/// the ranks the model shards over (the world's, or its group's under split placement;
/// the layout's all-gather and a split), unless K is 1; then nullptr. This rank's hpZ
/// secondary group (ShardedModel::set_secondary_group), or nullptr when `auto` finds one
/// rank per node. Throws ConfigError starting with `source` and naming the key when K
/// does not divide `world`'s size (on every rank, before any collective) or the nodes are
/// not uniform.
std::unique_ptr<Communicator> hpz_secondary_group(Communicator& world, int partition_size, const std::string& who,
                                                  const std::string& source);

/// train.placement split on `world_size` ranks with G on `generator_ranks`: throws
/// ConfigError naming the key when a model's replicate_degree or hpz_partition_size does
/// not divide its group. Local: call it on every rank before the groups are split, since
/// only a group's ranks build that group's replica and secondary groups.
void check_split_group_divisors(const TrainConfig& cfg, int world_size, int generator_ranks);

}  // namespace shardgan
