#pragma once
/// Host allocations of the offload tiers: aligned to 4096 bytes (O_DIRECT's requirement)
/// and, in a CUDA build, where the pinned allocator would go (cudaHostAlloc), so that
/// copies to and from the device can be asynchronous. This CPU-only build uses
/// posix_memalign. Local. No torch.
#include <cstdint>

namespace shardgan {

/// `bytes` of zeroed host memory aligned to 4096. Throws std::bad_alloc.
void* host_alloc(int64_t bytes);
/// Frees what host_alloc returned (nullptr is fine).
void host_free(void* p);

}  // namespace shardgan
