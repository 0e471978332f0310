#include "shardgan/comm/hybrid_communicator.h"

#include <cstdlib>
#include <cstring>
#include <map>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include <torch/torch.h>

#include "comm/counted.h"

namespace shardgan {
using detail::counted;
namespace {

int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return -1;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  return (*end == '\0' && x >= 0) ? static_cast<int>(x) : -1;
}

}  // namespace

HybridCommunicator::HybridCommunicator(std::unique_ptr<Communicator> shard_group,
                                       std::unique_ptr<Communicator> replicate_group)
    : shard_(std::move(shard_group)), replicate_(std::move(replicate_group)) {
  timeout_s_ = shard_->timeout_s();
}

void HybridCommunicator::all_gather(at::Tensor& full, const at::Tensor& shard) {
  counted(stats_, *shard_, [&] { shard_->all_gather(full, shard); });
}

std::unique_ptr<Work> HybridCommunicator::all_gather_async(at::Tensor& full, const at::Tensor& shard) {
  return counted(stats_, *shard_, [&] { return shard_->all_gather_async(full, shard); });
}

void HybridCommunicator::reduce_scatter(at::Tensor& shard, const at::Tensor& full, ReduceOp op) {
  reduce_scatter_async(shard, full, op)->wait();
}

std::unique_ptr<Work> HybridCommunicator::reduce_scatter_async(at::Tensor& shard, const at::Tensor& full,
                                                               ReduceOp op) {
  return counted(stats_, *shard_, [&] { return shard_->reduce_scatter_async(shard, full, op); });
}

std::unique_ptr<Work> HybridCommunicator::all_to_all_async(at::Tensor& out, const at::Tensor& in) {
  return counted(stats_, *shard_, [&] { return shard_->all_to_all_async(out, in); });
}

void HybridCommunicator::all_reduce_replicas(at::Tensor& t, ReduceOp op) { replicate_->all_reduce(t, op); }

void HybridCommunicator::all_reduce(at::Tensor& t, ReduceOp op) {
  counted(stats_, *shard_, [&] { shard_->all_reduce(t, op); });
}

void HybridCommunicator::broadcast(at::Tensor& t, int root) {
  counted(stats_, *shard_, [&] { shard_->broadcast(t, root); });
}

void HybridCommunicator::barrier() {
  counted(stats_, *shard_, [&] { shard_->barrier(); });
}

std::pair<int, int> launcher_local_rank_and_size() {
  const int lr = env_int("OMPI_COMM_WORLD_LOCAL_RANK"), ls = env_int("OMPI_COMM_WORLD_LOCAL_SIZE");
  if (lr >= 0 && ls > 0) return {lr, ls};
  const int slurm = env_int("SLURM_LOCALID");
  if (slurm >= 0) return {slurm, slurm_tasks_on_node(std::getenv("SLURM_STEP_TASKS_PER_NODE"), env_int("SLURM_NODEID"))};
  return {-1, -1};
}

int slurm_tasks_on_node(const char* tasks_per_node, int node) {
  if (!tasks_per_node || node < 0) return -1;
  // Slurm's compressed list: "2(x3),1" = nodes 0-2 run 2 tasks each, node 3 runs 1.
  const char* p = tasks_per_node;
  for (int first = 0;;) {
    char* end = nullptr;
    const long tasks = std::strtol(p, &end, 10);
    if (end == p || tasks <= 0) return -1;
    long repeat = 1;
    if (std::strncmp(end, "(x", 2) == 0) {
      p = end + 2;
      repeat = std::strtol(p, &end, 10);
      if (end == p || *end != ')' || repeat <= 0) return -1;
      ++end;
    }
    if (node < first + repeat) return static_cast<int>(tasks);
    first += static_cast<int>(repeat);
    if (*end != ',') return -1;
    p = end + 1;
  }
}

HsdpLayout hsdp_layout(Communicator& world, int replicate_degree, std::pair<int, int> local,
                       const std::string& key) {
  const int n = world.world_size(), rank = world.rank();
  // Every rank's (local rank, local size); a node is recognized as a run of consecutive
  // ranks r0.. r0 + size - 1 whose local ranks are 0.. size - 1 and sizes all equal size.
  at::Tensor mine = torch::tensor({static_cast<int64_t>(local.first), static_cast<int64_t>(local.second)});
  at::Tensor all = torch::empty({2 * n}, torch::kLong);
  world.all_gather(all, mine);
  auto a = all.accessor<int64_t, 1>();
  int nodes = 0, node_size = -1;
  bool uniform = true;
  for (int r = 0; r < n && uniform;) {
    const int64_t size = a[2 * r + 1];
    if (size <= 0 || r + size > n || (node_size >= 0 && size != node_size)) {
      uniform = false;
      break;
    }
    for (int64_t i = 0; i < size; ++i) {
      if (a[2 * (r + i)] != i || a[2 * (r + i) + 1] != size) uniform = false;
    }
    node_size = static_cast<int>(size);
    ++nodes;
    r += static_cast<int>(size);
  }
  HsdpLayout l;
  if (replicate_degree == 0) {
    if (!uniform) {
      throw std::invalid_argument(
          key + "=auto (one replica group per node): the launcher's local ranks do not show " +
          std::to_string(n) + " ranks in equal blocks of consecutive ranks per node (OMPI_COMM_WORLD_LOCAL_RANK/"
          "LOCAL_SIZE under mpirun, SLURM_LOCALID/STEP_TASKS_PER_NODE/NODEID under srun). Launch with mpirun "
          "--map-by slot or srun --distribution=block, or set " + key + " to the number of groups");
    }
    replicate_degree = nodes;
  }
  if (replicate_degree < 1 || n % replicate_degree != 0) {
    throw std::invalid_argument(key + "=" + std::to_string(replicate_degree) + " must divide the world size " +
                                std::to_string(n) + " (each replica group holds world size / " + key + " ranks)");
  }
  l.replicate_degree = replicate_degree;
  l.group_size = n / replicate_degree;
  l.group = rank / l.group_size;
  l.group_rank = rank % l.group_size;
  l.by_node = uniform && nodes == replicate_degree;
  return l;
}

std::unique_ptr<HybridCommunicator> make_hybrid_communicator(Communicator& world, const HsdpLayout& l) {
  auto shard = world.split(l.group, l.group_rank);
  auto replicate = world.split(l.group_rank, l.group);
  return std::make_unique<HybridCommunicator>(std::move(shard), std::move(replicate));
}

}  // namespace shardgan
