#pragma once
/// A world-size-1 Communicator that makes no MPI calls: every collective is the identity
/// (or a copy). Tools that build a model outside mpirun (shardgan-ckpt sample and export)
/// use it; it needs no MPI_Init.
#include "shardgan/comm/communicator.h"

namespace shardgan {

class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  std::string backend() const override { return "local"; }

  /// Copies `shard` into `full` (same numel); throws CollectiveError otherwise.
  void all_gather(at::Tensor& full, const at::Tensor& shard) override;
  /// Copies `full` into `shard` (the reduction over one rank is the identity for sum,
  /// average and max).
  void reduce_scatter(at::Tensor& shard, const at::Tensor& full, ReduceOp op) override;
  std::unique_ptr<Work> all_to_all_async(at::Tensor& out, const at::Tensor& in) override;  ///< a copy
  void all_reduce(at::Tensor& t, ReduceOp op) override;
  void broadcast(at::Tensor& t, int root) override;
  void barrier() override;
  /// Another LocalCommunicator (the one rank is its own group, whatever the color).
  std::unique_ptr<Communicator> split(int color, int key) override;
};

}  // namespace shardgan
