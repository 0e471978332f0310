#pragma once
/// Ordering between the host and a device's work queue, and copies between device tensors
/// and host memory through bounded pinned staging buffers (checkpoints, optimizer offload).
///
/// The same code runs on every device. On a GPU an event is a CUDA event recorded on the
/// default stream (the stream LibTorch computes on unless a caller sets another), and
/// staging buffers are pinned (page-locked) so that copies run as DMA. On the CPU every
/// copy has finished when it returns, so events are no-ops that count their calls (tests
/// check the ordering through the counts) and staging buffers are plain host memory.
#include <cstdint>
#include <memory>

#include <ATen/core/Tensor.h>

namespace shardgan {

/// A point in the work queue of a device: record() marks the work enqueued so far; wait()
/// blocks the host until that work is done. Local. Not copyable. CUDA errors throw
/// DeviceError (device.h).
class DeviceEvent {
 public:
  /// An event for `device` (CPU: no CUDA call is made, ever).
  explicit DeviceEvent(c10::Device device);
  ~DeviceEvent();
  DeviceEvent(const DeviceEvent&) = delete;
  DeviceEvent& operator=(const DeviceEvent&) = delete;

  /// Marks the work enqueued so far on the device's default stream.
  void record();
  /// Blocks the calling thread until the recorded work has finished (returns at once if
  /// nothing was recorded).
  void wait();

  /// Calls of record() / wait() on CPU events since the process started (all events, for
  /// tests of the device-generic ordering). Relaxed atomics; local.
  static int64_t cpu_records();
  static int64_t cpu_waits();

 private:
  friend class CopyStream;
  /// record() on `stream` (a cudaStream_t; nullptr: the default stream).
  void record_on(void* stream);
  c10::Device device_;
  void* event_ = nullptr;  // cudaEvent_t on CUDA
  bool recorded_ = false;
};

/// A copy queue of its own on `device`: on a GPU, a CUDA stream that does not synchronize
/// with the default stream, so that its copies run beside the default stream's work and,
/// with two of them, host-to-device beside device-to-host on the GPU's separate copy
/// engines (ZeRO-Offload's gradient and parameter transfers). Ordering against other work
/// is the caller's: record a DeviceEvent here and wait for it. On the CPU copies are
/// synchronous and record() counts as DeviceEvent::record does. Local. Not copyable.
class CopyStream {
 public:
  explicit CopyStream(c10::Device device);
  ~CopyStream();
  CopyStream(const CopyStream&) = delete;
  CopyStream& operator=(const CopyStream&) = delete;

  /// Queues the copy of `src` into `dst`: contiguous tensors of one dtype and numel, one on
  /// the host and the other on this stream's device (or both on the host). The host side
  /// must be pinned for the copy to be asynchronous, and both must stay alive and untouched
  /// until an event recorded after it has completed. Throws std::invalid_argument on a
  /// mismatch, DeviceError on a CUDA error.
  void copy(const at::Tensor& dst, const at::Tensor& src);
  /// Marks the copies queued so far: `ev` (of this stream's device) completes after them.
  void record(DeviceEvent& ev);

 private:
  c10::Device device_;
  void* stream_ = nullptr;  // cudaStream_t on CUDA
};

/// Bytes of each of the two staging buffers that copy_to_host / copy_from_host use (and
/// so the pinned host memory a copy holds: twice this): 64 MiB, or SHARDGAN_HOST_STAGING_BYTES
/// (bytes, >= 4096; for tests of the chunking).
int64_t host_staging_bytes();

/// Copies `src` (contiguous 1-D, any device) into `dst` (contiguous 1-D host tensor, same
/// dtype and numel) in chunks of host_staging_bytes() through two pinned staging buffers,
/// so that the device-to-host copy of chunk k+1 is in flight while chunk k is copied on
/// from its staging buffer (double buffering, with one DeviceEvent per buffer). CPU
/// tensors take the same path (synchronous copies) when SHARDGAN_TEST_HOST_STAGING=1 and
/// copy directly otherwise. Local; blocks until done. Throws std::invalid_argument on a
/// shape or dtype mismatch, DeviceError on a CUDA error.
void copy_to_host(const at::Tensor& src, at::Tensor& dst);

/// The other way: `src` (contiguous 1-D host tensor) into `dst` (contiguous 1-D, any
/// device). Same chunking, staging and throws.
void copy_from_host(const at::Tensor& src, at::Tensor& dst);

/// A contiguous host tensor with `t`'s values: `t` itself when it is a contiguous CPU
/// tensor, else a copy (through copy_to_host for device tensors). Local.
at::Tensor host_copy(const at::Tensor& t);

/// Page-locks `bytes` at `p` for DMA when this process computes on a GPU
/// (set_pin_host_memory(true)), else does nothing. Used for the offload tiers' host buffers
/// and the staging buffers. Returns whether the memory was pinned (then unpin_host_memory
/// must run before it is freed). Throws DeviceError if pinning was asked for and failed.
bool pin_host_memory(void* p, int64_t bytes);
void unpin_host_memory(void* p);
/// Process-wide switch for pin_host_memory (the trainer turns it on for run.device=cuda).
void set_pin_host_memory(bool on);
bool pin_host_memory_enabled();

}  // namespace shardgan
