#include "shardgan/comm/quantized_collectives.h"

#include <exception>
#include <string>

#include <torch/torch.h>

namespace shardgan {
namespace {

// qwZ: the int8 all-gather in flight; wait() dequantizes every rank's block (this rank's
// too, so that every rank computes with the same values) into the gathered flat parameter.
class DequantizeGatherWork final : public Work {
 public:
  DequantizeGatherWork(std::unique_ptr<Work> inner, at::Tensor send, at::Tensor recv, at::Tensor full, QuantSpec q)
      : inner_(std::move(inner)), send_(std::move(send)), recv_(std::move(recv)), full_(std::move(full)), q_(q) {}
  ~DequantizeGatherWork() override {
    if (inner_ && std::uncaught_exceptions() == 0) {
      try {
        wait();
      } catch (...) {
      }
    }
  }
  void wait() override {
    if (!inner_) return;
    inner_->wait();
    inner_.reset();
    torch::NoGradGuard no_grad;
    const int64_t n = recv_.numel() / send_.numel(), s = full_.numel() / n, pb = send_.numel();
    for (int64_t p = 0; p < n; ++p) dequantize_blocks(recv_.narrow(0, p * pb, pb), q_, full_.narrow(0, p * s, s));
    send_ = recv_ = full_ = at::Tensor();
  }

 private:
  std::unique_ptr<Work> inner_;
  at::Tensor send_, recv_, full_;
  QuantSpec q_;
};

// qgZ: the all-to-all of quantized gradient blocks in flight; wait() writes the float32
// average of the N dequantized blocks for this rank, summed in rank order.
class DequantizeReduceWork final : public Work {
 public:
  DequantizeReduceWork(std::unique_ptr<Work> inner, at::Tensor send, at::Tensor recv, at::Tensor out, QuantSpec q)
      : inner_(std::move(inner)), send_(std::move(send)), recv_(std::move(recv)), out_(std::move(out)), q_(q) {}
  ~DequantizeReduceWork() override {
    if (inner_ && std::uncaught_exceptions() == 0) {
      try {
        wait();
      } catch (...) {
      }
    }
  }
  void wait() override {
    if (!inner_) return;
    inner_->wait();
    inner_.reset();
    torch::NoGradGuard no_grad;
    const int64_t pb = quantized_bytes(out_.numel(), q_), n = recv_.numel() / pb;
    for (int64_t p = 0; p < n; ++p) dequantize_blocks(recv_.narrow(0, p * pb, pb), q_, out_, /*accumulate=*/p > 0);
    out_.div_(static_cast<double>(n));
    send_ = recv_ = out_ = at::Tensor();
  }

 private:
  std::unique_ptr<Work> inner_;
  at::Tensor send_, recv_, out_;
  QuantSpec q_;
};

}  // namespace

std::unique_ptr<Work> quantized_all_gather_async(Communicator& comm, at::Tensor full, const at::Tensor& shard,
                                                 const QuantSpec& q) {
  const int64_t s = shard.numel(), n = comm.world_size();
  if (full.numel() != s * n || shard.dim() != 1 || full.dim() != 1 || !full.is_contiguous()) {
    throw CollectiveError("quantized all_gather on rank " + std::to_string(comm.rank()) + ": full has " +
                          std::to_string(full.numel()) + " elements, expected shard (" + std::to_string(s) +
                          ") x world size (" + std::to_string(n) + "), both 1-D");
  }
  const int64_t pb = quantized_bytes(s, q);
  at::Tensor send = torch::empty({pb}, shard.options().dtype(at::kByte));
  quantize_blocks(shard, q, send);
  at::Tensor recv = torch::empty({pb * n}, send.options());
  std::unique_ptr<Work> inner = comm.all_gather_async(recv, send);
  return std::make_unique<DequantizeGatherWork>(std::move(inner), send, recv, full, q);
}

std::unique_ptr<Work> quantized_reduce_scatter_async(Communicator& comm, at::Tensor out, const at::Tensor& full,
                                                     const QuantSpec& q) {
  const int64_t s = out.numel(), n = comm.world_size();
  if (full.numel() != s * n || full.dim() != 1 || out.dim() != 1 || !out.is_contiguous() || !full.is_contiguous()) {
    throw CollectiveError("quantized reduce_scatter on rank " + std::to_string(comm.rank()) + ": full has " +
                          std::to_string(full.numel()) + " elements, expected out (" + std::to_string(s) +
                          ") x world size (" + std::to_string(n) + "), both contiguous 1-D");
  }
  const int64_t pb = quantized_bytes(s, q);
  at::Tensor send = torch::empty({pb * n}, full.options().dtype(at::kByte));
  for (int64_t p = 0; p < n; ++p) quantize_blocks(full.narrow(0, p * s, s), q, send.narrow(0, p * pb, pb));
  at::Tensor recv = torch::empty({pb * n}, send.options());
  std::unique_ptr<Work> inner = comm.all_to_all_async(recv, send);
  return std::make_unique<DequantizeReduceWork>(std::move(inner), send, recv, out, q);
}

void quantized_all_reduce_avg(Communicator& comm, at::Tensor& t, const QuantSpec& q) {
  const int64_t n = comm.world_size(), numel = t.numel(), s = (numel + n - 1) / n;
  if (t.dim() != 1 || !t.is_contiguous()) {
    throw CollectiveError("quantized all_reduce on rank " + std::to_string(comm.rank()) + ": t must be contiguous 1-D");
  }
  torch::NoGradGuard no_grad;
  at::Tensor padded = torch::zeros({s * n}, t.options().dtype(at::kFloat));
  padded.narrow(0, 0, numel).copy_(t);
  at::Tensor part = torch::empty({s}, padded.options());
  quantized_reduce_scatter_async(comm, part, padded, q)->wait();
  quantized_all_gather_async(comm, padded, part, QuantSpec{8, q.block})->wait();
  t.copy_(padded.narrow(0, 0, numel));
}

}  // namespace shardgan
