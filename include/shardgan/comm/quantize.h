#pragma once
/// Block quantization for ZeRO++'s quantized collectives (Wang et al. 2023, "ZeRO++:
/// Extremely Efficient Collective Communication for Giant Model Training", arXiv 2306.10209):
/// qwZ (Sec. 4.1) gathers stage-3 weights as int8, qgZ (Sec. 4.3) reduce-scatters gradients
/// as int8 or int4 through an all-to-all and reduces the dequantized blocks in float32.
///
/// Scheme (symmetric, per block): a 1-D tensor of n elements is cut into blocks of `block`
/// elements (the last one may be shorter). Each block b has the scale
///   s_b = max_i |x_i| / q_max      (q_max = 127 for int8, 7 for int4; s_b = 1 if the block is 0)
/// and each element the code c_i = round(x_i / s_b) clamped to [-q_max, q_max], so that the
/// dequantized value c_i * s_b is off by at most s_b / 2 = max|x_b| / (2 q_max): 1/254 of
/// the block's largest magnitude for int8, 1/14 for int4 (plus float32 rounding of the
/// product). Non-finite input: a block holding a NaN, +Inf or -Inf gets a NaN or Inf scale
/// and all-zero codes (defined values: its NaN quotients become 0 before the cast), so
/// every element of that block dequantizes to NaN (0 x Inf, 0 x NaN) and the other blocks
/// are unaffected: a NaN or Inf gradient stays non-finite after dequantization (the
/// trainer's non-finite check still sees it), block for block.
///
/// Payload layout (uint8, quantized_bytes(n) bytes): the codes (int8: n bytes; int4: two
/// per byte, element 2k in the low nibble, ceil(n / 2) bytes, an odd n's last high nibble
/// 0), zero bytes up to a multiple of 4 bytes, then the float32 scales, one per block. Every
/// byte is written. Host or device tensors alike (ATen ops);
/// local, no collectives.
#include <cstdint>
#include <string>

#include <ATen/core/Tensor.h>

namespace shardgan {

struct QuantSpec {
  int bits = 8;          ///< 8 or 4
  int64_t block = 256;   ///< elements per scale (>= 2, even for int4)
  int qmax() const { return bits == 8 ? 127 : 7; }
};

/// "none" -> 0, "int8" -> 8, "int4" -> 4; throws std::invalid_argument otherwise.
int parse_quant_bits(const std::string& name);

/// Bytes of the payload of `numel` elements (codes, padding, scales).
int64_t quantized_bytes(int64_t numel, const QuantSpec& q);

/// Quantizes `x` (1-D contiguous float32, float64, bfloat16 or float16) into `out` (1-D
/// uint8 of quantized_bytes(x.numel()), same device). Throws std::invalid_argument on a
/// size, dtype or spec mismatch.
void quantize_blocks(const at::Tensor& x, const QuantSpec& q, at::Tensor out);

/// Dequantizes `payload` (as quantize_blocks wrote it for `out.numel()` elements) into `out`
/// (1-D contiguous, any floating dtype): out = values, or out += values when `accumulate`.
void dequantize_blocks(const at::Tensor& payload, const QuantSpec& q, at::Tensor out, bool accumulate = false);

}  // namespace shardgan
