// The placement section of the training configuration (config_sections.h): split
// placement's keys, its rules against the other sections, and G's rank count.
#include <algorithm>
#include <cmath>

#include "shardgan/train/config_sections.h"

namespace shardgan {
namespace config_sections {
namespace {

// Above any world shardgan runs on; keeps the count well inside int.
constexpr double kMaxGeneratorRanks = 1 << 20;

}  // namespace

void read_placement(Reader& r, TrainConfig& c) {
  const bool shared = c.placement == "shared";
  const char* ignored = "has no effect with train.placement shared: it configures split placement only";
  c.generator_ranks = r.get<double>("placement.generator_ranks", c.generator_ranks,
      "train.placement split: G's ranks K, a count >= 1 or a fraction in (0, 1) of the world size");
  require(c.generator_ranks > 0 && std::isfinite(c.generator_ranks) &&
              (c.generator_ranks < 1 || c.generator_ranks == std::floor(c.generator_ranks)),
          r, "placement.generator_ranks", "must be a whole number of ranks >= 1 or a fraction in (0, 1)");
  require(c.generator_ranks <= kMaxGeneratorRanks, r, "placement.generator_ranks",
          "must be at most 1048576 (a count of ranks; the world size bounds it at the start)");
  r.warn_if_ignored(shared, "placement.generator_ranks", ignored);
  c.defer_figures = r.get<bool>("placement.defer_figures", c.defer_figures,
      "train.placement split: true waits for a step's losses, NaN/Inf verdicts and preemption votes after the next "
      "step (neither group waits for the other; logs, aborts and stops come a step later); false at its end");
  r.warn_if_ignored(shared, "placement.defer_figures", ignored);
}

void check_split(Reader& r, const TrainConfig& c) {
  if (c.placement != "split") return;
  for (auto [who, K] : {std::pair{"generator", c.g_sharding.hpz_partition_size},
                        std::pair{"discriminator", c.d_sharding.hpz_partition_size}}) {
    require(K != 0, r, std::string("sharding.") + who + ".hpz_partition_size",
            "auto (one secondary group per node) is not taken with train.placement split: give the secondary "
            "group's size in ranks, a divisor of the model's group (or 1 for off)");
  }
  require(c.backend == "mpi", r, "train.placement",
          "split needs dist.backend mpi: the images cross between the groups point to point, which the NCCL "
          "backend does not offer yet (set train.placement: shared)");
  for (auto [who, R] : {std::pair{"generator", c.g_replicate_degree},
                        std::pair{"discriminator", c.d_replicate_degree}}) {
    require(R != 0, r, std::string("sharding.") + who + ".replicate_degree",
            "auto (one replica group per node) is not taken with train.placement split: give the number of "
            "replica groups of the model's ranks, a divisor of them (or 1 for off)");
  }
}

}  // namespace config_sections

int split_generator_ranks(const TrainConfig& cfg, int world_size) {
  // Bounded by the world size while still a double, before the narrowing cast to int.
  if (cfg.generator_ranks >= 1) {
    return static_cast<int>(std::min(cfg.generator_ranks, static_cast<double>(std::max(world_size, 1))));
  }
  return std::clamp(static_cast<int>(std::lround(cfg.generator_ranks * world_size)), 1, std::max(world_size - 1, 1));
}

}  // namespace shardgan
