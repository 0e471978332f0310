#include "sharding/storage.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/StorageImpl.h>

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

}  // namespace shardgan::detail
