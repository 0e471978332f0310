#include "shardgan/util/threads.h"

#include <sched.h>

#include <algorithm>
#include <thread>

#include <ATen/Parallel.h>
#ifdef _OPENMP
#include <omp.h>
#endif

namespace shardgan {

int default_intra_op_threads(int requested, int cores, int ranks_on_node, int affinity_cpus) {
  if (requested > 0) return requested;
  const int share = std::max(1, cores) / std::max(1, ranks_on_node);
  return std::max(1, std::min(share, std::max(1, affinity_cpus)));
}

void use_one_intra_op_thread() {
  // ATen sets each thread's OpenMP thread count to the process's on the thread's first
  // parallel op; run that now, so that the count set below stays.
  (void)at::get_num_threads();
#ifdef _OPENMP
  omp_set_num_threads(1);
#endif
}

int affinity_cpu_count() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

std::string core_binding_warning(int rank, int cores, int ranks_on_node, int affinity_cpus) {
  const int share = std::max(1, cores) / std::max(1, ranks_on_node);
  if (affinity_cpus >= share) return "";
  return "rank " + std::to_string(rank) + " may run on " + std::to_string(affinity_cpus) +
         " CPU(s), but its share of this node is " + std::to_string(share) + " (" + std::to_string(cores) +
         " cores, " + std::to_string(ranks_on_node) +
         " ranks): mpirun binds each rank to one core when it starts 1 or 2 ranks. Add `--bind-to none` "
         "(or `--map-by slot:PE=" + std::to_string(share) + "`) to mpirun to give each rank its share";
}

}  // namespace shardgan
