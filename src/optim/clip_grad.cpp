#include "shardgan/optim/clip_grad.h"

#include <cmath>
#include <stdexcept>

#include <torch/torch.h>

#include "shardgan/comm/communicator.h"
#include "shardgan/optim/fused_adam.h"
#include "shardgan/sharding/sharded_model.h"

namespace shardgan {

namespace {

double local_sum_of_squares(const std::vector<ShardedModel*>& models, int rank) {
  double s = 0;
  for (ShardedModel* m : models) {
    for (auto& u : m->units()) {
      if (u->stage() == 0 && rank != 0) continue;  // replicated: counted once, on rank 0
      if (m->comm().replica_rank() != 0) continue;  // HSDP: replica group 0 counts the shards
      u->with_grad_shard([&](at::Tensor& g) {  // offloaded: read from the tier
        if (g.scalar_type() == at::kFloat && g.device().is_cpu() && g.is_contiguous()) {
          s += sum_of_squares(g.data_ptr<float>(), g.numel());
        } else {
          s += g.to(at::kDouble).square().sum().item<double>();
        }
      }, false);
    }
  }
  return s;
}

}  // namespace

double global_grad_norm(const std::vector<ShardedModel*>& models, Communicator& comm) {
  at::Tensor t = torch::full({1}, local_sum_of_squares(models, comm.rank()), torch::kDouble);
  comm.all_reduce(t, ReduceOp::kSum);
  return std::sqrt(t.item<double>());
}

ClipResult clip_grad_norm(const std::vector<ShardedModel*>& models, double max_norm, Communicator& comm) {
  if (!(max_norm > 0)) throw std::invalid_argument("clip_grad_norm: max_norm must be > 0, got " + std::to_string(max_norm));
  ClipResult r;
  r.total_norm = global_grad_norm(models, comm);
  r.finite = std::isfinite(r.total_norm);
  if (!r.finite) return r;
  const double coef = max_norm / (r.total_norm + 1e-6);  // torch::nn::utils::clip_grad_norm_
  if (coef < 1) {
    torch::NoGradGuard no_grad;
    for (ShardedModel* m : models) {
      for (auto& u : m->units()) u->with_grad_shard([&](at::Tensor& g) { g.mul_(coef); }, true);
    }
    r.clip_coef = coef;
    r.clipped = true;
  }
  return r;
}

}  // namespace shardgan
