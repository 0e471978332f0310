// Every CUDA runtime call of src/device/ (the NCCL communicator has its own).
#include "device/cuda_runtime.h"

#include <string>

#include "shardgan/device/device.h"

#ifdef SHARDGAN_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace shardgan::detail {

#ifdef SHARDGAN_HAVE_CUDA

namespace {
void check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  throw DeviceError(std::string(what) + " failed: " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}
}  // namespace

bool cuda_runtime_compiled_in() { return true; }

void cuda_set_device(int index) { check(cudaSetDevice(index), "cudaSetDevice"); }

int cuda_current_device() {
  int index = 0;
  check(cudaGetDevice(&index), "cudaGetDevice");
  return index;
}

void* cuda_event_create(int index) {
  check(cudaSetDevice(index), "cudaSetDevice");
  cudaEvent_t ev = nullptr;
  check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  return ev;
}

void cuda_event_destroy(void* ev) {
  if (ev) cudaEventDestroy(static_cast<cudaEvent_t>(ev));
}

void cuda_event_record(void* ev, int index) { cuda_event_record_on(ev, cudaStreamLegacy, index); }

void cuda_event_synchronize(void* ev) {
  check(cudaEventSynchronize(static_cast<cudaEvent_t>(ev)), "cudaEventSynchronize");
}

void* cuda_stream_create(int index) {
  check(cudaSetDevice(index), "cudaSetDevice");
  cudaStream_t s = nullptr;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  return s;
}

void cuda_stream_destroy(void* stream) {
  if (stream) cudaStreamDestroy(static_cast<cudaStream_t>(stream));
}

void cuda_event_record_on(void* ev, void* stream, int index) {
  check(cudaSetDevice(index), "cudaSetDevice");
  check(cudaEventRecord(static_cast<cudaEvent_t>(ev), static_cast<cudaStream_t>(stream)), "cudaEventRecord");
}

void cuda_memcpy_async(void* dst, const void* src, int64_t bytes, void* stream, int index) {
  check(cudaSetDevice(index), "cudaSetDevice");
  check(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDefault, static_cast<cudaStream_t>(stream)),
        "cudaMemcpyAsync");
}

void cuda_host_register(void* p, int64_t bytes) {
  check(cudaHostRegister(p, static_cast<size_t>(bytes), cudaHostRegisterPortable), "cudaHostRegister");
}

void cuda_host_unregister(void* p) { cudaHostUnregister(p); }

int64_t cuda_device_used_bytes() {
  size_t free = 0, total = 0;
  check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  return static_cast<int64_t>(total - free);
}

#else

namespace {
[[noreturn]] void missing(const char* what) {
  throw DeviceError(std::string(what) + ": this build has no CUDA runtime compiled in");
}
}  // namespace

bool cuda_runtime_compiled_in() { return false; }
void cuda_set_device(int) { missing("cudaSetDevice"); }
int cuda_current_device() { missing("cudaGetDevice"); }
void* cuda_event_create(int) { missing("cudaEventCreate"); }
void cuda_event_destroy(void*) {}
void cuda_event_record(void*, int) { missing("cudaEventRecord"); }
void cuda_event_synchronize(void*) { missing("cudaEventSynchronize"); }
void* cuda_stream_create(int) { missing("cudaStreamCreate"); }
void cuda_stream_destroy(void*) {}
void cuda_event_record_on(void*, void*, int) { missing("cudaEventRecord"); }
void cuda_memcpy_async(void*, const void*, int64_t, void*, int) { missing("cudaMemcpyAsync"); }
void cuda_host_register(void*, int64_t) { missing("cudaHostRegister"); }
void cuda_host_unregister(void*) {}
int64_t cuda_device_used_bytes() { missing("cudaMemGetInfo"); }

#endif

}  // namespace shardgan::detail
