#pragma once
// Shared by the two files of ShardedUnit (private): sharded_unit.cpp (the flat parameter's
// collectives and gradient buffers) and unit_hooks.cpp (the runtime hooks).
#include <chrono>
#include <cstdint>

#include <ATen/core/Tensor.h>

namespace shardgan {
class ShardedUnit;
namespace detail {

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
