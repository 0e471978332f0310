#pragma once
/// splitmix64's finalizer (Steele, Lea and Flood 2014, "Fast splittable pseudorandom number
/// generators"): a bijection of 64-bit words that spreads nearby inputs (seed, seed + 1) far
/// apart. For deriving the seeds of per-sample and per-pass generators. Local, pure.
#include <cstdint>

namespace shardgan {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

}  // namespace shardgan
