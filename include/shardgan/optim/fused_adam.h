#pragma once
/// The fused CPU kernel of the Adam family: one pass over contiguous float32 shards that
/// reads p, g, m, v and writes p, m, v (28 bytes per element), and optionally a bfloat16 or
/// float16 copy of the new p (2 more bytes). Vectorized for AVX-512 and AVX2+FMA, chosen at
/// run time (__builtin_cpu_supports), with a scalar fallback; OpenMP over cores, in tiles.
///
/// Exactness: every path evaluates the same sequence of IEEE operations per element
/// (multiply, fused multiply-add, correctly rounded sqrt and divide; see
/// reference_adam_step), so the AVX-512, AVX2 and scalar paths and the reference loop agree
/// bit for bit (0 ulp). docs/optimizers.md has the formulas and the measurements.
#include <cstdint>

namespace shardgan {

/// Instruction set of a kernel path.
enum class CpuIsa { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };
const char* to_string(CpuIsa isa);
/// The widest path this CPU runs: kAvx512 (avx512f), kAvx2 (avx2, fma and f16c) or kScalar.
CpuIsa best_cpu_isa();
/// Whether this CPU can run `isa`.
bool cpu_supports(CpuIsa isa);

/// Optional low-precision copy of the updated parameters, written in the same pass.
enum class ParamCopy { kNone, kBFloat16, kFloat16 };

/// Per-step constants of the Adam update, each rounded once to float32 from float64.
/// Build them with adam_coefficients(); the kernel does no other scalar arithmetic.
struct AdamCoefficients {
  float beta1 = 0, one_minus_beta1 = 0;  ///< m <- beta1*m + (1-beta1)*g
  float beta2 = 0, one_minus_beta2 = 0;  ///< v <- beta2*v + (1-beta2)*g*g
  float inv_sqrt_bc2 = 0;                ///< 1/sqrt(1 - beta2^t)
  float eps = 0;
  float step_size = 0;                   ///< lr / (1 - beta1^t)
  float l2 = 0;       ///< Adam's L2 weight decay: g <- g + l2*p (0: off)
  float decay = 1;    ///< AdamW's decoupled decay: p <- p*decay, decay = 1 - lr*wd (1: off)
};

/// Coefficients of step `step` (1-based: the first update is step 1). `decoupled` selects
/// AdamW (Loshchilov & Hutter 2019) weight decay, otherwise Adam's L2 term. Throws
/// std::invalid_argument for step < 1.
AdamCoefficients adam_coefficients(double lr, double beta1, double beta2, double eps,
                                   double weight_decay, bool decoupled, int64_t step);

/// One Adam/AdamW step on n contiguous float32 elements, in place on p, m and v. `g` is
/// read only. When `copy` is not kNone, `copy_out` (n uint16 elements: the raw bits of
/// bfloat16 or float16, rounded to nearest even from the new p) is written too. The arrays
/// must not overlap. m == nullptr: m is not stored (only when c.beta1 == 0, where m is the
/// current gradient; a zero scratch stands in). `isa` must be supported by this CPU
/// (std::invalid_argument otherwise, or for m missing with beta1 != 0);
/// `num_threads` 0 uses omp_get_max_threads() (small n runs on one thread). Local.
void fused_adam_step(float* p, const float* g, float* m, float* v, int64_t n,
                     const AdamCoefficients& c, ParamCopy copy = ParamCopy::kNone,
                     uint16_t* copy_out = nullptr, CpuIsa isa = best_cpu_isa(),
                     int num_threads = 0);

/// Adam's m or v held block-wise 8-bit (blockwise_quant.h): n codes and ceil(n / block)
/// float32 absmax values, CPU memory. codes == nullptr: the state is not stored.
struct QuantizedState {
  uint8_t* codes = nullptr;
  float* absmax = nullptr;
};

/// The largest block fused_adam8_step takes (its per-block scratch lives on the stack).
constexpr int64_t kMaxStateBlock = 4096;

/// One Adam/AdamW step on n contiguous float32 p with m (signed map) and v (unsigned map)
/// stored block-wise 8-bit in blocks of `block` elements (1..kMaxStateBlock), the first
/// block starting at p[0]. Per block: m and v are dequantized to float32, stepped by
/// exactly fused_adam_step's operation sequence (so the update uses the unrounded new m
/// and v, as bitsandbytes' 8-bit Adam does), and requantized with the block's new absmax.
/// m.codes == nullptr means m is not stored: allowed only when c.beta1 == 0, where m is
/// the current gradient (m starts from 0 each step). Returns the number of blocks whose
/// new m or v is not finite; those store absmax NaN (the caller refuses the step). Throws
/// std::invalid_argument for a block out of range, m missing with beta1 != 0, an
/// unsupported `isa`, or a copy without copy_out. Local; OpenMP over whole blocks.
int64_t fused_adam8_step(float* p, const float* g, QuantizedState m, QuantizedState v, int64_t n,
                         int64_t block, const AdamCoefficients& c, ParamCopy copy = ParamCopy::kNone,
                         uint16_t* copy_out = nullptr, CpuIsa isa = best_cpu_isa(), int num_threads = 0);

/// One Adam/AdamW step on n contiguous float32 p with m and v stored as bfloat16 (raw bits,
/// n each): widened to float32 (exact), stepped by exactly fused_adam_step's operation
/// sequence, and rounded back to nearest even (float_to_bf16_bits). m == nullptr means m is
/// not stored (c.beta1 == 0 only). Throws std::invalid_argument as fused_adam8_step. Local;
/// OpenMP over tiles.
void fused_adam_bf16_step(float* p, const float* g, uint16_t* m, uint16_t* v, int64_t n,
                          const AdamCoefficients& c, ParamCopy copy = ParamCopy::kNone,
                          uint16_t* copy_out = nullptr, CpuIsa isa = best_cpu_isa(), int num_threads = 0);

/// Widens n bfloat16 values (raw bits) to float32 (exact). Local, one thread.
void bf16_to_float(const uint16_t* in, int64_t n, float* out, CpuIsa isa = best_cpu_isa());
/// Rounds n float32 values to bfloat16 bits, nearest even (float_to_bf16_bits). Local, one thread.
void float_to_bf16(const float* in, int64_t n, uint16_t* out, CpuIsa isa = best_cpu_isa());

/// The plain element-by-element loop the kernel is tested against: one thread, no SIMD
/// intrinsics, the same operation sequence written with std::fma, std::sqrt and '/':
///   g' = fma(l2, p, g)                       (only when l2 != 0)
///   p' = p * decay                           (only when decay != 1)
///   m  = fma(beta1, m, (1-beta1) * g')
///   v  = fma((1-beta2) * g', g', beta2 * v)
///   d  = fma(sqrt(v), inv_sqrt_bc2, eps)
///   p  = fma(-step_size, m / d, p')
void reference_adam_step(float* p, const float* g, float* m, float* v, int64_t n,
                         const AdamCoefficients& c, ParamCopy copy = ParamCopy::kNone,
                         uint16_t* copy_out = nullptr);

/// The same loop in float64 (coefficients unrounded), used by the tests to show that the
/// operation sequence equals torch::optim::Adam/AdamW's.
void reference_adam_step_f64(double* p, const double* g, double* m, double* v, int64_t n,
                             double lr, double beta1, double beta2, double eps,
                             double weight_decay, bool decoupled, int64_t step);

/// Round-to-nearest-even float32 -> bfloat16 bits, NaN -> 0x7FC0 (c10::BFloat16's rule).
uint16_t float_to_bf16_bits(float f);
/// Round-to-nearest-even float32 -> IEEE binary16 bits (overflow to infinity).
uint16_t float_to_fp16_bits(float f);

/// Multiplies n contiguous float32 elements by `factor` in place (skipped when factor == 1)
/// and returns whether every element was finite before scaling. OpenMP over cores. Local.
bool scale_and_check_finite(float* x, int64_t n, float factor);

/// Sum of squares of n contiguous float32 elements, accumulated in float64. Local.
double sum_of_squares(const float* x, int64_t n);

}  // namespace shardgan
