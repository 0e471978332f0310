#include "shardgan/train/build_info.h"

#include <dlfcn.h>
#include <hdf5.h>
#include <mpi.h>

#include <regex>
#include <sstream>

#include <ATen/Parallel.h>
#include <torch/cuda.h>
#include <torch/version.h>

#include "shardgan/comm/factory.h"

#ifndef SHARDGAN_VERSION
#define SHARDGAN_VERSION "unknown"
#endif
#ifndef SHARDGAN_GIT_COMMIT
#define SHARDGAN_GIT_COMMIT "unknown"
#endif

namespace shardgan {
namespace {

// One field of at::show_config() (the text torch.__config__.show() prints), or "".
std::string config_field(const std::string& config, const std::string& pattern) {
  std::smatch m;
  return std::regex_search(config, m, std::regex(pattern)) ? m[1].str() : std::string();
}

}  // namespace

nlohmann::json build_info() {
  const std::string cfg = at::show_config();
  nlohmann::json torch_info = {
      {"version", TORCH_VERSION},
      {"blas", config_field(cfg, "BLAS_INFO=([^,\\s]+)")},
      {"onednn", config_field(cfg, "MKL-DNN (v[0-9.]+)")},
      {"cpu_capability", config_field(cfg, "CPU capability usage: (\\S+)")},
      {"cuda_compiled", config_field(cfg, "USE_CUDA=(\\S+?),") == "1" || config_field(cfg, "USE_CUDA=(\\S+?),") == "ON"},
      {"cuda_version", config_field(cfg, "CUDA_VERSION=([^,\\s]+)")},
      {"cudnn_version", config_field(cfg, "CUDNN_VERSION=([^,\\s]+)")},
      // shardgan links LibTorch's CPU library only; the CUDA one is loaded for GPU runs.
      {"cuda_loaded", dlopen("libtorch_cuda.so", RTLD_LAZY | RTLD_NOLOAD) != nullptr},
      {"cuda_devices", static_cast<int64_t>(torch::cuda::device_count())},
  };
  char mpi_version[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
  int len = 0;
  MPI_Get_library_version(mpi_version, &len);
  std::string mpi(mpi_version, static_cast<size_t>(len));
  if (auto nl = mpi.find_first_of("\n,"); nl != std::string::npos) mpi.resize(nl);
  unsigned maj = 0, min = 0, rel = 0;
  H5get_libversion(&maj, &min, &rel);
  return {
      {"shardgan", std::string(SHARDGAN_VERSION) + " (" + SHARDGAN_GIT_COMMIT + ")"},
      {"torch", torch_info},
      {"mpi", mpi},
      {"hdf5", std::to_string(maj) + "." + std::to_string(min) + "." + std::to_string(rel)},
      {"nccl", nccl_version()},
      {"threads", {{"intra_op", at::get_num_threads()}, {"inter_op", at::get_num_interop_threads()}}},
  };
}

std::string build_info_text() {
  const nlohmann::json b = build_info();
  const auto& t = b["torch"];
  std::ostringstream o;
  o << "shardgan " << b["shardgan"].get<std::string>() << "\n"
    << "  torch    " << t["version"].get<std::string>() << " (BLAS " << t["blas"].get<std::string>()
    << ", oneDNN " << t["onednn"].get<std::string>() << ", CPU capability " << t["cpu_capability"].get<std::string>()
    << ", CUDA " << (t["cuda_compiled"].get<bool>() ? "compiled in: " + t["cuda_version"].get<std::string>() +
                                                         ", cuDNN " + t["cudnn_version"].get<std::string>() + ", " +
                                                         (t["cuda_loaded"].get<bool>()
                                                              ? std::to_string(t["cuda_devices"].get<int64_t>()) + " GPU(s) visible"
                                                              : std::string("libtorch_cuda not loaded"))
                                                   : std::string("not compiled in"))
    << ")\n"
    << "  MPI      " << b["mpi"].get<std::string>() << "\n"
    << "  HDF5     " << b["hdf5"].get<std::string>() << "\n"
    << "  NCCL     " << b["nccl"].get<std::string>() << "\n"
    << "  threads  " << b["threads"]["intra_op"].get<int>() << " intra-op, " << b["threads"]["inter_op"].get<int>()
    << " inter-op per rank";
  return o.str();
}

}  // namespace shardgan
