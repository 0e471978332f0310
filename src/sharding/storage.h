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

}  // namespace shardgan::detail
