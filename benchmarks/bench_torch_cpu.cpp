// What the LibTorch we build on delivers on this CPU, on one thread: float32 and bfloat16
// GEMM at 1024^3 and a 3x3 convolution at 256 channels (batch 8, 16x16, padding 1) in
// float32 and bfloat16. These are the floors under every Linear, attention bmm, class
// projection and conv of our models (Debian's 1.13 with reference BLAS gave
// 2.7 GFLOP/s for the float32 GEMM).
//
//   bench_torch_cpu [reps=5] [threads=1]
//
// Prints one JSON object: *_gflops (best of reps, 2*M*N*K or 2*N*Cout*Cin*9*H*W flops per
// call), the torch build (BLAS, oneDNN, CPU capability) and a correctness check of each
// bfloat16 result against float32 (max abs error relative to max |result|).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "shardgan/train/build_info.h"
#include "registry.h"

// This file's names live in a namespace of their own (benchmarks/registry.h).
namespace SHARDGAN_UNITY_ID {

namespace {

double best_seconds(int reps, const std::function<void()>& fn) {
  fn();  // warm-up: oneDNN primitive creation, first touch
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

double rel_err(const at::Tensor& approx, const at::Tensor& exact) {
  return ((approx.to(at::kFloat) - exact).abs().max() / exact.abs().max()).item<double>();
}

}  // namespace

int bench_main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 5;
  const int threads = argc > 2 ? std::atoi(argv[2]) : 1;
  torch::set_num_threads(threads);
  torch::NoGradGuard no_grad;
  torch::manual_seed(0);
  nlohmann::json out;
  out["threads"] = threads;
  out["reps"] = reps;
  out["torch"] = shardgan::build_info()["torch"];

  const int64_t n = 1024;
  const double gemm_flops = 2.0 * n * n * n;
  at::Tensor a = torch::randn({n, n}), b = torch::randn({n, n});
  at::Tensor c32;
  const double t32 = best_seconds(reps, [&] { c32 = torch::mm(a, b); });
  out["f32_gemm_gflops"] = gemm_flops / t32 / 1e9;
  at::Tensor a16 = a.to(at::kBFloat16), b16 = b.to(at::kBFloat16), c16;
  const double t16 = best_seconds(reps, [&] { c16 = torch::mm(a16, b16); });
  out["bf16_gemm_gflops"] = gemm_flops / t16 / 1e9;
  out["bf16_gemm_rel_err"] = rel_err(c16, c32);

  const int64_t nb = 8, ch = 256, hw = 16;
  const double conv_flops = 2.0 * nb * ch * ch * 9 * hw * hw;
  at::Tensor x = torch::randn({nb, ch, hw, hw}), w = torch::randn({ch, ch, 3, 3}) * 0.02;
  at::Tensor y32, y16;
  const double tc32 = best_seconds(reps, [&] { y32 = torch::conv2d(x, w, {}, 1, 1); });
  out["conv_f32_gflops"] = conv_flops / tc32 / 1e9;
  at::Tensor x16 = x.to(at::kBFloat16), w16 = w.to(at::kBFloat16);
  const double tc16 = best_seconds(reps, [&] { y16 = torch::conv2d(x16, w16, {}, 1, 1); });
  out["conv_bf16_gflops"] = conv_flops / tc16 / 1e9;
  out["conv_bf16_rel_err"] = rel_err(y16, y32);
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
}

}  // namespace SHARDGAN_UNITY_ID

SHARDGAN_BENCHMARK(bench_torch_cpu)
