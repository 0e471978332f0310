#include "shardgan/comm/quantize.h"

#include <stdexcept>

#include <torch/torch.h>

namespace shardgan {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

int64_t code_bytes(int64_t numel, const QuantSpec& q) {
  const int64_t raw = q.bits == 8 ? numel : ceil_div(numel, 2);
  return ceil_div(raw, 4) * 4;  // the scales start 4-byte aligned
}

void check_spec(const QuantSpec& q) {
  if ((q.bits != 8 && q.bits != 4) || q.block < 2 || (q.bits == 4 && q.block % 2 != 0)) {
    throw std::invalid_argument("quantization: bits must be 8 or 4 and the block >= 2 (even for int4), got bits " +
                                std::to_string(q.bits) + ", block " + std::to_string(q.block));
  }
}

// The n elements as [blocks, block] float32, the last block zero-padded.
at::Tensor as_blocks(const at::Tensor& x, const QuantSpec& q) {
  const int64_t n = x.numel(), nb = ceil_div(n, q.block);
  at::Tensor f = x.to(at::kFloat);
  if (nb * q.block != n) f = at::constant_pad_nd(f, {0, nb * q.block - n}, 0);
  return f.view({nb, q.block});
}

}  // namespace

int parse_quant_bits(const std::string& name) {
  if (name == "none") return 0;
  if (name == "int8") return 8;
  if (name == "int4") return 4;
  throw std::invalid_argument("unknown quantization '" + name + "' (expected none, int8 or int4)");
}

int64_t quantized_bytes(int64_t numel, const QuantSpec& q) {
  check_spec(q);
  return code_bytes(numel, q) + 4 * ceil_div(numel, q.block);
}

void quantize_blocks(const at::Tensor& x, const QuantSpec& q, at::Tensor out) {
  check_spec(q);
  const int64_t n = x.numel();
  if (x.dim() != 1 || !x.is_contiguous() || !at::isFloatingType(x.scalar_type())) {
    throw std::invalid_argument("quantize_blocks: x must be a contiguous 1-D floating tensor");
  }
  if (out.scalar_type() != at::kByte || out.numel() != quantized_bytes(n, q) || !out.is_contiguous()) {
    throw std::invalid_argument("quantize_blocks: out must be uint8 of " + std::to_string(quantized_bytes(n, q)) +
                                " bytes, got " + std::to_string(out.numel()));
  }
  if (n == 0) return;
  torch::NoGradGuard no_grad;
  const int64_t cb = code_bytes(n, q), nb = ceil_div(n, q.block);
  at::Tensor blocks = as_blocks(x, q);
  // amax propagates NaN: a block holding a NaN or an Inf gets a NaN or Inf scale, which
  // carries the non-finiteness (every element of it dequantizes to 0 x Inf or 0 x NaN = NaN).
  at::Tensor scale = blocks.abs().amax(1).div_(q.qmax());
  scale.masked_fill_(scale == 0, 1.0);  // an all-zero block: codes 0, scale 1
  // Such a block's quotients are NaN (x / NaN, Inf / Inf) or 0 (finite / Inf): nan_to_num
  // makes every code a defined value before the cast to int8 (a NaN's cast is undefined).
  at::Tensor codes = blocks.div(scale.unsqueeze(1))
                         .round_()
                         .nan_to_num_(0.0, q.qmax(), -q.qmax())
                         .clamp_(-q.qmax(), q.qmax())
                         .to(at::kChar)
                         .view({-1});
  const int64_t raw = q.bits == 8 ? n : ceil_div(n, 2);  // code bytes before the padding
  if (q.bits == 8) {
    out.narrow(0, 0, n).copy_(codes.narrow(0, 0, n).view(at::kByte));
  } else {
    // Two's-complement nibbles: element 2k low, 2k + 1 high (an odd n's last high nibble is
    // the zero padding's code, 0).
    at::Tensor c = codes.narrow(0, 0, raw * 2).to(at::kInt).bitwise_and_(0xF).view({-1, 2});
    at::Tensor packed = c.select(1, 0).bitwise_or(c.select(1, 1).bitwise_left_shift(4)).to(at::kByte);
    out.narrow(0, 0, raw).copy_(packed);
  }
  out.narrow(0, raw, cb - raw).zero_();  // the padding travels too: no uninitialized bytes
  out.narrow(0, cb, 4 * nb).view(at::kFloat).copy_(scale);
}

void dequantize_blocks(const at::Tensor& payload, const QuantSpec& q, at::Tensor out, bool accumulate) {
  check_spec(q);
  const int64_t n = out.numel();
  if (payload.scalar_type() != at::kByte || payload.numel() != quantized_bytes(n, q) || !payload.is_contiguous()) {
    throw std::invalid_argument("dequantize_blocks: payload must be uint8 of " + std::to_string(quantized_bytes(n, q)) +
                                " bytes for " + std::to_string(n) + " elements, got " + std::to_string(payload.numel()));
  }
  if (out.dim() != 1 || !out.is_contiguous()) throw std::invalid_argument("dequantize_blocks: out must be contiguous 1-D");
  if (n == 0) return;
  torch::NoGradGuard no_grad;
  const int64_t cb = code_bytes(n, q), nb = ceil_div(n, q.block);
  at::Tensor codes;
  if (q.bits == 8) {
    codes = payload.narrow(0, 0, n).view(at::kChar).to(at::kFloat);
  } else {
    at::Tensor b = payload.narrow(0, 0, ceil_div(n, 2)).to(at::kInt);
    at::Tensor lo = b.bitwise_and(0xF), hi = b.bitwise_right_shift(4).bitwise_and_(0xF);
    // Sign-extend the 4-bit two's complement: v >= 8 means v - 16.
    lo = lo - lo.ge(8).to(at::kInt) * 16;
    hi = hi - hi.ge(8).to(at::kInt) * 16;
    codes = at::stack({lo, hi}, 1).view({-1}).narrow(0, 0, n).to(at::kFloat);
  }
  at::Tensor scale = payload.narrow(0, cb, 4 * nb).view(at::kFloat);
  const int64_t full = nb * q.block;
  if (full != n) codes = at::constant_pad_nd(codes, {0, full - n}, 0);
  at::Tensor values = codes.view({nb, q.block}).mul_(scale.unsqueeze(1)).view({-1}).narrow(0, 0, n);
  if (accumulate) {
    out.add_(values);
  } else {
    out.copy_(values);
  }
}

}  // namespace shardgan
