#pragma once
// Private to src/comm: which tensors the backends reduce through float32 (bfloat16 and
// float16, upcast once and rounded back once; see communicator.h).
#include <ATen/core/Tensor.h>

namespace shardgan::detail {

inline bool is_16bit_float(const at::Tensor& t) {
  return t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf;
}

}  // namespace shardgan::detail
