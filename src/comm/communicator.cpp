#include "shardgan/comm/communicator.h"

#include <sstream>
#include <string>

#include "completed_work.h"

namespace shardgan {
using detail::CompletedWork;

void Communicator::check_block_sizes(const char* op, const at::Tensor& full,
                                     const at::Tensor& shard) const {
  if (full.numel() == shard.numel() * world_size() && full.scalar_type() == shard.scalar_type()) return;
  std::ostringstream s;
  s << op << " on rank " << rank() << ": full numel " << full.numel() << " must be shard numel "
    << shard.numel() << " x world size " << world_size() << " with equal dtypes";
  throw CollectiveError(s.str());
}

std::unique_ptr<Work> Communicator::all_to_all_async(at::Tensor&, const at::Tensor&) {
  throw CollectiveError("all_to_all on rank " + std::to_string(rank()) + ": the " + backend() +
                        " backend has no all-to-all (needed for sharding.<model>.quantized_gradients); "
                        "use dist.backend=mpi or quantized_gradients: none");
}

std::unique_ptr<Work> Communicator::send_recv_async(const std::vector<PeerBuffer>&, const std::vector<PeerBuffer>&) {
  throw CollectiveError("send_recv on rank " + std::to_string(rank()) + ": the " + backend() +
                        " backend has no point-to-point path (needed for train.placement: split); "
                        "use dist.backend=mpi or train.placement: shared");
}

std::unique_ptr<Communicator> Communicator::split(int, int) {
  throw CollectiveError("split on rank " + std::to_string(rank()) + ": the " + backend() +
                        " backend cannot split its communicator (needed for hybrid sharding, "
                        "sharding.<model>.replicate_degree > 1); use dist.backend=mpi");
}

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
