// The benchmarks are one executable, shardgan_benchmarks, compiled in one batch (a batch
// loads the precompiled torch header and emits torch's inline code once, where each
// benchmark alone paid for both). Each benchmarks/bench_*.cpp wraps its code in
// `namespace SHARDGAN_UNITY_ID { ... }` (CMake defines the macro per file), defines
// `int bench_main(int, char**)` there, and registers it under its file's name:
//
//   SHARDGAN_BENCHMARK(bench_offload)
//
// build/benchmarks/bench_offload is a link to the executable; called by that name (argv[0]),
// it runs that benchmark's bench_main with the same arguments (benchmarks/bench_main.cpp).
#pragma once

namespace shardgan::bench {

using BenchMain = int (*)(int argc, char** argv);

/// Adds `fn` under `name` (the file's name without .cpp) to the table that main() picks
/// from by argv[0]. Called during static initialization; returns true.
bool register_benchmark(const char* name, BenchMain fn);

}  // namespace shardgan::bench

/// Registers this file's SHARDGAN_UNITY_ID::bench_main as benchmark `name`. Place after the
/// file's namespace, at global scope.
#define SHARDGAN_BENCHMARK(name)                                                              \
  namespace SHARDGAN_UNITY_ID {                                                               \
  [[maybe_unused]] const bool registered_##name =                                             \
      ::shardgan::bench::register_benchmark(#name, &SHARDGAN_UNITY_ID::bench_main);           \
  }
