#pragma once
// OffloadedAdam's access to whole arrays of its store (src/optim/offloaded_adam.cpp and
// offloaded_adam_state.cpp): a typed view of raw ring or host memory, and one array of one
// unit streamed out of the store or into it. Local; reads or writes the disk tier.
#include <cstdint>

#include <ATen/core/Tensor.h>
#include <torch/torch.h>

#include "shardgan/offload/state_store.h"

namespace shardgan::offload_io {

inline at::Tensor view(void* p, int64_t n, at::ScalarType dt) {
  return torch::from_blob(p, {n}, torch::TensorOptions().dtype(dt));
}

// Array `a` of unit `unit` in the store, whole, out of it into `dst` or into it from `src`
// ([S] elements of `dt`, CPU): the master shard (parameter offload) and the gradient shard
// (gradient offload) move this way.
inline void read_array(OffloadStore& store, size_t unit, int a, at::ScalarType dt, at::Tensor& dst) {
  store.stream({unit}, OffloadStore::Mode::kRead, [&](const OffloadStore::Chunk& c) {
    dst.narrow(0, c.offset, c.numel).copy_(view(c.data[a], c.numel, dt));
  }, 1u << a);
}

inline void write_array(OffloadStore& store, size_t unit, int a, at::ScalarType dt, const at::Tensor& src) {
  store.stream({unit}, OffloadStore::Mode::kWrite, [&](const OffloadStore::Chunk& c) {
    view(c.data[a], c.numel, dt).copy_(src.narrow(0, c.offset, c.numel));
  }, 1u << a);
}

}  // namespace shardgan::offload_io
