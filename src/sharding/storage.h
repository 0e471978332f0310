#pragma once
// Version-dependent LibTorch internals in one place (LibTorch 1.13; 2.x has the same calls).
#include <ATen/core/Tensor.h>

namespace shardgan::detail {

/// Frees the memory behind `t`'s storage without replacing the StorageImpl, so that every
/// view of it (module parameters, tensors autograd saved for backward) stays valid and sees
/// the new memory after refill_storage(). This is FSDP's `untyped_storage().resize_(0)`.
void free_storage(const at::Tensor& t);

/// Gives `t`'s storage fresh, uninitialized memory of `nbytes` bytes (CPU allocator).
void refill_storage(const at::Tensor& t, size_t nbytes);

/// Bytes currently allocated behind `t`'s storage.
size_t storage_nbytes(const at::Tensor& t);

/// A 1-D CPU tensor of `numel` zeros of `dtype` whose pages are not resident until they
/// are written: anonymous mmap memory, which the kernel maps to the zero page on first
/// read and allocates on first write (below 1 MiB: torch::zeros). Used for stage-3
/// gradient shards, so that building a model that does not fit replicated holds only the
/// master shards until the first backward (and, with parameter offload, not even those
/// once they leave). Throws std::bad_alloc when mmap fails.
at::Tensor lazy_zeros(int64_t numel, at::ScalarType dtype);

}  // namespace shardgan::detail
