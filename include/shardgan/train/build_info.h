#pragma once
/// What this binary was built with and runs on: printed by `shardgan-train --version` and
/// at the top of every run's log, so that a number in a report can be traced to the BLAS,
/// oneDNN build and CPU capability that produced it.
#include <string>

#include <nlohmann/json.hpp>

namespace shardgan {

/// Versions and settings as one JSON object (not a collective; any rank, MPI initialized or
/// not):
///  - `shardgan`: the project version and the git commit it was configured at;
///  - `torch`: version, `blas` (BLAS_INFO: "mkl" for the wheel), `onednn` version,
///    `cpu_capability` (the ATen kernel level in use: DEFAULT, AVX2, AVX512),
///    `cuda_compiled` (bool: the wheel's build), `cuda_version`, `cudnn_version`,
///    `cuda_loaded` (bool: libtorch_cuda.so is in this process; shardgan links the CPU library
///    only), `cuda_devices` (visible now; 0 unless loaded);
///  - `mpi`: MPI_Get_library_version's first line; `hdf5`: "major.minor.release";
///  - `nccl`: the NCCL library's version, or "not compiled in";
///  - `threads`: at::get_num_threads() and at::get_num_interop_threads() now.
nlohmann::json build_info();

/// build_info() as aligned "name: value" lines, for --version and the log.
std::string build_info_text();

}  // namespace shardgan
