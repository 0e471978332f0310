// Block-wise dynamic 8-bit quantization (see include/shardgan/optim/blockwise_quant.h).
// Built without -march flags, as fused_adam_kernel.cpp: each SIMD path carries its own
// target attribute. The nearest code comes from a 25 KiB table of bins (see build_bins)
// and one comparison, vectorized with gathers.
#include "shardgan/optim/blockwise_quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "optim/omp_tiles.h"
#include "optim/simd.h"

namespace shardgan {

namespace {

// The kernels find a code without a binary search: a table indexed by a normalized value's
// sign, binade and top 8 mantissa bits gives `base`, the number of midpoints below the
// bin's smallest value. Every bin holds at most one midpoint (checked when the table is
// built), so the code is base + (u > mid[base]): two lookups instead of eight. |u| <= 1;
// values under 2^-24 in magnitude share one bin per sign (no midpoint lies that close to 0).
constexpr int kLowExp = 103;               // biased exponent of 2^-24
constexpr int kRows = 128 - kLowExp + 1;   // the tiny bin and the binades 2^-24 .. 2^0
constexpr int kBinBits = 8;
constexpr int kBins = 2 * kRows * (1 << kBinBits);

struct Map {
  std::array<float, 256> code{};
  std::array<float, 255> mid{};
  std::array<float, 256> mid_pad{};       // mid and +inf: mid_pad[base] exists for base 255
  std::array<uint16_t, kBins + 2> base{};  // +2: a 32-bit gather of the last entry stays inside
  uint8_t zero = 0;
};

inline uint32_t bin_of(uint32_t bits) {
  const uint32_t sign = bits >> 31, exp = (bits >> 23) & 0xFF;
  if (exp < kLowExp) return sign * kRows * (1u << kBinBits);
  const uint32_t mant = (bits >> (23 - kBinBits)) & ((1u << kBinBits) - 1);
  return (sign * kRows + (exp - kLowExp + 1)) * (1u << kBinBits) + mant;
}

float from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}

void build_bins(Map& m) {
  const uint32_t kMant = (1u << (23 - kBinBits)) - 1;  // mantissa bits below the bin's
  for (uint32_t sign = 0; sign < 2; ++sign) {
    for (int row = 0; row < kRows; ++row) {
      for (uint32_t k = 0; k < (1u << kBinBits); ++k) {
        if (row == 0 && k != 0) continue;
        // The bin's magnitudes [small, large], as float bits.
        uint32_t small, large;
        if (row == 0) {
          small = 0;
          large = (static_cast<uint32_t>(kLowExp) << 23) - 1;
        } else {
          const uint32_t exp = static_cast<uint32_t>(kLowExp + row - 1);
          small = (exp << 23) | (k << (23 - kBinBits));
          large = small | kMant;
        }
        const float lo = sign ? -from_bits(large) : from_bits(small);
        const float hi = sign ? -from_bits(small) : from_bits(large);
        int below = 0, inside = 0;
        for (float mid : m.mid) {
          below += mid < lo ? 1 : 0;
          inside += (mid >= lo && mid <= hi) ? 1 : 0;
        }
        if (inside > 1) throw std::logic_error("blockwise_quant: a code-table bin holds two midpoints");
        m.base[(sign * kRows + static_cast<uint32_t>(row)) * (1u << kBinBits) + k] = static_cast<uint16_t>(below);
      }
    }
  }
}

inline uint8_t lookup_scalar(const Map& m, float u) {
  uint32_t bits;
  std::memcpy(&bits, &u, sizeof bits);
  const uint32_t base = m.base[bin_of(bits)];
  return static_cast<uint8_t>(base + (u > m.mid_pad[base] ? 1 : 0));
}

// bitsandbytes' create_dynamic_map(signed, max_exponent_bits=7, total_bits=8), in float64.
// For unsigned maps bitsandbytes also counts one sign bit (non_sign_bits = 7), so each
// exponent gets twice the fraction items instead of a negative half; additional_items is 0
// for both.
Map build_map(bool is_signed) {
  constexpr int kMaxExponentBits = 7;
  std::vector<double> data;
  for (int i = 0; i < kMaxExponentBits; ++i) {
    const int points = is_signed ? (1 << i) + 1 : (1 << (i + 1)) + 1;  // linspace(0.1, 1, points)
    const double scale = std::pow(10.0, i - (kMaxExponentBits - 1));
    for (int k = 0; k + 1 < points; ++k) {
      const double b0 = 0.1 + 0.9 * k / (points - 1), b1 = 0.1 + 0.9 * (k + 1) / (points - 1);
      const double mean = (b0 + b1) / 2.0;
      data.push_back(scale * mean);
      if (is_signed) data.push_back(-scale * mean);
    }
  }
  data.push_back(0.0);
  data.push_back(1.0);
  if (data.size() != 256) throw std::logic_error("build_map: the dynamic map must have 256 values");
  std::sort(data.begin(), data.end());
  Map m;
  for (size_t k = 0; k < 256; ++k) {
    m.code[k] = static_cast<float>(data[k]);
    if (m.code[k] == 0.0f) m.zero = static_cast<uint8_t>(k);
  }
  for (size_t k = 0; k < 255; ++k) {
    const double mid = (static_cast<double>(m.code[k]) + static_cast<double>(m.code[k + 1])) / 2.0;
    float f = static_cast<float>(mid);
    if (static_cast<double>(f) > mid) f = std::nextafter(f, -std::numeric_limits<float>::infinity());
    m.mid[k] = f;
    m.mid_pad[k] = f;
  }
  m.mid_pad[255] = std::numeric_limits<float>::infinity();
  build_bins(m);
  return m;
}

const Map& get(CodeMap map) {
  static const Map s = build_map(true), u = build_map(false);
  return map == CodeMap::kSigned ? s : u;
}

// ---- scalar ---------------------------------------------------------------------------

float quantize_scalar(const float* x, int64_t n, const Map& m, uint8_t* codes) {
  float amax = 0.0f;
  bool finite = true;
  for (int64_t i = 0; i < n; ++i) {
    finite &= std::isfinite(x[i]);
    amax = std::max(amax, std::fabs(x[i]));
  }
  if (!finite) {
    std::memset(codes, m.zero, static_cast<size_t>(n));
    return std::numeric_limits<float>::quiet_NaN();
  }
  const float div = amax == 0.0f ? 1.0f : amax;
  for (int64_t i = 0; i < n; ++i) codes[i] = lookup_scalar(m, x[i] / div);
  return amax;
}

void dequantize_scalar(const uint8_t* codes, float absmax, int64_t n, const Map& m, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = m.code[codes[i]] * absmax;
}

// ---- AVX2 -----------------------------------------------------------------------------

SHARDGAN_AVX2 inline __m256i lookup_avx2(const Map& m, __m256 u) {
  const __m256i bits = _mm256_castps_si256(u);
  const __m256i sign = _mm256_srli_epi32(bits, 31);
  const __m256i exp = _mm256_and_si256(_mm256_srli_epi32(bits, 23), _mm256_set1_epi32(0xFF));
  __m256i mant = _mm256_and_si256(_mm256_srli_epi32(bits, 23 - kBinBits), _mm256_set1_epi32((1 << kBinBits) - 1));
  __m256i row = _mm256_sub_epi32(exp, _mm256_set1_epi32(kLowExp - 1));
  const __m256i tiny = _mm256_cmpgt_epi32(_mm256_set1_epi32(kLowExp), exp);
  row = _mm256_andnot_si256(tiny, row);
  mant = _mm256_andnot_si256(tiny, mant);
  const __m256i bin = _mm256_add_epi32(
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_mullo_epi32(sign, _mm256_set1_epi32(kRows)), row), kBinBits), mant);
  const __m256i base = _mm256_and_si256(
      _mm256_i32gather_epi32(reinterpret_cast<const int*>(m.base.data()), bin, 2), _mm256_set1_epi32(0xFFFF));
  const __m256 t = _mm256_i32gather_ps(m.mid_pad.data(), base, 4);
  const __m256i gt = _mm256_castps_si256(_mm256_cmp_ps(u, t, _CMP_GT_OQ));
  return _mm256_sub_epi32(base, gt);  // gt is -1 where u > mid[base]
}

SHARDGAN_AVX2 float quantize_avx2(const float* x, int64_t n, const Map& m, uint8_t* codes) {
  const __m256 sign = _mm256_set1_ps(-0.0f), inf = _mm256_set1_ps(INFINITY);
  __m256 amax = _mm256_setzero_ps();
  __m256 bad = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 a = _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i));
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, inf, _CMP_NLT_UQ));  // +-inf or NaN
    amax = _mm256_max_ps(amax, a);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, amax);
  float am = 0.0f;
  for (float l : lanes) am = std::max(am, l);
  bool finite = _mm256_movemask_ps(bad) == 0;
  for (int64_t j = i; j < n; ++j) {
    finite &= std::isfinite(x[j]);
    am = std::max(am, std::fabs(x[j]));
  }
  if (!finite) {
    std::memset(codes, m.zero, static_cast<size_t>(n));
    return std::numeric_limits<float>::quiet_NaN();
  }
  const float divs = am == 0.0f ? 1.0f : am;
  const __m256 div = _mm256_set1_ps(divs);
  alignas(32) int32_t idx[8];
  for (i = 0; i + 8 <= n; i += 8) {
    const __m256i pos = lookup_avx2(m, _mm256_div_ps(_mm256_loadu_ps(x + i), div));
    _mm256_store_si256(reinterpret_cast<__m256i*>(idx), pos);
    for (int l = 0; l < 8; ++l) codes[i + l] = static_cast<uint8_t>(idx[l]);
  }
  for (; i < n; ++i) codes[i] = lookup_scalar(m, x[i] / divs);
  return am;
}

SHARDGAN_AVX2 void dequantize_avx2(const uint8_t* codes, float absmax, int64_t n, const Map& m, float* out) {
  const __m256 a = _mm256_set1_ps(absmax);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    int64_t raw;
    std::memcpy(&raw, codes + i, sizeof raw);
    const __m256i idx = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(raw));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_i32gather_ps(m.code.data(), idx, 4), a));
  }
  for (; i < n; ++i) out[i] = m.code[codes[i]] * absmax;
}

// ---- AVX-512F -------------------------------------------------------------------------

SHARDGAN_AVX512 inline __m512i lookup_avx512(const Map& m, __m512 u) {
  const __m512i bits = _mm512_castps_si512(u);
  const __m512i sign = _mm512_srli_epi32(bits, 31);
  const __m512i exp = _mm512_and_si512(_mm512_srli_epi32(bits, 23), _mm512_set1_epi32(0xFF));
  __m512i mant = _mm512_and_si512(_mm512_srli_epi32(bits, 23 - kBinBits), _mm512_set1_epi32((1 << kBinBits) - 1));
  __m512i row = _mm512_sub_epi32(exp, _mm512_set1_epi32(kLowExp - 1));
  const __mmask16 tiny = _mm512_cmplt_epi32_mask(exp, _mm512_set1_epi32(kLowExp));
  row = _mm512_mask_mov_epi32(row, tiny, _mm512_setzero_si512());
  mant = _mm512_mask_mov_epi32(mant, tiny, _mm512_setzero_si512());
  const __m512i bin = _mm512_add_epi32(
      _mm512_slli_epi32(_mm512_add_epi32(_mm512_mullo_epi32(sign, _mm512_set1_epi32(kRows)), row), kBinBits), mant);
  const __m512i base = _mm512_and_si512(_mm512_i32gather_epi32(bin, m.base.data(), 2), _mm512_set1_epi32(0xFFFF));
  const __m512 t = _mm512_i32gather_ps(base, m.mid_pad.data(), 4);
  return _mm512_mask_add_epi32(base, _mm512_cmp_ps_mask(u, t, _CMP_GT_OQ), base, _mm512_set1_epi32(1));
}

SHARDGAN_AVX512 float quantize_avx512(const float* x, int64_t n, const Map& m, uint8_t* codes) {
  const __m512 inf = _mm512_set1_ps(INFINITY);
  __m512 amax = _mm512_setzero_ps();
  __mmask16 bad = 0;
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = detail::tail_mask16(n - i);
    const __m512 a = _mm512_abs_ps(_mm512_maskz_loadu_ps(k, x + i));  // masked-off lanes: 0
    bad |= _mm512_mask_cmp_ps_mask(k, a, inf, _CMP_NLT_UQ);
    amax = _mm512_max_ps(amax, a);
  }
  if (bad != 0) {
    std::memset(codes, m.zero, static_cast<size_t>(n));
    return std::numeric_limits<float>::quiet_NaN();
  }
  const float am = _mm512_reduce_max_ps(amax);
  const __m512 div = _mm512_set1_ps(am == 0.0f ? 1.0f : am);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = detail::tail_mask16(n - i);
    const __m512i pos = lookup_avx512(m, _mm512_div_ps(_mm512_maskz_loadu_ps(k, x + i), div));
    _mm512_mask_cvtepi32_storeu_epi8(codes + i, k, pos);
  }
  return am;
}

SHARDGAN_AVX512 void dequantize_avx512(const uint8_t* codes, float absmax, int64_t n, const Map& m, float* out) {
  const __m512 a = _mm512_set1_ps(absmax);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i idx = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + i)));
    _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_i32gather_ps(idx, m.code.data(), 4), a));
  }
  for (; i < n; ++i) out[i] = m.code[codes[i]] * absmax;
}

void check_isa(CpuIsa isa, const char* what) {
  if (!cpu_supports(isa)) throw std::invalid_argument(std::string(what) + ": this CPU does not support " + to_string(isa));
}

void check_block(int64_t block, const char* what) {
  if (block < 1) throw std::invalid_argument(std::string(what) + ": block must be >= 1, got " + std::to_string(block));
}

}  // namespace

const std::array<float, 256>& code_map(CodeMap map) { return get(map).code; }
const std::array<float, 255>& code_midpoints(CodeMap map) { return get(map).mid; }
uint8_t zero_code(CodeMap map) { return get(map).zero; }
uint8_t nearest_code(CodeMap map, float u) {
  if (!(std::fabs(u) <= 1.0f)) {
    throw std::invalid_argument("nearest_code: the normalized value must be in [-1, 1], got " + std::to_string(u));
  }
  return lookup_scalar(get(map), u);
}

float quantize_block(const float* x, int64_t n, CodeMap map, uint8_t* codes, CpuIsa isa) {
  check_isa(isa, "quantize_block");
  if (n <= 0) return 0.0f;
  const Map& m = get(map);
  switch (isa) {
    case CpuIsa::kAvx512: return quantize_avx512(x, n, m, codes);
    case CpuIsa::kAvx2: return quantize_avx2(x, n, m, codes);
    default: return quantize_scalar(x, n, m, codes);
  }
}

void dequantize_block(const uint8_t* codes, float absmax, int64_t n, CodeMap map, float* out, CpuIsa isa) {
  check_isa(isa, "dequantize_block");
  if (n <= 0) return;
  const Map& m = get(map);
  switch (isa) {
    case CpuIsa::kAvx512: return dequantize_avx512(codes, absmax, n, m, out);
    case CpuIsa::kAvx2: return dequantize_avx2(codes, absmax, n, m, out);
    default: return dequantize_scalar(codes, absmax, n, m, out);
  }
}

int64_t quantize_blockwise(const float* x, int64_t n, int64_t block, CodeMap map, uint8_t* codes,
                           float* absmax, int num_threads) {
  check_block(block, "quantize_blockwise");
  if (n <= 0) return 0;
  const CpuIsa isa = best_cpu_isa();
  int64_t bad = 0;
  const int64_t tile = detail::block_tile(block);
  const int nt = detail::threads_for(n, num_threads, tile);
  const int64_t tiles = (n + tile - 1) / tile;
#pragma omp parallel for num_threads(nt) schedule(static) reduction(+ : bad)
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t end = std::min(n, (t + 1) * tile);
    for (int64_t b = t * tile; b < end; b += block) {
      const int64_t len = std::min(block, end - b);
      const float a = quantize_block(x + b, len, map, codes + b, isa);
      absmax[b / block] = a;
      bad += std::isnan(a) ? 1 : 0;
    }
  }
  return bad;
}

void dequantize_blockwise(const uint8_t* codes, const float* absmax, int64_t n, int64_t block, CodeMap map,
                          float* out, int num_threads) {
  check_block(block, "dequantize_blockwise");
  if (n <= 0) return;
  const CpuIsa isa = best_cpu_isa();
  detail::for_tiles(
      n, num_threads,
      [&](int64_t begin, int64_t count) {
        for (int64_t b = begin; b < begin + count; b += block) {
          dequantize_block(codes + b, absmax[b / block], std::min(block, begin + count - b), map, out + b, isa);
        }
      },
      detail::block_tile(block));
}

}  // namespace shardgan
