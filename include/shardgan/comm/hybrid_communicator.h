#pragma once
/// Hybrid sharding (FSDP's HYBRID_SHARD / FSDP2's HSDP, `fully_shard` on a 2-D device mesh):
/// N ranks form R replica groups of G = N / R ranks. Parameters, gradients and optimizer
/// state are sharded G ways inside a group (ZeRO stages 1-3 as usual) and replicated across
/// the R groups, so that the all-gathers of forward and backward stay inside a group (a
/// node, by default) and only the all-reduce of each gradient shard crosses groups, once
/// per optimizer update (ShardedModel::reduce_across_replicas, as FSDP2 all-reduces only at
/// the last micro-batch): a stage-2/3 D that reduces after its real and after its fake
/// backward, or over several micro-batches, accumulates its shard inside the group first.
/// DeepSpeed ZeRO++'s hpZ (Wang et al. 2023) is the related scheme that keeps the primary
/// shards global and only a secondary copy per node.
#include <memory>
#include <string>

#include "shardgan/comm/communicator.h"

namespace shardgan {

/// The communicator a sharded model sees under HSDP. Its rank() and world_size() are those
/// of the shard group; all_gather, reduce_scatter, all_reduce, broadcast and barrier run
/// inside the group. all_reduce_replicas(shard, op) then all-reduces a reduced shard
/// (numel S) across the replica groups with the same `op`, so that every group ends with
/// the same shard (kAvg: averaged over all N ranks, as group sizes are equal). Dtypes and
/// devices are those the wrapped communicators accept.
///
/// stats() counts the shard group's traffic; replicate_group().stats() the cross-group
/// all-reduces.
class HybridCommunicator final : public Communicator {
 public:
  /// `shard_group`: the G ranks of this rank's replica group. `replicate_group`: the R ranks
  /// (one per group) that hold the same shard as this one, ordered by group index.
  HybridCommunicator(std::unique_ptr<Communicator> shard_group,
                     std::unique_ptr<Communicator> replicate_group);

  int rank() const override { return shard_->rank(); }
  int world_size() const override { return shard_->world_size(); }
  std::string backend() const override { return shard_->backend(); }
  int replica_rank() const override { return replicate_->rank(); }
  int replicate_degree() const override { return replicate_->world_size(); }

  void all_gather(at::Tensor& full, const at::Tensor& shard) override;
  std::unique_ptr<Work> all_gather_async(at::Tensor& full, const at::Tensor& shard) override;
  /// Inside the shard group only; all_reduce_replicas completes the reduction over N.
  void reduce_scatter(at::Tensor& shard, const at::Tensor& full, ReduceOp op) override;
  std::unique_ptr<Work> reduce_scatter_async(at::Tensor& shard, const at::Tensor& full,
                                             ReduceOp op) override;
  /// Collective over all N ranks: all-reduce of `t` with the same shard of the other
  /// groups (the replicate group; blocking, with its timeout).
  void all_reduce_replicas(at::Tensor& t, ReduceOp op) override;
  /// Inside the shard group only.
  std::unique_ptr<Work> all_to_all_async(at::Tensor& out, const at::Tensor& in) override;  ///< in the shard group
  void all_reduce(at::Tensor& t, ReduceOp op) override;
  void broadcast(at::Tensor& t, int root) override;
  void barrier() override;

  /// The shard group's communicator (this object's stats() count what went through it).
  Communicator& shard_group() { return *shard_; }
  /// The cross-group communicator; its stats() count what crossed groups.
  Communicator& replicate_group() { return *replicate_; }

 private:
  std::unique_ptr<Communicator> shard_;
  std::unique_ptr<Communicator> replicate_;
};

/// How the ranks are put into replica groups.
struct HsdpLayout {
  int replicate_degree = 1;   ///< R
  int group_size = 1;         ///< G = N / R
  int group = 0;              ///< this rank's replica group, in [0, R)
  int group_rank = 0;         ///< this rank's position in its group, in [0, G)
  bool by_node = false;       ///< the groups are the launcher's nodes
};

/// This rank's position on its node as the launcher reports it: Open MPI's
/// OMPI_COMM_WORLD_LOCAL_RANK and OMPI_COMM_WORLD_LOCAL_SIZE (mpirun, also inside an sbatch
/// allocation, where the inherited SLURM_LOCALID is wrong), else Slurm's SLURM_LOCALID with
/// the size from SLURM_STEP_TASKS_PER_NODE and SLURM_NODEID (srun; -1 if those are missing),
/// else {-1, -1}. Local; reads the environment only.
std::pair<int, int> launcher_local_rank_and_size();

/// The task count of node `node` in Slurm's compressed list (SLURM_STEP_TASKS_PER_NODE,
/// e.g. "2(x3),1": nodes 0-2 run 2 tasks, node 3 runs 1), or -1 if `tasks_per_node` is null
/// or malformed, or `node` is negative or past its end. Local, pure.
int slurm_tasks_on_node(const char* tasks_per_node, int node);

/// Collective over `world` (one all-gather of 2 int64 per rank). Places the N ranks into R
/// groups. `replicate_degree` R >= 1 must divide N; 0 means one group per node. When every
/// node holds N / R consecutive ranks (as the launcher's local ranks and sizes show:
/// `--map-by slot`, Slurm's block distribution), a group is a node's ranks (by_node). Else
/// groups are blocks of N / R consecutive ranks. Throws std::invalid_argument, naming
/// `key`, when R does not divide N, or R = 0 and the nodes are not uniform or unknown.
HsdpLayout hsdp_layout(Communicator& world, int replicate_degree, std::pair<int, int> local,
                       const std::string& key);

/// Collective over `world` (two Communicator::split calls, so two barriers). Builds the
/// HybridCommunicator of `layout` from `world`'s backend. Throws CollectiveError when the
/// backend cannot split (NCCL here).
std::unique_ptr<HybridCommunicator> make_hybrid_communicator(Communicator& world, const HsdpLayout& layout);

}  // namespace shardgan
