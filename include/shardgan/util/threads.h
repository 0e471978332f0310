#pragma once
/// The number of intra-op (OpenMP) threads a rank uses when train.threads is 0.
///
/// A rank gets its share of the node's cores (cores / ranks on the node), but never more
/// threads than CPUs it may run on. mpirun binds each rank to one core when it starts one or
/// two ranks (Open MPI's default `--bind-to core`): two threads on one bound core only take
/// turns. That cost a 1-rank BigGAN step 1.9 s against 0.96 s unbound on the 2-core machines
/// (docs/benchmarks-peers.md). PyTorch's launchers size their threads the same way
/// (`len(os.sched_getaffinity(0)) // local_world_size`).

#include <string>

namespace shardgan {

/// Pure: `requested` when > 0; else max(1, min(cores / ranks_on_node, affinity_cpus)).
/// cores, ranks_on_node and affinity_cpus count CPUs and ranks (values < 1 read as 1).
int default_intra_op_threads(int requested, int cores, int ranks_on_node, int affinity_cpus);

/// Pure: the start-up warning of a rank whose CPU affinity mask holds fewer CPUs than its
/// share of the node (cores / ranks_on_node), naming the fix (`--bind-to none`, or
/// `--map-by slot:PE=<share>`); empty when the rank has its share. `rank` names the rank.
/// Open MPI binds each rank to one core when it starts one or two, which made a 1-rank
/// width-128 DCGAN step 2.03 s against 1.24 s unbound on a 2-core machine.
std::string core_binding_warning(int rank, int cores, int ranks_on_node, int affinity_cpus);

/// Call first on a helper thread that runs LibTorch ops (the data prefetcher, the offload
/// read-ahead). Its parallel regions then run on the thread itself. Otherwise OpenMP gives
/// that thread a team of its own. libgomp then manages more threads than there are CPUs, so
/// its workers stop spinning between parallel regions, and every region of the compute
/// thread waits for a futex wake-up. Local: this thread's OpenMP thread count only.
void use_one_intra_op_thread();

/// CPUs in this process's affinity mask (sched_getaffinity), or the hardware's CPU count if
/// that call fails. Local.
int affinity_cpu_count();

}  // namespace shardgan
