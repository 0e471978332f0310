#pragma once
/// Block-wise dynamic 8-bit quantization of optimizer states (Dettmers et al., "8-bit
/// Optimizers via Block-wise Quantization", ICLR 2022, arXiv 2110.02861, Sec. 2; the code
/// maps are bitsandbytes' `create_dynamic_map`, bitsandbytes/functional.py).
///
/// A run of n float32 values is cut into blocks of `block` elements ([k*block, (k+1)*block),
/// the last one possibly shorter). Each block stores one float32 absmax (the largest |x| in
/// the block) and one uint8 code per element: the index of the code-map value nearest to
/// x / absmax. Dequantized, element i is code_map[code[i]] * absmax[i / block].
///
/// The rule, exactly (every path here and the tests' reference agree bit for bit):
/// - x / absmax is one correctly rounded float32 division (a block of zeros divides by 1);
/// - the code is the index of the nearest map value, ties to the lower index: the number
///   of the map's 255 midpoints that lie strictly below x / absmax, the midpoints being
///   computed in float64 and rounded toward minus infinity to float32 (so that `x > mid`
///   in float32 is exactly `x > midpoint` in the reals). It is found through a table of
///   bins (sign, binade, top 8 mantissa bits) holding at most one midpoint each, and one
///   comparison;
/// - dequantization is one float32 multiply.
/// No torch here: plain arrays on the CPU. Each path (AVX-512F, AVX2, scalar) is chosen as
/// in fused_adam.h and gives the same bits.
#include <array>
#include <cstdint>

#include "shardgan/optim/fused_adam.h"

namespace shardgan {

/// Which dynamic map: signed (Adam's m, values in [-1, 1]) or unsigned (v, in [0, 1]).
enum class CodeMap { kSigned, kUnsigned };

/// The 256 values of a dynamic map, sorted ascending, float32 (bitsandbytes'
/// create_dynamic_map(signed, max_exponent_bits=7, total_bits=8): for exponent i = 0..6 the
/// midpoints of linspace(0.1, 1, 2^i + 1) (signed, both signs) or linspace(0.1, 1, 2^(i+1) +
/// 1) (unsigned) scaled by 10^(i-6), plus 0 and 1). Values are computed in float64 and
/// rounded once. Both maps contain 0 and 1 exactly.
const std::array<float, 256>& code_map(CodeMap map);
/// The map's 255 midpoints: mid[k] is (map[k] + map[k+1]) / 2 rounded toward minus infinity.
const std::array<float, 255>& code_midpoints(CodeMap map);
/// The index of 0 in the map (every element of an all-zero block gets this code).
uint8_t zero_code(CodeMap map);
/// The code of one normalized value u (after division by the absmax): the number of
/// midpoints strictly below u, through the same bin table as the kernels. Throws
/// std::invalid_argument unless |u| <= 1 (NaN included).
uint8_t nearest_code(CodeMap map, float u);

/// Quantizes one block of n (>= 1) float32 values: writes n codes and returns the block's
/// absmax. A block holding a value that is not finite returns NaN and gets zero_code(map)
/// everywhere (it dequantizes to NaN, as a float32 state would hold it). Under kUnsigned a
/// negative value (which Adam's v never holds) gets code 0. `isa` must be supported by this
/// CPU (std::invalid_argument otherwise). Local, one thread.
float quantize_block(const float* x, int64_t n, CodeMap map, uint8_t* codes, CpuIsa isa = best_cpu_isa());
/// Dequantizes one block: out[i] = code_map(map)[codes[i]] * absmax. Local, one thread.
void dequantize_block(const uint8_t* codes, float absmax, int64_t n, CodeMap map, float* out,
                      CpuIsa isa = best_cpu_isa());

/// Quantizes n float32 values in blocks of `block` (>= 1) elements: writes n codes and
/// ceil(n / block) absmax values. Returns the number of blocks holding a value that is not
/// finite (see quantize_block); the caller decides whether to refuse. Throws
/// std::invalid_argument for block < 1. Local; OpenMP over blocks (`num_threads` 0: OpenMP's
/// default).
int64_t quantize_blockwise(const float* x, int64_t n, int64_t block, CodeMap map, uint8_t* codes,
                           float* absmax, int num_threads = 0);
/// Inverse: out[i] = code_map(map)[codes[i]] * absmax[i / block]. Throws
/// std::invalid_argument for block < 1. Local; OpenMP over blocks.
void dequantize_blockwise(const uint8_t* codes, const float* absmax, int64_t n, int64_t block, CodeMap map,
                          float* out, int num_threads = 0);

/// Number of blocks of n elements: ceil(n / block).
inline int64_t num_blocks(int64_t n, int64_t block) { return (n + block - 1) / block; }

}  // namespace shardgan
