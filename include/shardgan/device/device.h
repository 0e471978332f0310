#pragma once
/// Which device a rank computes on, and loading LibTorch's CUDA kernels when it is a GPU.
///
/// The engine is device-generic: it allocates with the tensor options of the tensors it is
/// given, so a model built on `cuda:<local rank>` keeps its flat parameters, shards,
/// gradients and optimizer state there. The few CUDA runtime calls live in src/device/
/// (events, pinned host memory) and in the NCCL communicator.
///
/// libshardgan links LibTorch's CPU library only (libtorch_cuda.so and the CUDA libraries
/// behind it cost about 0.25 GiB of RSS per rank at load, GPU or not:
/// docs/benchmarks-torch.md). A rank with `run.device: cuda` loads them once, at startup,
/// with load_cuda_runtime(); their static initializers register the CUDA kernels, the
/// caching allocator and the CUDA hooks with the dispatcher, as `import torch` does.
#include <cstdint>
#include <stdexcept>
#include <string>

#include <c10/core/Device.h>

namespace shardgan {

/// A device that is not there or cannot be used: the message names the config key
/// (run.device) and says what to do.
class DeviceError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Whether this build has the CUDA runtime compiled in (SHARDGAN_HAVE_CUDA: CMake found
/// cudart; the NCCL backend needs it too). Local.
bool cuda_compiled_in();

/// Loads LibTorch's CUDA library (libtorch_cuda.so, next to libtorch_cpu.so) into the
/// process, once; later calls return at once. Local, not thread-safe against a concurrent
/// first call. Throws DeviceError when CUDA is not compiled in or the library (or one it
/// needs) cannot be loaded; the message carries dlerror().
void load_cuda_runtime();

/// Number of GPUs this process can see (after load_cuda_runtime(), which it calls): 0
/// without a driver or GPU, or with CUDA_VISIBLE_DEVICES empty. Throws as load_cuda_runtime.
int cuda_device_count();

/// Bytes in use on this process's current GPU (cudaMemGetInfo: total - free, so the CUDA
/// context, the caching allocator's reserved blocks and other processes on that GPU are
/// included; the caching allocator keeps what it reserved, so after a step this is that
/// step's peak reservation plus the context). -1 when no GPU is in use (load_cuda_runtime()
/// never ran, or no GPU is visible). Local; throws DeviceError if the CUDA call fails.
int64_t device_memory_used_bytes();

/// The peak of bytes held by live tensors on this process's current GPU since the last call
/// (or since the process started), then resets that peak: LibTorch's caching allocator's
/// statistic, torch.cuda.max_memory_allocated() followed by reset_peak_memory_stats(). Unlike
/// device_memory_used_bytes() it leaves out the CUDA context, the libraries' workspaces and
/// blocks the allocator keeps cached: what activations, gathered parameters and model state
/// needed at once. -1 when no GPU is in use. Local; throws c10::Error if the allocator
/// has no statistics.
int64_t take_device_peak_allocated_bytes();

/// The device of `run.device` for the rank with local rank `local_rank` on its node:
///  - "cpu": at::kCPU;
///  - "cuda": cuda:<local_rank>, after load_cuda_runtime() (one GPU per rank, as NCCL before
///    2.30 requires; with CUDA_VISIBLE_DEVICES the index counts visible GPUs). With more local
///    ranks than visible GPUs and NCCL_MULTI_RANK_GPU_ENABLE=1 in the environment (NCCL 2.30's
///    switch for several ranks per GPU), cuda:<local_rank mod visible GPUs>.
/// `source` names the config file in messages. Local. Throws DeviceError, naming
/// run.device and the rank, for anything else: an unknown name, "cuda" without CUDA
/// compiled in, with no visible GPU, or with fewer visible GPUs than local ranks and
/// NCCL_MULTI_RANK_GPU_ENABLE not 1.
at::Device resolve_device(const std::string& run_device, int local_rank, const std::string& source);

}  // namespace shardgan
