#pragma once
/// Host allocations of the offload tiers: aligned to 4096 bytes (O_DIRECT's requirement)
/// with posix_memalign, and page-locked (cudaHostRegister, through device/host_copy.h)
/// when the process computes on a GPU, so that copies to and from the device run as DMA.
/// Local.
#include <cstdint>

namespace shardgan {

/// `bytes` of zeroed host memory aligned to 4096, pinned when pin_host_memory_enabled().
/// Throws std::bad_alloc, or DeviceError when pinning fails.
void* host_alloc(int64_t bytes);
/// Frees what host_alloc returned (nullptr is fine).
void host_free(void* p);

}  // namespace shardgan
