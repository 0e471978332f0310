#include "shardgan/offload/host_memory.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include "shardgan/device/host_copy.h"

namespace shardgan {

void* host_alloc(int64_t bytes) {
  if (bytes <= 0) return nullptr;
  void* p = nullptr;
  if (::posix_memalign(&p, 4096, static_cast<size_t>(bytes)) != 0) throw std::bad_alloc();
  std::memset(p, 0, static_cast<size_t>(bytes));
  pin_host_memory(p, bytes);  // page-locked for DMA when this process computes on a GPU
  return p;
}

void host_free(void* p) {
  if (p && pin_host_memory_enabled()) unpin_host_memory(p);
  std::free(p);
}

}  // namespace shardgan
