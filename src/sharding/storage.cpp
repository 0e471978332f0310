#include "sharding/storage.h"

#include <sys/mman.h>

#include <new>

#include <c10/core/CPUAllocator.h>
#include <c10/core/StorageImpl.h>
#include <torch/torch.h>

namespace shardgan::detail {

void free_storage(const at::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(at::DataPtr(nullptr, t.device()));
  s->set_nbytes(static_cast<size_t>(0));
}

void refill_storage(const at::Tensor& t, size_t nbytes) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  TORCH_CHECK(t.device().is_cpu(), "refill_storage: only CPU tensors are supported so far");
  s->set_data_ptr_noswap(c10::GetCPUAllocator()->allocate(nbytes));
  s->set_nbytes(nbytes);
}

size_t storage_nbytes(const at::Tensor& t) { return t.storage().nbytes(); }

at::Tensor lazy_zeros(int64_t numel, at::ScalarType dtype) {
  const size_t bytes = static_cast<size_t>(numel) * c10::elementSize(dtype);
  if (bytes < (size_t{1} << 20)) return torch::zeros({numel}, torch::TensorOptions().dtype(dtype));
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  return torch::from_blob(p, {numel}, [bytes](void* q) { ::munmap(q, bytes); }, torch::TensorOptions().dtype(dtype));
}

}  // namespace shardgan::detail
