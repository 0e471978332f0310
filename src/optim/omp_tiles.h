#pragma once
// Work tiling for the optimizer kernels (fused_adam_kernel.cpp, blockwise_quant.cpp,
// fused_adam8_kernel.cpp): OpenMP over contiguous runs of tiles, one thread for small n.
#include <omp.h>

#include <algorithm>
#include <cstdint>

namespace shardgan::detail {

// Elements per work tile: 8192 floats = 32 KiB per stream. Threads take contiguous runs of
// tiles (OpenMP static schedule), so each core streams through one region and the hardware
// prefetcher sees long sequential runs.
constexpr int64_t kTile = 8192;
// Below this many elements one thread does the work (the fork/join costs a few us).
constexpr int64_t kParallelMin = 1 << 16;

inline int threads_for(int64_t n, int num_threads, int64_t tile = kTile) {
  if (n < kParallelMin) return 1;
  int nt = num_threads > 0 ? num_threads : omp_get_max_threads();
  const int64_t tiles = (n + tile - 1) / tile;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(nt, tiles)));
}

// Tiles that hold whole blocks of `block` elements: about kTile elements, at least one block
// (the 8-bit kernels: a block never straddles two threads).
inline int64_t block_tile(int64_t block) { return block * std::max<int64_t>(1, kTile / block); }

// Runs fn(begin, count) over [0, n) in tiles of `tile` elements, contiguous runs of tiles
// per thread. A tile that is a multiple of a block size keeps every block in one call.
template <typename Fn>
void for_tiles(int64_t n, int num_threads, Fn&& fn, int64_t tile = kTile) {
  const int nt = threads_for(n, num_threads, tile);
  if (nt == 1) {
    fn(int64_t{0}, n);
    return;
  }
  const int64_t tiles = (n + tile - 1) / tile;
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t b = t * tile;
    fn(b, std::min(tile, n - b));
  }
}

}  // namespace shardgan::detail
