#pragma once
// SIMD helpers of the optimizer kernels (fused_adam_kernel.cpp, blockwise_quant.cpp,
// fused_adam_lowp_kernel.cpp). The files build without -march flags: each SIMD function
// carries its own target attribute and runs only after cpu_supports() said yes.

// GCC 12 warns that its own AVX-512 intrinsics read an uninitialized "__Y" (the
// _mm512_undefined_* placeholders; GCC bug 105593). Nothing here is uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <cstdint>

namespace shardgan::detail {

#define SHARDGAN_AVX2 __attribute__((target("avx2,fma,f16c")))

SHARDGAN_AVX2 inline __m128i bf16_avx2(__m256 x) {
  // c10::BFloat16's round_to_nearest_even: bits + 0x7FFF + lsb, NaN -> 0x7FC0.
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))), 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC0), nan);
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

#define SHARDGAN_AVX512 __attribute__((target("avx512f")))

SHARDGAN_AVX512 inline __m256i bf16_avx512(__m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  r = _mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32(0x7FC0));
  return _mm512_cvtepi32_epi16(r);
}

SHARDGAN_AVX512 inline __mmask16 tail_mask16(int64_t left) {
  return left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1);
}

}  // namespace shardgan::detail
