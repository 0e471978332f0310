#include "shardgan/device/device.h"

#include <dlfcn.h>
#include <cstdlib>

#include <filesystem>

#include <c10/core/CPUAllocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <torch/cuda.h>

#include "device/cuda_runtime.h"

namespace shardgan {

bool cuda_compiled_in() { return detail::cuda_runtime_compiled_in(); }

namespace {
bool cuda_loaded = false;

// A GPU is in use: LibTorch's CUDA library was loaded and sees at least one device.
bool gpu_in_use() { return cuda_loaded && torch::cuda::device_count() > 0; }
}  // namespace

void load_cuda_runtime() {
  bool& loaded = cuda_loaded;
  if (loaded) return;
  if (!cuda_compiled_in()) {
    throw DeviceError("this build of shardgan has no CUDA runtime compiled in (CMake did not find cudart)");
  }
  // libtorch_cuda.so sits next to libc10.so (the wheel's torch/lib).
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&c10::GetCPUAllocator), &info) == 0 || !info.dli_fname) {
    throw DeviceError("cannot locate LibTorch's libraries (dladdr failed)");
  }
  const std::string lib = (std::filesystem::path(info.dli_fname).parent_path() / "libtorch_cuda.so").string();
  // RTLD_GLOBAL: its kernels, allocator and hooks register with the already-loaded
  // libtorch_cpu/libc10 through static initializers; nothing of it is called by name.
  if (!dlopen(lib.c_str(), RTLD_NOW | RTLD_GLOBAL)) {
    const char* e = dlerror();
    throw DeviceError("cannot load LibTorch's CUDA library " + lib + ": " + (e ? e : "unknown error") +
                      ". Re-run scripts/setup.sh (the torch wheel brings its CUDA libraries as pip packages)");
  }
  loaded = true;
}

int cuda_device_count() {
  load_cuda_runtime();
  return static_cast<int>(torch::cuda::device_count());
}

int64_t device_memory_used_bytes() {
  if (!gpu_in_use()) return -1;
  return detail::cuda_device_used_bytes();
}

int64_t take_device_peak_allocated_bytes() {
  if (!gpu_in_use()) return -1;
  auto* allocator = c10::getDeviceAllocator(c10::kCUDA);
  const auto index = static_cast<c10::DeviceIndex>(detail::cuda_current_device());
  const int64_t peak =
      allocator->getDeviceStats(index).allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].peak;
  allocator->resetPeakStats(index);
  return peak;
}

at::Device resolve_device(const std::string& run_device, int local_rank, const std::string& source) {
  if (run_device == "cpu") return at::Device(at::kCPU);
  const std::string where = source + ": run.device=" + run_device + " (local rank " + std::to_string(local_rank) + ")";
  if (run_device != "cuda") throw DeviceError(where + ": expected cpu or cuda");
  if (!cuda_compiled_in()) {
    throw DeviceError(where + ": this build has no CUDA compiled in (CMake did not find the CUDA runtime). Use "
                      "run.device=cpu, or rebuild on a machine with the CUDA toolkit under /usr/local/cuda");
  }
  int n = 0;
  try {
    n = cuda_device_count();
  } catch (const DeviceError& e) {
    throw DeviceError(where + ": " + e.what());
  }
  if (n == 0) {
    throw DeviceError(where + ": no GPU is visible to this process (no driver, no device, or CUDA_VISIBLE_DEVICES "
                      "empty). Use run.device=cpu (with dist.backend=mpi), or run on a machine with a GPU");
  }
  if (local_rank < 0) local_rank = 0;
  if (local_rank >= n) {
    // NCCL 2.30 and later accept several ranks on one GPU when this variable is 1; older NCCL
    // refuses them at communicator creation ("Duplicate GPU detected"), naming the variable.
    const char* multi = std::getenv("NCCL_MULTI_RANK_GPU_ENABLE");
    if (multi == nullptr || std::string(multi) != "1") {
      throw DeviceError(where + ": this rank needs GPU " + std::to_string(local_rank) + " but only " +
                        std::to_string(n) + " are visible: start at most " + std::to_string(n) +
                        " ranks per node, or set NCCL_MULTI_RANK_GPU_ENABLE=1 with NCCL 2.30 or later "
                        "to place several ranks on one GPU");
    }
    local_rank %= n;
  }
  detail::cuda_set_device(local_rank);
  return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(local_rank));
}

}  // namespace shardgan
