// Memory scaling of one ZeRO configuration: run under `mpirun -np N` with
//   bench_memory_scaling <stage> [key=value config overrides...]
// Prints one JSON object (rank 0): model-state bytes per rank from the sharding layer's
// accounting, the ZeRO paper's formula for them (float32 Adam: 16, 8+8/N, 4+12/N, 16/N
// bytes per parameter), the peak RSS over ranks, the median step time, and the sharding
// traffic per step. benchmarks/memory_scaling.sh sweeps stages and world sizes, and HSDP:
// with sharding.{generator,discriminator}.replicate_degree=R the state is sharded over
// groups of G = N/R ranks (formula with G for N) and the traffic is split into the part
// inside a group and the part across groups (comm_bytes_* of metrics.jsonl).
#include <mpi.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "shardgan/comm/mpi_communicator.h"
#include "shardgan/train/trainer.h"
#include "registry.h"

// This file's names live in a namespace of their own (benchmarks/registry.h).
namespace SHARDGAN_UNITY_ID {

using namespace shardgan;

int bench_main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  torch::set_num_threads(1);
  const int stage = argc > 1 ? std::atoi(argv[1]) : 3;
  std::vector<std::string> overrides = {
      "data.source=synthetic", "data.synthetic_size=256", "train.global_batch=16",
      "model.z_dim=64",        "model.g_width=96",        "model.d_width=96",
      "run.dir=",              "sharding.generator.stage=" + std::to_string(stage),
      "sharding.discriminator.stage=" + std::to_string(stage)};
  int steps = 4, replicate_degree = 1;
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("steps=", 0) == 0) {
      steps = std::atoi(a.c_str() + 6);
    } else if (a.rfind("replicate_degree=", 0) == 0) {  // both models
      replicate_degree = std::atoi(a.c_str() + 17);
      overrides.push_back("sharding.generator." + a);
      overrides.push_back("sharding.discriminator." + a);
    } else {
      overrides.push_back(a);
    }
  }
  MpiCommunicator comm(MPI_COMM_WORLD, 600.0);
  TrainConfig cfg = parse_config("", "bench_memory_scaling", overrides);
  Trainer trainer(cfg, comm);
  const int n = comm.world_size();
  int64_t psi = 0;
  for (ShardedModel* m : {&trainer.generator(), &trainer.discriminator()}) {
    for (auto& u : m->units()) psi += u->numel();
  }
  trainer.train_step();  // warm-up (allocations, first gathers)
  std::vector<double> times;
  comm.reset_stats();
  int64_t world_bytes = 0, group_bytes = 0, replicate_bytes = 0;
  for (int i = 0; i < steps; ++i) {
    const StepMetrics m = trainer.train_step();
    times.push_back(m.step_time_s);
    world_bytes += m.comm_bytes_world;
    group_bytes += m.comm_bytes_shard_group;
    replicate_bytes += m.comm_bytes_replicate;
  }
  std::sort(times.begin(), times.end());
  const CommStats s = comm.stats();
  MemoryStats g = trainer.memory_stats(trainer.generator()), d = trainer.memory_stats(trainer.discriminator());
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  long rss_kb = ru.ru_maxrss, max_rss_kb = 0;
  MPI_Reduce(&rss_kb, &max_rss_kb, 1, MPI_LONG, MPI_MAX, 0, MPI_COMM_WORLD);
  const double shards = static_cast<double>(n) / replicate_degree;  // ranks a model is sharded over
  const double formula[] = {16.0 * psi, 8.0 * psi + 8.0 * psi / shards, 4.0 * psi + 12.0 * psi / shards,
                            16.0 * psi / shards};
  if (comm.rank() == 0) {
    nlohmann::json j = {
        {"stage", stage},
        {"world_size", n},
        {"replicate_degree", replicate_degree},
        {"params", psi},
        {"model_state_bytes_per_rank", g.model_state_bytes() + d.model_state_bytes()},
        {"formula_bytes_per_rank", formula[stage]},
        {"peak_gathered_param_bytes", g.peak_full_param_bytes + d.peak_full_param_bytes},
        {"peak_rss_bytes", static_cast<int64_t>(max_rss_kb) * 1024},
        {"step_time_s_median", times[times.size() / 2]},
        // Includes SyncBatchNorm's and the metrics' small all-reduces.
        {"traffic_bytes_per_step",
         (s.all_gather_bytes + s.reduce_scatter_bytes + 2 * s.all_reduce_bytes) / steps},
        // metrics.jsonl's collective volume per step on rank 0 (the full size of each
        // collective, as CommStats counts): on the world communicator (SyncBatchNorm, votes,
        // and the models' collectives without HSDP), inside the replica groups, across them.
        {"comm_bytes_world_per_step", world_bytes / steps},
        {"comm_bytes_shard_group_per_step", group_bytes / steps},
        {"comm_bytes_replicate_per_step", replicate_bytes / steps},
        {"global_batch", cfg.global_batch},
        {"steps_timed", steps}};
    std::printf("%s\n", j.dump().c_str());
  }
  MPI_Finalize();
  return 0;
}

}  // namespace SHARDGAN_UNITY_ID

SHARDGAN_BENCHMARK(bench_memory_scaling)
