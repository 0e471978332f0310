// The Adam steps on low-precision states (fused_adam8_step and fused_adam_bf16_step in
// include/shardgan/optim/fused_adam.h): per block or chunk, widen m and v into
// L1-resident float32 scratch, run the float32 kernel on it, narrow again. The float32
// kernel is called as is, so the update's arithmetic is the float32 path's by construction.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "optim/omp_tiles.h"
#include "optim/simd.h"
#include "shardgan/optim/blockwise_quant.h"
#include "shardgan/optim/fused_adam.h"

namespace shardgan {

namespace {

// Elements per scratch chunk of the bfloat16 step: two 8 KiB float32 buffers.
constexpr int64_t kChunk = 2048;

void check_common(const char* what, CpuIsa isa, bool m_stored, const AdamCoefficients& c, ParamCopy copy,
                  const uint16_t* copy_out) {
  if (!cpu_supports(isa)) throw std::invalid_argument(std::string(what) + ": this CPU does not support " + to_string(isa));
  if (!m_stored && c.beta1 != 0.0f) {
    throw std::invalid_argument(std::string(what) + ": m may be left unstored only when beta1 == 0");
  }
  if (copy != ParamCopy::kNone && copy_out == nullptr) {
    throw std::invalid_argument(std::string(what) + ": a parameter copy was requested without copy_out");
  }
}

SHARDGAN_AVX512 void widen_avx512(const uint16_t* in, int64_t n, float* out) {
  for (int64_t i = 0; i < n; i += 16) {
    const int64_t left = n - i;
    __m256i h;
    if (left >= 16) {
      h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i));
    } else {
      alignas(32) uint16_t tmp[16] = {};
      std::memcpy(tmp, in + i, static_cast<size_t>(left) * sizeof(uint16_t));
      h = _mm256_load_si256(reinterpret_cast<const __m256i*>(tmp));
    }
    const __m512 f = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    _mm512_mask_storeu_ps(out + i, detail::tail_mask16(left), f);
  }
}

SHARDGAN_AVX512 void narrow_avx512(const float* in, int64_t n, uint16_t* out) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), detail::bf16_avx512(_mm512_loadu_ps(in + i)));
  }
  for (; i < n; ++i) out[i] = float_to_bf16_bits(in[i]);
}

SHARDGAN_AVX2 void widen_avx2(const uint16_t* in, int64_t n, float* out) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    _mm256_storeu_ps(out + i, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)));
  }
  for (; i < n; ++i) {
    const uint32_t u = static_cast<uint32_t>(in[i]) << 16;
    std::memcpy(out + i, &u, sizeof u);
  }
}

SHARDGAN_AVX2 void narrow_avx2(const float* in, int64_t n, uint16_t* out) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), detail::bf16_avx2(_mm256_loadu_ps(in + i)));
  }
  for (; i < n; ++i) out[i] = float_to_bf16_bits(in[i]);
}

}  // namespace

void bf16_to_float(const uint16_t* in, int64_t n, float* out, CpuIsa isa) {
  if (!cpu_supports(isa)) throw std::invalid_argument(std::string("bf16_to_float: this CPU does not support ") + to_string(isa));
  if (isa == CpuIsa::kAvx512) return widen_avx512(in, n, out);
  if (isa == CpuIsa::kAvx2) return widen_avx2(in, n, out);
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = static_cast<uint32_t>(in[i]) << 16;
    std::memcpy(out + i, &u, sizeof u);
  }
}

void float_to_bf16(const float* in, int64_t n, uint16_t* out, CpuIsa isa) {
  if (!cpu_supports(isa)) throw std::invalid_argument(std::string("float_to_bf16: this CPU does not support ") + to_string(isa));
  if (isa == CpuIsa::kAvx512) return narrow_avx512(in, n, out);
  if (isa == CpuIsa::kAvx2) return narrow_avx2(in, n, out);
  for (int64_t i = 0; i < n; ++i) out[i] = float_to_bf16_bits(in[i]);
}

int64_t fused_adam8_step(float* p, const float* g, QuantizedState m, QuantizedState v, int64_t n,
                         int64_t block, const AdamCoefficients& c, ParamCopy copy, uint16_t* copy_out,
                         CpuIsa isa, int num_threads) {
  if (block < 1 || block > kMaxStateBlock) {
    throw std::invalid_argument("fused_adam8_step: block must be in [1, " + std::to_string(kMaxStateBlock) +
                                "], got " + std::to_string(block));
  }
  if (n <= 0) return 0;
  check_common("fused_adam8_step", isa, m.codes != nullptr, c, copy, copy_out);
  if (v.codes == nullptr || v.absmax == nullptr || (m.codes != nullptr && m.absmax == nullptr)) {
    throw std::invalid_argument("fused_adam8_step: a stored state needs both codes and absmax");
  }
  const int64_t tile = detail::block_tile(block);
  const int nt = detail::threads_for(n, num_threads, tile);
  const int64_t tiles = (n + tile - 1) / tile;
  int64_t bad = 0;
#pragma omp parallel for num_threads(nt) schedule(static) reduction(+ : bad)
  for (int64_t t = 0; t < tiles; ++t) {
    alignas(64) float bm[kMaxStateBlock];
    alignas(64) float bv[kMaxStateBlock];
    const int64_t end = std::min(n, (t + 1) * tile);
    for (int64_t b = t * tile; b < end; b += block) {
      const int64_t len = std::min(block, end - b), k = b / block;
      if (m.codes != nullptr) dequantize_block(m.codes + b, m.absmax[k], len, CodeMap::kSigned, bm, isa);
      else std::memset(bm, 0, static_cast<size_t>(len) * sizeof(float));
      dequantize_block(v.codes + b, v.absmax[k], len, CodeMap::kUnsigned, bv, isa);
      fused_adam_step(p + b, g + b, bm, bv, len, c, copy, copy_out ? copy_out + b : nullptr, isa, 1);
      bool finite = true;
      if (m.codes != nullptr) {
        m.absmax[k] = quantize_block(bm, len, CodeMap::kSigned, m.codes + b, isa);
        finite = !std::isnan(m.absmax[k]);
      } else {
        for (int64_t i = 0; i < len; ++i) finite &= std::isfinite(bm[i]);
      }
      v.absmax[k] = quantize_block(bv, len, CodeMap::kUnsigned, v.codes + b, isa);
      finite &= !std::isnan(v.absmax[k]);
      bad += finite ? 0 : 1;
    }
  }
  return bad;
}

void fused_adam_bf16_step(float* p, const float* g, uint16_t* m, uint16_t* v, int64_t n,
                          const AdamCoefficients& c, ParamCopy copy, uint16_t* copy_out, CpuIsa isa,
                          int num_threads) {
  if (n <= 0) return;
  check_common("fused_adam_bf16_step", isa, m != nullptr, c, copy, copy_out);
  if (v == nullptr) throw std::invalid_argument("fused_adam_bf16_step: v is required");
  detail::for_tiles(n, num_threads, [&](int64_t begin, int64_t count) {
    alignas(64) float bm[kChunk];
    alignas(64) float bv[kChunk];
    for (int64_t b = begin; b < begin + count; b += kChunk) {
      const int64_t len = std::min(kChunk, begin + count - b);
      if (m != nullptr) bf16_to_float(m + b, len, bm, isa);
      else std::memset(bm, 0, static_cast<size_t>(len) * sizeof(float));
      bf16_to_float(v + b, len, bv, isa);
      fused_adam_step(p + b, g + b, bm, bv, len, c, copy, copy_out ? copy_out + b : nullptr, isa, 1);
      if (m != nullptr) float_to_bf16(bm, len, m + b, isa);
      float_to_bf16(bv, len, v + b, isa);
    }
  });
}

}  // namespace shardgan
