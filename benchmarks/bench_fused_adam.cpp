// Fused Adam step throughput on one large float32 tensor, against three baselines measured in
// the same run: torch's own fused CPU Adam (at::_fused_adam_, what torch.optim.Adam(fused=True)
// runs; the one to beat), torch::optim::Adam on the same tensor, and the machine's memory bandwidth
// from a STREAM-style triad (a = b + s*c, counted as 12 bytes per float element, STREAM's
// convention: no write-allocate traffic). Adam moves 28 bytes per parameter (reads p, g, m,
// v; writes p, m, v), 30 with a 16-bit parameter copy.
//
//   bench_fused_adam [numel=50000000] [reps=5] [threads=cores]
//
// Prints one JSON object. Speed is only reported next to a correctness check: the fused
// result is compared with the reference loop (bitwise) and with torch's Adam.
//
// Low-precision states (`low_precision_states`): the same step with m and v block-wise 8-bit
// (blocks of 256: reads p, g, two code bytes and two absmax per 256; writes p, the codes and
// the absmax: 16.06 bytes per parameter), with m not stored (beta1 = 0, BigGAN: 14.03), and
// with bfloat16 m and v (20). Parameters per second are the figure to compare: the float32
// kernel moves 28 bytes for each.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "shardgan/optim/blockwise_quant.h"
#include "shardgan/optim/fused_adam.h"
#include "registry.h"

// This file's names live in a namespace of their own (benchmarks/registry.h).
namespace SHARDGAN_UNITY_ID {

using namespace shardgan;
using Clock = std::chrono::steady_clock;

namespace {

struct Timing {
  double min_s = 0, median_s = 0;
};

Timing time_it(int reps, const std::function<void()>& fn) {
  fn();  // warm-up: first touch, page faults, thread start
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return {t.front(), t[t.size() / 2]};
}

nlohmann::json entry(const Timing& t, double bytes) {
  return {{"min_s", t.min_s}, {"median_s", t.median_s}, {"gbps_best", bytes / t.min_s / 1e9},
          {"gbps_median", bytes / t.median_s / 1e9}};
}

void triad(float* a, const float* b, const float* c, int64_t n, int threads) {
#pragma omp parallel for simd num_threads(threads) schedule(static)
  for (int64_t i = 0; i < n; ++i) a[i] = b[i] + 3.0f * c[i];
}

// The same with AVX-512 non-temporal stores: no write-allocate read of `a`, so more of the
// bus carries counted bytes. The fraction is taken against the faster of the two triads.
__attribute__((target("avx512f"))) void triad_nt(float* a, const float* b, const float* c, int64_t n, int threads) {
  const int64_t blocks = n / 16;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t k = 0; k < blocks; ++k) {
    const __m512 r = _mm512_fmadd_ps(_mm512_set1_ps(3.0f), _mm512_load_ps(c + 16 * k), _mm512_load_ps(b + 16 * k));
    _mm512_stream_ps(a + 16 * k, r);
  }
  _mm_sfence();
  for (int64_t i = blocks * 16; i < n; ++i) a[i] = b[i] + 3.0f * c[i];
}

// The straightforward loop a compiler vectorizes by itself (baseline x86-64: SSE2).
void plain_adam(float* p, const float* g, float* m, float* v, int64_t n, const AdamCoefficients& c, int threads) {
#pragma omp parallel for simd num_threads(threads) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    m[i] = c.beta1 * m[i] + c.one_minus_beta1 * g[i];
    v[i] = c.beta2 * v[i] + c.one_minus_beta2 * g[i] * g[i];
    p[i] -= c.step_size * m[i] / (std::sqrt(v[i]) * c.inv_sqrt_bc2 + c.eps);
  }
}

}  // namespace

int bench_main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : 50'000'000;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 5;
  const int threads = argc > 3 ? std::atoi(argv[3]) : omp_get_num_procs();
  torch::set_num_threads(threads);
  torch::NoGradGuard no_grad;
  torch::manual_seed(0);
  const double lr = 1e-3, b1 = 0.9, b2 = 0.999, eps = 1e-8;
  const double adam_bytes = 28.0 * static_cast<double>(n);

  nlohmann::json out;
  out["numel"] = n;
  out["reps"] = reps;
  out["threads"] = threads;
  out["best_isa"] = to_string(best_cpu_isa());
  out["bytes_per_param"] = 28;

  // Baseline 1: memory bandwidth (triad).
  {
    at::Tensor a = torch::zeros({n}), b = torch::ones({n}), c = torch::full({n}, 2.0f);
    Timing t = time_it(reps, [&] { triad(a.data_ptr<float>(), b.data_ptr<float>(), c.data_ptr<float>(), n, threads); });
    out["triad"] = entry(t, 12.0 * static_cast<double>(n));
    // torch's CPU allocator aligns to 64 bytes, as _mm512_load_ps/_mm512_stream_ps need.
    if (cpu_supports(CpuIsa::kAvx512)) {
      Timing tn = time_it(reps, [&] { triad_nt(a.data_ptr<float>(), b.data_ptr<float>(), c.data_ptr<float>(), n, threads); });
      out["triad_nt"] = entry(tn, 12.0 * static_cast<double>(n));
    }
  }

  at::Tensor p0 = torch::randn({n}), g = torch::randn({n}) * 1e-2;

  // Baseline 2: torch::optim::Adam on the same tensor.
  at::Tensor p_torch = p0.clone();
  {
    at::Tensor p = p_torch.requires_grad_(true);
    p.mutable_grad() = g;
    torch::optim::Adam opt({p}, torch::optim::AdamOptions(lr).betas({b1, b2}).eps(eps));
    Timing t = time_it(reps, [&] { opt.step(); });
    out["torch_adam"] = entry(t, adam_bytes);
  }
  const int64_t torch_steps = reps + 1;

  // Baseline 3: torch's fused CPU Adam. torch.optim.Adam(fused=True) increments the step
  // tensor, then calls this op on lists of tensors (here one flat tensor, as our shard is).
  at::Tensor p_tfused = p0.clone();
  {
    at::Tensor mf = torch::zeros({n}), vf = torch::zeros({n}), step_t = torch::zeros({}, torch::kFloat);
    Timing t = time_it(reps, [&] {
      step_t += 1;
      at::_fused_adam_({p_tfused}, {g}, {mf}, {vf}, {}, {step_t}, lr, b1, b2, 0.0, eps, false, false);
    });
    out["torch_fused_adam"] = entry(t, adam_bytes);
  }

  // The fused kernel, each path this CPU has, and the plain loop.
  at::Tensor p = p0.clone(), m = torch::zeros({n}), v = torch::zeros({n});
  at::Tensor copy = torch::empty({n}, torch::kBFloat16);
  int64_t step = 0;
  auto run = [&](CpuIsa isa, ParamCopy pc) {
    ++step;
    fused_adam_step(p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(), n,
                    adam_coefficients(lr, b1, b2, eps, 0, false, step), pc,
                    static_cast<uint16_t*>(copy.data_ptr()), isa, threads);
  };
  nlohmann::json fused;
  for (CpuIsa isa : {CpuIsa::kAvx512, CpuIsa::kAvx2, CpuIsa::kScalar}) {
    if (!cpu_supports(isa) || (isa == CpuIsa::kScalar && best_cpu_isa() != CpuIsa::kScalar)) continue;
    fused[to_string(isa)] = entry(time_it(reps, [&] { run(isa, ParamCopy::kNone); }), adam_bytes);
  }
  fused[std::string(to_string(best_cpu_isa())) + "+bf16_copy"] =
      entry(time_it(reps, [&] { run(best_cpu_isa(), ParamCopy::kBFloat16); }), 30.0 * static_cast<double>(n));
  out["fused_adam"] = fused;
  {
    at::Tensor pp = p0.clone(), mm = torch::zeros({n}), vv = torch::zeros({n});
    const AdamCoefficients c = adam_coefficients(lr, b1, b2, eps, 0, false, 3);
    out["plain_omp_simd_adam"] = entry(
        time_it(reps, [&] { plain_adam(pp.data_ptr<float>(), g.data_ptr<float>(), mm.data_ptr<float>(), vv.data_ptr<float>(), n, c, threads); }),
        adam_bytes);
  }

  // Low-precision states: parameters per second against the float32 kernel's.
  {
    const int64_t block = 256, nb = num_blocks(n, block);
    const double blocks_per_param = 1.0 / static_cast<double>(block);
    at::Tensor pp = p0.clone();
    at::Tensor mc = torch::full({n}, static_cast<int64_t>(zero_code(CodeMap::kSigned)), torch::kUInt8);
    at::Tensor vc = torch::full({n}, static_cast<int64_t>(zero_code(CodeMap::kUnsigned)), torch::kUInt8);
    at::Tensor ma = torch::zeros({nb}), va = torch::zeros({nb});
    at::Tensor mb = torch::zeros({n}, torch::kBFloat16), vb = torch::zeros({n}, torch::kBFloat16);
    int64_t s8 = 0;
    nlohmann::json lp;
    auto per_param = [&](const Timing& t, double bytes_per_param) {
      nlohmann::json e = entry(t, bytes_per_param * static_cast<double>(n));
      e["bytes_per_param"] = bytes_per_param;
      e["params_per_s_best"] = static_cast<double>(n) / t.min_s;
      return e;
    };
    lp["int8_blockwise"] = per_param(time_it(reps, [&] {
      ++s8;
      fused_adam8_step(pp.data_ptr<float>(), g.data_ptr<float>(), {mc.data_ptr<uint8_t>(), ma.data_ptr<float>()},
                       {vc.data_ptr<uint8_t>(), va.data_ptr<float>()}, n, block,
                       adam_coefficients(lr, b1, b2, eps, 0, false, s8), ParamCopy::kNone, nullptr, best_cpu_isa(), threads);
    }), 16.0 + 16.0 * blocks_per_param);
    s8 = 0;
    lp["int8_blockwise_no_m"] = per_param(time_it(reps, [&] {
      ++s8;
      fused_adam8_step(pp.data_ptr<float>(), g.data_ptr<float>(), {}, {vc.data_ptr<uint8_t>(), va.data_ptr<float>()}, n,
                       block, adam_coefficients(lr, 0.0, b2, eps, 0, false, s8), ParamCopy::kNone, nullptr,
                       best_cpu_isa(), threads);
    }), 14.0 + 8.0 * blocks_per_param);
    s8 = 0;
    lp["bfloat16"] = per_param(time_it(reps, [&] {
      ++s8;
      fused_adam_bf16_step(pp.data_ptr<float>(), g.data_ptr<float>(), static_cast<uint16_t*>(mb.data_ptr()),
                           static_cast<uint16_t*>(vb.data_ptr()), n, adam_coefficients(lr, b1, b2, eps, 0, false, s8),
                           ParamCopy::kNone, nullptr, best_cpu_isa(), threads);
    }), 20.0);
    const double f32 = static_cast<double>(n) / out["fused_adam"][to_string(best_cpu_isa())]["min_s"].get<double>();
    lp["float32_params_per_s_best"] = f32;
    for (const char* k : {"int8_blockwise", "int8_blockwise_no_m", "bfloat16"}) {
      lp[k]["speed_vs_float32"] = lp[k]["params_per_s_best"].get<double>() / f32;
    }
    out["low_precision_states"] = lp;
  }

  // Correctness next to the speed: (1) bitwise against the reference loop on a slice, for
  // one more step from the current state; (2) the fused run from p0 against torch's run
  // after the same number of steps.
  {
    const int64_t k = std::min<int64_t>(n, 1 << 20);
    at::Tensor rp = p.narrow(0, 0, k).clone(), rm = m.narrow(0, 0, k).clone(), rv = v.narrow(0, 0, k).clone();
    ++step;
    const AdamCoefficients c = adam_coefficients(lr, b1, b2, eps, 0, false, step);
    fused_adam_step(p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(), n, c,
                    ParamCopy::kNone, nullptr, best_cpu_isa(), threads);
    reference_adam_step(rp.data_ptr<float>(), g.data_ptr<float>(), rm.data_ptr<float>(), rv.data_ptr<float>(), k, c);
    const int64_t wrong = (rp != p.narrow(0, 0, k)).sum().item<int64_t>() + (rm != m.narrow(0, 0, k)).sum().item<int64_t>() +
                          (rv != v.narrow(0, 0, k)).sum().item<int64_t>();
    out["check_vs_reference_loop"] = {{"elements", k}, {"wrong", wrong}};

    at::Tensor q = p0.clone(), qm = torch::zeros({n}), qv = torch::zeros({n});
    for (int64_t s = 1; s <= torch_steps; ++s) {
      fused_adam_step(q.data_ptr<float>(), g.data_ptr<float>(), qm.data_ptr<float>(), qv.data_ptr<float>(), n,
                      adam_coefficients(lr, b1, b2, eps, 0, false, s), ParamCopy::kNone, nullptr, best_cpu_isa(), threads);
    }
    const double rel = ((q - p_torch.detach()).abs().max() / p_torch.detach().abs().max()).item<double>();
    out["check_vs_torch_adam"] = {{"steps", torch_steps}, {"max_rel_diff", rel}};
    const double rel_f = ((q - p_tfused).abs().max() / p_tfused.abs().max()).item<double>();
    out["check_vs_torch_fused_adam"] = {{"steps", torch_steps}, {"max_rel_diff", rel_f}};
  }

  const double best = out["fused_adam"][to_string(best_cpu_isa())]["gbps_best"].get<double>();
  out["speedup_vs_torch_adam"] = best / out["torch_adam"]["gbps_best"].get<double>();
  out["speedup_vs_torch_fused_adam"] = best / out["torch_fused_adam"]["gbps_best"].get<double>();
  double triad_best = out["triad"]["gbps_best"].get<double>();
  if (out.contains("triad_nt")) triad_best = std::max(triad_best, out["triad_nt"]["gbps_best"].get<double>());
  out["fraction_of_triad"] = best / triad_best;
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
}

}  // namespace SHARDGAN_UNITY_ID

SHARDGAN_BENCHMARK(bench_fused_adam)
