#pragma once
// The CUDA runtime calls of src/device/, behind plain functions, so that only
// cuda_runtime.cpp includes cuda_runtime_api.h. Without SHARDGAN_HAVE_CUDA every function
// that would need the runtime throws DeviceError.
#include <cstdint>

namespace shardgan::detail {

bool cuda_runtime_compiled_in();
void cuda_set_device(int index);
/// cudaGetDevice: the calling thread's current device.
int cuda_current_device();
/// A cudaEvent_t (timing disabled) created on device `index`.
void* cuda_event_create(int index);
void cuda_event_destroy(void* ev);
/// Records `ev` on the legacy default stream of device `index` (LibTorch's default stream).
void cuda_event_record(void* ev, int index);
void cuda_event_synchronize(void* ev);
/// A cudaStream_t created with cudaStreamNonBlocking on device `index` (it does not
/// synchronize with the legacy default stream).
void* cuda_stream_create(int index);
void cuda_stream_destroy(void* stream);
/// Records `ev` on `stream` (device `index`).
void cuda_event_record_on(void* ev, void* stream, int index);
/// cudaMemcpyAsync of `bytes` from `src` to `dst` (cudaMemcpyDefault: unified addressing
/// tells host from device) on `stream` (device `index`).
void cuda_memcpy_async(void* dst, const void* src, int64_t bytes, void* stream, int index);
/// cudaHostRegister / cudaHostUnregister (portable, so any device may use the pages).
void cuda_host_register(void* p, int64_t bytes);
void cuda_host_unregister(void* p);
/// cudaMemGetInfo on the current device: bytes in use on the whole device (total - free),
/// every process and the CUDA context included.
int64_t cuda_device_used_bytes();

}  // namespace shardgan::detail
