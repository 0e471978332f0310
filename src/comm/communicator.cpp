#include "shardgan/comm/communicator.h"

namespace shardgan {
namespace {

struct CompletedWork final : Work {
  void wait() override {}
};

}  // namespace

std::unique_ptr<Work> Communicator::all_gather_async(at::Tensor& full, const at::Tensor& shard) {
  all_gather(full, shard);
  return std::make_unique<CompletedWork>();
}

std::unique_ptr<Work> Communicator::reduce_scatter_async(at::Tensor& shard, const at::Tensor& full,
                                                        ReduceOp op) {
  reduce_scatter(shard, full, op);
  return std::make_unique<CompletedWork>();
}

}  // namespace shardgan
