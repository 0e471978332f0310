#include "shardgan/offload/host_memory.h"

#include <cstdlib>
#include <cstring>
#include <new>

namespace shardgan {

void* host_alloc(int64_t bytes) {
  if (bytes <= 0) return nullptr;
  void* p = nullptr;
  if (::posix_memalign(&p, 4096, static_cast<size_t>(bytes)) != 0) throw std::bad_alloc();
  std::memset(p, 0, static_cast<size_t>(bytes));
  return p;
}

void host_free(void* p) { std::free(p); }

}  // namespace shardgan
