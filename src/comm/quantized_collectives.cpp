#include "shardgan/comm/quantized_collectives.h"

#include <exception>
#include <functional>
#include <string>

#include <torch/torch.h>

namespace shardgan {
namespace {

// A quantized collective in flight: wait() waits for the exchange, then runs `finish` (the
// dequantization), which owns the buffers the exchange reads and writes. Destroyed unwaited,
// it waits, except while an exception unwinds (the job is ending; MpiWork leaves its
// requests in flight then too). Whenever the requests are left in flight, on that path or
// when the wait throws (a timeout), `finish` and so the buffers are kept until the process
// ends (MPI_Abort), since MPI and the progress thread may still write them.
class DequantizeWork final : public Work {
 public:
  DequantizeWork(std::unique_ptr<Work> inner, std::function<void()> finish)
      : inner_(std::move(inner)), finish_(std::move(finish)) {}
  ~DequantizeWork() override {
    if (!inner_) return;
    if (std::uncaught_exceptions() > 0) {
      abandon();
      return;
    }
    try {
      wait();
    } catch (...) {  // never throw from a destructor; the error surfaces elsewhere
    }
  }
  void wait() override {
    if (!inner_) return;
    try {
      inner_->wait();
    } catch (...) {
      abandon();
      throw;
    }
    inner_.reset();
    torch::NoGradGuard no_grad;
    finish_();
    finish_ = nullptr;
  }

 private:
  // Keeps the buffers (leaks `finish`, which owns them) and lets the inner Work go: it keeps
  // its own until the process ends too. A later wait() returns at once.
  void abandon() {
    new std::function<void()>(std::move(finish_));  // NOLINT: deliberate leak
    inner_.reset();
  }

  std::unique_ptr<Work> inner_;
  std::function<void()> finish_;
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
  // Every rank's block, this rank's too, so that every rank computes with the same values.
  auto finish = [send, recv, full, q, n, s, pb] {
    for (int64_t p = 0; p < n; ++p) dequantize_blocks(recv.narrow(0, p * pb, pb), q, full.narrow(0, p * s, s));
  };
  return std::make_unique<DequantizeWork>(comm.all_gather_async(recv, send), std::move(finish));
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
  // The float32 average of the N dequantized blocks for this rank, summed in rank order.
  auto finish = [send, recv, out, q, n, pb]() mutable {
    for (int64_t p = 0; p < n; ++p) dequantize_blocks(recv.narrow(0, p * pb, pb), q, out, /*accumulate=*/p > 0);
    out.div_(static_cast<double>(n));
  };
  return std::make_unique<DequantizeWork>(comm.all_to_all_async(recv, send), std::move(finish));
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
