#pragma once
/// Global gradient-norm clipping across shards (torch::nn::utils::clip_grad_norm_ over the
/// whole model, computed without gathering it).
#include <vector>

namespace shardgan {

class Communicator;
class ShardedModel;

/// What clip_grad_norm found and did.
struct ClipResult {
  double total_norm = 0.0;  ///< global L2 norm of the gradients before clipping
  bool finite = true;       ///< false when the norm is inf or NaN (nothing was scaled then)
  double clip_coef = 1.0;   ///< factor applied to every gradient (1 when not clipped)
  bool clipped = false;
};

/// Collective: exactly one all_reduce (SUM, one float64 element) on `comm`, on every rank.
/// Each rank sums the squares of its gradient elements in float64: for a unit at stage 1,
/// 2 or 3 its own grad_shard() (its partition; padding is zero); for a stage-0 unit, whose
/// grad_shard() is the same full gradient on every rank, only rank 0 counts it, so nothing
/// is counted twice. Under hybrid sharding (the model's comm() is a HybridCommunicator) only
/// replica group 0 counts its shards, which every group holds alike. Call it after the
/// gradients are reduced (the accumulation boundary).
/// total_norm = sqrt(global sum). If total_norm is finite and
/// clip_coef = max_norm / (total_norm + 1e-6) < 1, every grad_shard() of `models` is
/// multiplied by clip_coef (torch's rule). A non-finite norm is returned with finite=false
/// and the gradients untouched; the caller decides (skip the step, or throw).
/// `models` must be the same list, in the same order, on every rank; `comm` spans every
/// rank of the models (the world communicator, not an HSDP shard group). Throws
/// std::invalid_argument for max_norm <= 0.
ClipResult clip_grad_norm(const std::vector<ShardedModel*>& models, double max_norm,
                          Communicator& comm);

/// Collective (one all_reduce): the global L2 norm, without clipping.
double global_grad_norm(const std::vector<ShardedModel*>& models, Communicator& comm);

}  // namespace shardgan
