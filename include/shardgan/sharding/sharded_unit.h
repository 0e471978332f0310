#pragma once
/// One sharding unit: a submodule whose parameters are flattened into one flat parameter
/// and, at ZeRO stage 3, partitioned across ranks (ZeRO paper, Rajbhandari et al. 2020,
/// Sec. 5; PyTorch FSDP's FlatParameter, Zhao et al. 2023, Sec. 3.2).
///
/// Flat layout: the unit's parameters, in named_parameters() order, are concatenated into
/// a flat buffer of T elements, zero-padded to P = ceil(T / N) * N for world size N. Rank r
/// owns elements [r * S, (r + 1) * S) with S = P / N. At stage 0 nothing is padded or
/// sharded: the rank "owns" all T elements (S = P = T).
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/nn/module.h>

#include "shardgan/comm/communicator.h"

namespace shardgan {

class ShardedModel;

/// Per-model sharding options. Changing them after the model is built has no effect.
struct ShardingConfig {
  /// ZeRO stage: 0 (replicated data parallel, gradients all-reduced; the reference) or 3
  /// (parameters, gradients and optimizer state sharded). Stages 1 and 2 come later.
  int stage = 3;
  /// Stage 3: free the gathered parameters after forward and gather them again for
  /// backward (FSDP's reshard_after_forward). False keeps them until backward ends.
  bool reshard_after_forward = true;
};

class ShardedUnit {
 public:
  /// Runs the unit's module on one input; shapes are the module's own.
  using Forward = std::function<at::Tensor(const at::Tensor&)>;

  /// Where each original parameter lives inside the flat parameter.
  struct ParamSlot {
    std::string name;             ///< name within the unit's module
    std::vector<int64_t> shape;   ///< original shape
    int64_t offset = 0;           ///< first element in the flat parameter
    int64_t numel = 0;            ///< elements
    at::Tensor param;             ///< the module's parameter (a view of the flat buffer)
  };

  /// Flattens `module`'s parameters (which must share one dtype, on the CPU, and be
  /// identical on every rank) and keeps this rank's shard. Collective at stage 3 only in
  /// that it must be built on every rank in the same order. Throws std::invalid_argument
  /// for an unsupported stage or mixed dtypes.
  ShardedUnit(std::string name, std::shared_ptr<torch::nn::Module> module, Forward forward,
              Communicator& comm, ShardingConfig cfg, ShardedModel* owner);
  ~ShardedUnit();
  ShardedUnit(const ShardedUnit&) = delete;
  ShardedUnit& operator=(const ShardedUnit&) = delete;

  /// Collective at stage 3 (all-gather). Gathers the full parameters, runs the module, and
  /// frees them again if reshard_after_forward. When the output requires grad, it arms
  /// the pre-backward gather and the post-backward gradient reduction for this unit.
  at::Tensor forward(const at::Tensor& x);

  /// Collective at stage 3: all-gathers the flat parameter (no-op if already gathered or
  /// at stage 0).
  void gather();
  /// Frees the gathered flat parameter (stage 3; no-op at stage 0). Local.
  void free_full();
  /// Collective: copies the parameters' .grad into one flat buffer, averages it across
  /// ranks (reduce-scatter at stage 3, all-reduce at stage 0) and adds the local part to
  /// grad_shard(). Releases the parameters' .grad. Skipped (on every rank alike) when no
  /// parameter received a gradient.
  void reduce_gradients();

  /// Toggles requires_grad on every parameter (a frozen unit yields input gradients only).
  void set_requires_grad(bool on);

  const std::string& name() const { return name_; }
  int64_t numel() const { return numel_; }                ///< T, unpadded elements
  int64_t padded_numel() const { return padded_numel_; }  ///< P
  int64_t shard_numel() const { return shard_numel_; }    ///< S, elements this rank owns
  int64_t shard_offset() const { return shard_offset_; }  ///< first owned flat element
  int stage() const { return cfg_.stage; }
  /// This rank's part of the flat parameter: 1-D, S elements, the model dtype, CPU. The
  /// optimizer updates it in place. At stage 0 it aliases the module's parameters.
  at::Tensor& shard() { return shard_; }
  /// The averaged gradient for shard(): same shape, dtype and device.
  at::Tensor& grad_shard() { return grad_shard_; }
  const std::vector<ParamSlot>& slots() const { return slots_; }
  torch::nn::Module& module() { return *module_; }
  bool gathered() const { return gathered_; }
  /// Bytes currently held by the gathered flat parameter (0 when freed; P * element size
  /// when gathered at stage 3; 0 at stage 0, where it is the shard itself).
  int64_t full_bytes_alive() const;

  /// Collective at stage 3: the full, unpadded flat parameter (T elements, a new tensor).
  at::Tensor gather_full_copy();

  // Backward bookkeeping, called from autograd hooks. Not for users.
  void on_pre_backward();
  void on_param_grad_ready();
  /// End of a backward pass: reduces and frees a unit whose gradients did not all arrive.
  void finish_backward();

 private:
  std::string name_;
  std::shared_ptr<torch::nn::Module> module_;
  Forward forward_;
  Communicator& comm_;
  ShardingConfig cfg_;
  ShardedModel* owner_;
  std::vector<ParamSlot> slots_;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;  // kept alive for hooks
  int64_t numel_ = 0, padded_numel_ = 0, shard_numel_ = 0, shard_offset_ = 0;
  at::Tensor full_;        // P elements; parameters are views of it
  at::Tensor shard_;       // S elements (aliases full_ at stage 0)
  at::Tensor grad_shard_;  // S elements
  bool gathered_ = false;
  bool backward_armed_ = false;
  int pending_grads_ = 0;
};

}  // namespace shardgan
