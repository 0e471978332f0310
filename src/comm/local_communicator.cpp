#include "shardgan/comm/local_communicator.h"

#include <torch/torch.h>

#include "completed_work.h"

namespace shardgan {
namespace {

void same_numel(const char* op, const at::Tensor& a, const at::Tensor& b) {
  if (a.numel() != b.numel() || a.scalar_type() != b.scalar_type()) {
    throw CollectiveError(std::string(op) + " (local, world size 1): tensors of " +
                          std::to_string(a.numel()) + " and " + std::to_string(b.numel()) +
                          " elements or of different dtypes");
  }
}

}  // namespace

std::unique_ptr<Work> LocalCommunicator::all_to_all_async(at::Tensor& out, const at::Tensor& in) {
  same_numel("all_to_all", out, in);
  ++stats_.all_to_all_calls;
  stats_.all_to_all_bytes += in.numel() * in.element_size();
  torch::NoGradGuard no_grad;
  out.copy_(in);
  return std::make_unique<detail::CompletedWork>();
}

void LocalCommunicator::all_gather(at::Tensor& full, const at::Tensor& shard) {
  same_numel("all_gather", full, shard);
  ++stats_.all_gather_calls;
  stats_.all_gather_bytes += full.numel() * full.element_size();
  if (!full.is_same(shard) && full.data_ptr() != shard.data_ptr()) full.copy_(shard.view_as(full));
}

void LocalCommunicator::reduce_scatter(at::Tensor& shard, const at::Tensor& full, ReduceOp op) {
  same_numel("reduce_scatter", full, shard);
  ++stats_.reduce_scatter_calls;
  stats_.reduce_scatter_bytes += full.numel() * full.element_size();
  if (shard.data_ptr() != full.data_ptr()) shard.copy_(full.view_as(shard));
}

void LocalCommunicator::all_reduce(at::Tensor& t, ReduceOp op) {
  ++stats_.all_reduce_calls;
  stats_.all_reduce_bytes += t.numel() * t.element_size();
}

void LocalCommunicator::broadcast(at::Tensor& t, int root) {
  if (root != 0) throw CollectiveError("broadcast (local, world size 1): root " + std::to_string(root));
  ++stats_.broadcast_calls;
  stats_.broadcast_bytes += t.numel() * t.element_size();
}

void LocalCommunicator::barrier() { ++stats_.barrier_calls; }

std::unique_ptr<Communicator> LocalCommunicator::split(int, int) {
  auto c = std::make_unique<LocalCommunicator>();
  c->set_timeout_s(timeout_s_);
  return c;
}

}  // namespace shardgan
