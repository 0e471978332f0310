// Peak memory of an all-gather above INT_MAX elements per rank: the derived-
// datatype path of MpiCommunicator against the staged split it replaced (reproduced here as
// the baseline: per call, a clone of the shard's column range and a world_size x len
// staging buffer). uint8 elements, so that 2^31 + 7 of them fit this 24 GiB machine.
//   mpirun -np N build/benchmarks/bench_large_allgather [derived|staged] [elements]
// Prints one JSON line per rank: the mode, elements, seconds, and VmHWM before and after
// (bytes, from /proc/self/status), next to the formula (shard + full, plus the staging).
#include <mpi.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "shardgan/comm/mpi_communicator.h"
#include "registry.h"

// This file's names live in a namespace of their own (benchmarks/registry.h).
namespace SHARDGAN_UNITY_ID {

namespace {

int64_t vm_hwm_bytes() {
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return -1;
}

// The pre-issue-22 split, for the baseline: max_count columns of every block per call.
void staged_all_gather(MPI_Comm comm, int world, at::Tensor& full, const at::Tensor& shard, int64_t max_count) {
  const int64_t s = shard.numel();
  at::Tensor rows = full.view({world, s});
  for (int64_t a = 0; a < s; a += max_count) {
    const int64_t len = std::min(max_count, s - a);
    at::Tensor part = shard.narrow(0, a, len).clone();
    at::Tensor staged = at::empty({world * len}, full.options());
    MPI_Allgather(part.data_ptr(), static_cast<int>(len), MPI_UINT8_T, staged.data_ptr(), static_cast<int>(len),
                  MPI_UINT8_T, comm);
    rows.narrow(1, a, len).copy_(staged.view({world, len}));
  }
}

}  // namespace

int bench_main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  const std::string mode = argc > 1 ? argv[1] : "derived";
  const int64_t n = argc > 2 ? std::stoll(argv[2]) : (int64_t{1} << 31) + 7;
  shardgan::MpiCommunicator comm(MPI_COMM_WORLD, 600.0);
  const int world = comm.world_size(), rank = comm.rank();
  at::Tensor shard = torch::full({n}, static_cast<uint8_t>(rank + 1), torch::kByte);
  at::Tensor full = torch::zeros({n * world}, torch::kByte);
  comm.barrier();
  const int64_t hwm0 = vm_hwm_bytes();
  const auto t0 = std::chrono::steady_clock::now();
  if (mode == "staged") {
    staged_all_gather(MPI_COMM_WORLD, world, full, shard, INT_MAX);
  } else {
    comm.all_gather(full, shard);
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Correctness: block r holds r + 1 everywhere (checked at its first, middle and last element).
  bool ok = true;
  for (int r = 0; r < world; ++r) {
    for (int64_t i : {int64_t{0}, n / 2, n - 1}) ok = ok && full[r * n + i].item<int>() == r + 1;
  }
  nlohmann::json j = {{"bench", "large_allgather"}, {"mode", mode}, {"rank", rank}, {"world", world},
                      {"elements_per_rank", n}, {"seconds", secs}, {"correct", ok},
                      {"vm_hwm_before_bytes", hwm0}, {"vm_hwm_after_bytes", vm_hwm_bytes()},
                      {"formula_bytes", n * (1 + world) + (mode == "staged" ? n * (1 + world) : 0)}};
  std::printf("%s\n", j.dump().c_str());
  MPI_Finalize();
  return ok ? 0 : 1;
}

}  // namespace SHARDGAN_UNITY_ID

SHARDGAN_BENCHMARK(bench_large_allgather)
