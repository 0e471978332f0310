#pragma once
/// A communicator that stands in for rank 0 of `world_size` ranks and moves no data: what
/// one rank allocates can be measured without the other ranks and without holding a real
/// rank's share of the model (the activation probe of the memory pre-flight,
/// train/activation_probe.h). Values are stand-ins: an all-gather tiles this rank's shard,
/// a reduce-scatter keeps block 0, a sum all-reduce multiplies by the world size. Buffers
/// are allocated as MpiCommunicator allocates them: a reduce-scatter holds the peers'
/// blocks ((N - 1) x shard elements in the input dtype) until wait(), a 16-bit all-reduce
/// stages through float32. Local, no MPI; CPU or device tensors alike.
#include "shardgan/comm/communicator.h"

namespace shardgan {

class ShadowCommunicator final : public Communicator {
 public:
  /// `world_size` >= 1; throws std::invalid_argument otherwise.
  explicit ShadowCommunicator(int world_size);
  int rank() const override { return 0; }
  int world_size() const override { return world_size_; }
  std::string backend() const override { return "shadow"; }

  /// Every block of `full` becomes `shard` (sizes checked as for a real all-gather).
  void all_gather(at::Tensor& full, const at::Tensor& shard) override;
  /// Block 0 of `full` into `shard`, with the receive buffer a real reduce-scatter holds.
  void reduce_scatter(at::Tensor& shard, const at::Tensor& full, ReduceOp op) override;
  /// As reduce_scatter, the receive buffer held until wait().
  std::unique_ptr<Work> reduce_scatter_async(at::Tensor& shard, const at::Tensor& full, ReduceOp op) override;
  /// kSum multiplies by world_size(); kAvg and kMax leave `t` (16-bit through float32).
  /// Every block of `out` becomes block 0 of `in` (a stand-in, sizes checked).
  std::unique_ptr<Work> all_to_all_async(at::Tensor& out, const at::Tensor& in) override;
  void all_reduce(at::Tensor& t, ReduceOp op) override;
  void broadcast(at::Tensor& t, int root) override {}
  void barrier() override {}

 private:
  int world_size_;
};

}  // namespace shardgan
