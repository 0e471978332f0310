#pragma once
// Shared by ShardedUnit's private parts (sharded_unit.cpp, unit_collectives.cpp,
// unit_hooks.cpp) and activation_checkpoint.cpp: the checkpointed forward, the registry of
// live units, byte counts and the collective timer.
#include <chrono>
#include <cstdint>
#include <functional>
#include <vector>

#include <ATen/core/Tensor.h>

namespace torch::nn {
class Module;
}

namespace shardgan {
class ShardedUnit;
namespace detail {

/// A unit's forward as activation checkpointing replays it (ShardedUnit::Forward).
using CheckpointedForward = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

/// Runs `run` on `inputs` as a checkpointed unit (activation_checkpoint.cpp): no graph is
/// recorded inside it, only the defined inputs are saved, and backward calls
/// `before_replay` (which must leave the parameters gathered), then replays `run` with
/// `module`'s buffers and the generators as they were here. `params` are the unit's
/// trainable parameters; their gradients come out through the returned outputs' node.
/// `segments`: checkpoint_segment() calls inside the replay nest (checkpoint_segments).
std::vector<at::Tensor> checkpointed_forward(CheckpointedForward run, torch::nn::Module& module,
                                             const std::vector<at::Tensor>& inputs,
                                             std::vector<at::Tensor> params,
                                             std::function<void()> before_replay, bool segments);

/// Adds `u` to the registry of live units under a fresh generation (unit_hooks.cpp), so
/// that autograd hooks holding (address, generation) can tell a destroyed unit apart.
void register_live_unit(const ShardedUnit* u);
void unregister_live_unit(const ShardedUnit* u);

inline int64_t nbytes(const at::Tensor& t) { return t.defined() ? t.numel() * t.element_size() : 0; }

/// Adds the wall time of its scope to *sink (nothing when sink is null: a unit without a model).
class Timed {
 public:
  explicit Timed(double* sink) : sink_(sink), t0_(std::chrono::steady_clock::now()) {}
  ~Timed() {
    if (sink_) *sink_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }
  Timed(const Timed&) = delete;
  Timed& operator=(const Timed&) = delete;

 private:
  double* sink_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace detail
}  // namespace shardgan
