#include "shardgan/comm/shadow_communicator.h"

#include <stdexcept>
#include <string>

#include <torch/torch.h>

#include "completed_work.h"
#include "reduced_float.h"

namespace shardgan {
using detail::is_16bit_float;
namespace {

// Holds a reduce-scatter's receive buffer (the peers' blocks) and its result until wait(),
// as MpiWork does, then writes the result into the shard.
class ShadowWork final : public Work {
 public:
  ShadowWork(at::Tensor shard, at::Tensor recv, at::Tensor result)
      : shard_(std::move(shard)), recv_(std::move(recv)), result_(std::move(result)) {}
  ~ShadowWork() override { wait(); }
  void wait() override {
    if (!recv_.defined()) return;
    shard_.copy_(result_);
    recv_ = result_ = at::Tensor();
  }

 private:
  at::Tensor shard_, recv_, result_;
};

}  // namespace

ShadowCommunicator::ShadowCommunicator(int world_size) : world_size_(world_size) {
  if (world_size < 1) throw std::invalid_argument("ShadowCommunicator: world size " + std::to_string(world_size) + " < 1");
}

void ShadowCommunicator::all_gather(at::Tensor& full, const at::Tensor& shard) {
  check_block_sizes("all_gather", full, shard);
  stats_.all_gather_calls++;
  stats_.all_gather_bytes += full.numel() * full.element_size();
  torch::NoGradGuard no_grad;
  // The shard may be block 0 of `full` (an in-place all-gather): copy it out first.
  const at::Tensor src = shard.data_ptr() == full.data_ptr() ? shard.clone() : shard;
  full.view({world_size_, shard.numel()}).copy_(src.view({1, -1}).expand({world_size_, shard.numel()}));
}

std::unique_ptr<Work> ShadowCommunicator::reduce_scatter_async(at::Tensor& shard, const at::Tensor& full,
                                                               ReduceOp op) {
  check_block_sizes("reduce_scatter", full, shard);
  stats_.reduce_scatter_calls++;
  stats_.reduce_scatter_bytes += full.numel() * full.element_size();
  torch::NoGradGuard no_grad;
  // MpiCommunicator's buffers: the peers' blocks in full's dtype until wait(), and for more
  // than two 16-bit blocks a float32 sum and one block upcast at a time.
  const int64_t s = shard.numel();
  at::Tensor recv = at::empty({world_size_ - 1, s}, full.options());
  at::Tensor out = full.narrow(0, 0, s).clone();
  if (world_size_ > 2 && is_16bit_float(full)) {
    (void)at::empty({2, s}, full.options().dtype(at::kFloat));  // allocated beside recv, as in wait()
  }
  return std::make_unique<ShadowWork>(shard, recv, out);
}

std::unique_ptr<Work> ShadowCommunicator::all_to_all_async(at::Tensor& out, const at::Tensor& in) {
  if (in.numel() != out.numel() || in.numel() % world_size_ != 0 || in.scalar_type() != out.scalar_type()) {
    throw CollectiveError("all_to_all (shadow): out and in must have one numel, divisible by the world size, and one dtype");
  }
  stats_.all_to_all_calls++;
  stats_.all_to_all_bytes += in.numel() * in.element_size();
  torch::NoGradGuard no_grad;
  const int64_t s = in.numel() / world_size_;
  out.view({world_size_, s}).copy_(in.narrow(0, 0, s).view({1, -1}).expand({world_size_, s}));
  return std::make_unique<detail::CompletedWork>();  // MpiCommunicator receives into `out`: no buffer to hold
}

void ShadowCommunicator::reduce_scatter(at::Tensor& shard, const at::Tensor& full, ReduceOp op) {
  reduce_scatter_async(shard, full, op)->wait();
}

void ShadowCommunicator::all_reduce(at::Tensor& t, ReduceOp op) {
  stats_.all_reduce_calls++;
  stats_.all_reduce_bytes += t.numel() * t.element_size();
  torch::NoGradGuard no_grad;
  at::Tensor buf = is_16bit_float(t) ? t.to(at::kFloat) : t;
  if (op == ReduceOp::kSum) buf.mul_(world_size_);
  if (is_16bit_float(t)) t.copy_(buf);
}

}  // namespace shardgan
