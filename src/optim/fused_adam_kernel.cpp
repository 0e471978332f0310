// The fused Adam kernel (see include/shardgan/optim/fused_adam.h). Built without -march
// flags: each SIMD path carries its own target attribute and is only called after
// __builtin_cpu_supports says the CPU has it.
//
// Why exact sqrt and divide rather than rsqrt14 + Newton-Raphson: on the project machine
// (Sapphire Rapids, 2 cores) the AVX-512 vsqrtps + vdivps pair costs about 20 cycles per 16
// elements, well under the ~55 cycles per 16 elements that memory bandwidth allows, so the
// approximate path buys nothing and would cost the 0-ulp agreement with the reference loop
// (docs/optimizers.md has the measurements).
#include "shardgan/optim/fused_adam.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "optim/omp_tiles.h"
#include "optim/simd.h"
#include "sharding/torch_internals.h"

namespace shardgan {

namespace {

using detail::bf16_avx2;
using detail::bf16_avx512;
using detail::for_tiles;
using detail::kTile;
using detail::threads_for;

// ---- scalar ---------------------------------------------------------------------------

template <bool kL2, bool kDecay>
inline void adam_element(float& p, float g, float& m, float& v, const AdamCoefficients& c) {
  if (kL2) g = std::fma(c.l2, p, g);
  float pd = kDecay ? p * c.decay : p;
  m = std::fma(c.beta1, m, c.one_minus_beta1 * g);
  v = std::fma(c.one_minus_beta2 * g, g, c.beta2 * v);
  const float d = std::fma(std::sqrt(v), c.inv_sqrt_bc2, c.eps);
  p = std::fma(-c.step_size, m / d, pd);
}

inline void write_copy(ParamCopy copy, uint16_t* out, int64_t i, float p) {
  if (copy == ParamCopy::kBFloat16) out[i] = float_to_bf16_bits(p);
  else if (copy == ParamCopy::kFloat16) out[i] = float_to_fp16_bits(p);
}

template <bool kL2, bool kDecay>
void adam_scalar(float* p, const float* g, float* m, float* v, int64_t n,
                 const AdamCoefficients& c, ParamCopy copy, uint16_t* out) {
  for (int64_t i = 0; i < n; ++i) {
    adam_element<kL2, kDecay>(p[i], g[i], m[i], v[i], c);
    write_copy(copy, out, i, p[i]);
  }
}

// ---- AVX2 + FMA (+ F16C for the float16 copy) ---------------------------------------------

template <bool kL2, bool kDecay>
SHARDGAN_AVX2 void adam_avx2(float* p, const float* g, float* m, float* v, int64_t n,
                             const AdamCoefficients& c, ParamCopy copy, uint16_t* out) {
  const __m256 b1 = _mm256_set1_ps(c.beta1), c1 = _mm256_set1_ps(c.one_minus_beta1);
  const __m256 b2 = _mm256_set1_ps(c.beta2), c2 = _mm256_set1_ps(c.one_minus_beta2);
  const __m256 isb = _mm256_set1_ps(c.inv_sqrt_bc2), eps = _mm256_set1_ps(c.eps);
  const __m256 nstep = _mm256_set1_ps(-c.step_size);
  const __m256 l2 = _mm256_set1_ps(c.l2), decay = _mm256_set1_ps(c.decay);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 pv = _mm256_loadu_ps(p + i), gv = _mm256_loadu_ps(g + i);
    __m256 mv = _mm256_loadu_ps(m + i), vv = _mm256_loadu_ps(v + i);
    if (kL2) gv = _mm256_fmadd_ps(l2, pv, gv);
    if (kDecay) pv = _mm256_mul_ps(pv, decay);
    mv = _mm256_fmadd_ps(b1, mv, _mm256_mul_ps(c1, gv));
    vv = _mm256_fmadd_ps(_mm256_mul_ps(c2, gv), gv, _mm256_mul_ps(b2, vv));
    const __m256 d = _mm256_fmadd_ps(_mm256_sqrt_ps(vv), isb, eps);
    pv = _mm256_fmadd_ps(nstep, _mm256_div_ps(mv, d), pv);
    _mm256_storeu_ps(p + i, pv);
    _mm256_storeu_ps(m + i, mv);
    _mm256_storeu_ps(v + i, vv);
    if (copy == ParamCopy::kBFloat16) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), bf16_avx2(pv));
    } else if (copy == ParamCopy::kFloat16) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                       _mm256_cvtps_ph(pv, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
  }
  for (; i < n; ++i) {  // std::fma compiles to vfmadd here: same rounding as the vector body
    adam_element<kL2, kDecay>(p[i], g[i], m[i], v[i], c);
    write_copy(copy, out, i, p[i]);
  }
}

// ---- AVX-512F ---------------------------------------------------------------------------

template <bool kL2, bool kDecay>
SHARDGAN_AVX512 void adam_avx512(float* p, const float* g, float* m, float* v, int64_t n,
                                 const AdamCoefficients& c, ParamCopy copy, uint16_t* out) {
  const __m512 b1 = _mm512_set1_ps(c.beta1), c1 = _mm512_set1_ps(c.one_minus_beta1);
  const __m512 b2 = _mm512_set1_ps(c.beta2), c2 = _mm512_set1_ps(c.one_minus_beta2);
  const __m512 isb = _mm512_set1_ps(c.inv_sqrt_bc2), eps = _mm512_set1_ps(c.eps);
  const __m512 nstep = _mm512_set1_ps(-c.step_size);
  const __m512 l2 = _mm512_set1_ps(c.l2), decay = _mm512_set1_ps(c.decay);
  int64_t i = 0;
  for (; i < n; i += 16) {
    const int64_t left = n - i;
    // Masked-off lanes of the last vector load 0 and are never stored (0/eps or 0/0 there
    // is harmless: floating-point exceptions are masked).
    const __mmask16 k = left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1);
    __m512 pv = _mm512_maskz_loadu_ps(k, p + i), gv = _mm512_maskz_loadu_ps(k, g + i);
    __m512 mv = _mm512_maskz_loadu_ps(k, m + i), vv = _mm512_maskz_loadu_ps(k, v + i);
    if (kL2) gv = _mm512_fmadd_ps(l2, pv, gv);
    if (kDecay) pv = _mm512_mul_ps(pv, decay);
    mv = _mm512_fmadd_ps(b1, mv, _mm512_mul_ps(c1, gv));
    vv = _mm512_fmadd_ps(_mm512_mul_ps(c2, gv), gv, _mm512_mul_ps(b2, vv));
    const __m512 d = _mm512_fmadd_ps(_mm512_sqrt_ps(vv), isb, eps);
    pv = _mm512_fmadd_ps(nstep, _mm512_div_ps(mv, d), pv);
    _mm512_mask_storeu_ps(p + i, k, pv);
    _mm512_mask_storeu_ps(m + i, k, mv);
    _mm512_mask_storeu_ps(v + i, k, vv);
    if (copy != ParamCopy::kNone) {
      const __m256i h = copy == ParamCopy::kBFloat16
                            ? bf16_avx512(pv)
                            : _mm512_cvtps_ph(pv, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      if (left >= 16) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), h);
      } else {
        alignas(32) uint16_t tmp[16];
        _mm256_store_si256(reinterpret_cast<__m256i*>(tmp), h);
        std::memcpy(out + i, tmp, static_cast<size_t>(left) * sizeof(uint16_t));
      }
    }
  }
}

using KernelFn = void (*)(float*, const float*, float*, float*, int64_t, const AdamCoefficients&,
                          ParamCopy, uint16_t*);

template <bool kL2, bool kDecay>
KernelFn pick(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx512: return &adam_avx512<kL2, kDecay>;
    case CpuIsa::kAvx2: return &adam_avx2<kL2, kDecay>;
    default: return &adam_scalar<kL2, kDecay>;
  }
}

// ---- scale / norm helpers ---------------------------------------------------------------

SHARDGAN_AVX512 bool scale_check_avx512(float* x, int64_t n, float factor) {
  const __m512 f = _mm512_set1_ps(factor);
  const __m512 inf = _mm512_set1_ps(INFINITY);
  __mmask16 bad = 0;
  for (int64_t i = 0; i < n; i += 16) {
    const int64_t left = n - i;
    const __mmask16 k = left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1);
    const __m512 a = _mm512_maskz_loadu_ps(k, x + i);
    // |a| < inf is false for +-inf and NaN.
    bad |= _mm512_mask_cmp_ps_mask(k, _mm512_abs_ps(a), inf, _CMP_NLT_UQ);
    if (factor != 1.0f) _mm512_mask_storeu_ps(x + i, k, _mm512_mul_ps(a, f));
  }
  return bad == 0;
}

bool scale_check_scalar(float* x, int64_t n, float factor) {
  bool ok = true;
  for (int64_t i = 0; i < n; ++i) {
    ok &= std::isfinite(x[i]);
    if (factor != 1.0f) x[i] *= factor;
  }
  return ok;
}

SHARDGAN_AVX512 double sumsq_avx512(const float* x, int64_t n) {
  __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
    const __m512d hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    a0 = _mm512_fmadd_pd(lo, lo, a0);
    a1 = _mm512_fmadd_pd(hi, hi, a1);
  }
  double s = _mm512_reduce_add_pd(_mm512_add_pd(a0, a1));
  for (; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return s;
}

double sumsq_scalar(const float* x, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return s;
}

}  // namespace

const char* to_string(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx512: return "avx512";
    case CpuIsa::kAvx2: return "avx2";
    default: return "scalar";
  }
}

bool cpu_supports(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx512: return __builtin_cpu_supports("avx512f");
    case CpuIsa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
    default: return true;
  }
}

CpuIsa best_cpu_isa() {
  static const CpuIsa best = cpu_supports(CpuIsa::kAvx512) ? CpuIsa::kAvx512
                             : cpu_supports(CpuIsa::kAvx2) ? CpuIsa::kAvx2
                                                           : CpuIsa::kScalar;
  return best;
}

uint16_t float_to_bf16_bits(float f) {
  if (std::isnan(f)) return 0x7FC0;
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return static_cast<uint16_t>((u + ((u >> 16) & 1u) + 0x7FFFu) >> 16);
}

uint16_t float_to_fp16_bits(float f) { return detail::fp16_bits(f); }

AdamCoefficients adam_coefficients(double lr, double beta1, double beta2, double eps,
                                   double weight_decay, bool decoupled, int64_t step) {
  if (step < 1) throw std::invalid_argument("adam_coefficients: step must be >= 1, got " + std::to_string(step));
  const double bc1 = 1.0 - std::pow(beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(beta2, static_cast<double>(step));
  AdamCoefficients c;
  c.beta1 = static_cast<float>(beta1);
  c.one_minus_beta1 = static_cast<float>(1.0 - beta1);
  c.beta2 = static_cast<float>(beta2);
  c.one_minus_beta2 = static_cast<float>(1.0 - beta2);
  c.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  c.eps = static_cast<float>(eps);
  c.step_size = static_cast<float>(lr / bc1);
  if (weight_decay != 0) {
    if (decoupled) c.decay = static_cast<float>(1.0 - lr * weight_decay);
    else c.l2 = static_cast<float>(weight_decay);
  }
  return c;
}

void fused_adam_step(float* p, const float* g, float* m, float* v, int64_t n,
                     const AdamCoefficients& c, ParamCopy copy, uint16_t* copy_out, CpuIsa isa,
                     int num_threads) {
  if (n <= 0) return;
  if (!cpu_supports(isa)) {
    throw std::invalid_argument(std::string("fused_adam_step: this CPU does not support ") + to_string(isa));
  }
  if (copy != ParamCopy::kNone && copy_out == nullptr) {
    throw std::invalid_argument("fused_adam_step: a parameter copy was requested without copy_out");
  }
  const bool l2 = c.l2 != 0.0f, dec = c.decay != 1.0f;
  const KernelFn fn = l2 ? (dec ? pick<true, true>(isa) : pick<true, false>(isa))
                         : (dec ? pick<false, true>(isa) : pick<false, false>(isa));
  if (m == nullptr && c.beta1 != 0.0f) {
    throw std::invalid_argument("fused_adam_step: m may be left unstored only when beta1 == 0");
  }
  for_tiles(n, num_threads, [&](int64_t b, int64_t len) {
    if (m != nullptr) return fn(p + b, g + b, m + b, v + b, len, c, copy, copy_out ? copy_out + b : nullptr);
    // m not stored: a zeroed, L1-resident scratch per chunk stands in for it.
    constexpr int64_t kChunk = 2048;
    alignas(64) float scratch[kChunk];
    for (int64_t k = b; k < b + len; k += kChunk) {
      const int64_t l = std::min(kChunk, b + len - k);
      std::memset(scratch, 0, sizeof(float) * static_cast<size_t>(l));
      fn(p + k, g + k, scratch, v + k, l, c, copy, copy_out ? copy_out + k : nullptr);
    }
  });
}

void reference_adam_step(float* p, const float* g, float* m, float* v, int64_t n,
                         const AdamCoefficients& c, ParamCopy copy, uint16_t* copy_out) {
  for (int64_t i = 0; i < n; ++i) {
    float gi = g[i];
    if (c.l2 != 0.0f) gi = std::fma(c.l2, p[i], gi);
    float pi = p[i];
    if (c.decay != 1.0f) pi = pi * c.decay;
    m[i] = std::fma(c.beta1, m[i], c.one_minus_beta1 * gi);
    v[i] = std::fma(c.one_minus_beta2 * gi, gi, c.beta2 * v[i]);
    const float d = std::fma(std::sqrt(v[i]), c.inv_sqrt_bc2, c.eps);
    p[i] = std::fma(-c.step_size, m[i] / d, pi);
    if (copy == ParamCopy::kBFloat16) copy_out[i] = float_to_bf16_bits(p[i]);
    if (copy == ParamCopy::kFloat16) copy_out[i] = float_to_fp16_bits(p[i]);
  }
}

void reference_adam_step_f64(double* p, const double* g, double* m, double* v, int64_t n,
                             double lr, double beta1, double beta2, double eps,
                             double weight_decay, bool decoupled, int64_t step) {
  // torch::optim's order: bias corrections in double; denom = sqrt(v)/sqrt(bc2) + eps;
  // p -= (lr/bc1) * m/denom.
  const double bc1 = 1.0 - std::pow(beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(beta2, static_cast<double>(step));
  const double step_size = lr / bc1, sqrt_bc2 = std::sqrt(bc2);
  for (int64_t i = 0; i < n; ++i) {
    double gi = g[i];
    if (weight_decay != 0 && !decoupled) gi = gi + weight_decay * p[i];
    if (weight_decay != 0 && decoupled) p[i] = p[i] * (1.0 - lr * weight_decay);
    m[i] = m[i] * beta1 + (1.0 - beta1) * gi;
    v[i] = v[i] * beta2 + (1.0 - beta2) * gi * gi;
    const double d = std::sqrt(v[i]) / sqrt_bc2 + eps;
    p[i] = p[i] - step_size * (m[i] / d);
  }
}

bool scale_and_check_finite(float* x, int64_t n, float factor) {
  const bool avx512 = best_cpu_isa() == CpuIsa::kAvx512;
  const int nt = threads_for(n, 0);
  bool ok = true;
  if (nt == 1) return avx512 ? scale_check_avx512(x, n, factor) : scale_check_scalar(x, n, factor);
  const int64_t tiles = (n + kTile - 1) / kTile;
#pragma omp parallel for num_threads(nt) schedule(static) reduction(&& : ok)
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t b = t * kTile, len = std::min(kTile, n - b);
    const bool r = avx512 ? scale_check_avx512(x + b, len, factor) : scale_check_scalar(x + b, len, factor);
    ok = ok && r;
  }
  return ok;
}

double sum_of_squares(const float* x, int64_t n) {
  const bool avx512 = best_cpu_isa() == CpuIsa::kAvx512;
  const int nt = threads_for(n, 0);
  if (nt == 1) return avx512 ? sumsq_avx512(x, n) : sumsq_scalar(x, n);
  const int64_t tiles = (n + kTile - 1) / kTile;
  double s = 0;
#pragma omp parallel for num_threads(nt) schedule(static) reduction(+ : s)
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t b = t * kTile, len = std::min(kTile, n - b);
    s += avx512 ? sumsq_avx512(x + b, len) : sumsq_scalar(x + b, len);
  }
  return s;
}

}  // namespace shardgan
