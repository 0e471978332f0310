#include "shardgan/device/host_copy.h"

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>

#include <ATen/ATen.h>

#include "device/cuda_runtime.h"
#include "shardgan/device/device.h"

namespace shardgan {
namespace {

std::atomic<int64_t> g_cpu_records{0}, g_cpu_waits{0};
std::atomic<bool> g_pin{false};

bool test_staging() {
  const char* e = std::getenv("SHARDGAN_TEST_HOST_STAGING");
  return e && std::string(e) == "1";
}

// The two staging buffers, allocated (and pinned, on a GPU) at first use and kept for the
// process: pinning costs milliseconds per call, so it is done once. One copy at a time.
struct Staging {
  std::mutex mu;
  void* buf[2] = {nullptr, nullptr};
  bool pinned[2] = {false, false};
  int64_t bytes = 0;

  void ensure(int64_t want) {
    if (bytes == want && buf[0]) return;
    release();
    for (int i = 0; i < 2; ++i) {
      if (::posix_memalign(&buf[i], 4096, static_cast<size_t>(want)) != 0) throw std::bad_alloc();
      pinned[i] = pin_host_memory(buf[i], want);
    }
    bytes = want;
  }
  void release() {
    for (int i = 0; i < 2; ++i) {
      if (pinned[i]) unpin_host_memory(buf[i]);
      std::free(buf[i]);
      buf[i] = nullptr;
      pinned[i] = false;
    }
    bytes = 0;
  }
  ~Staging() { release(); }
};

Staging& staging() {
  static Staging s;
  return s;
}

void check_pair(const at::Tensor& src, const at::Tensor& dst, const char* op) {
  if (!src.defined() || !dst.defined() || !src.is_contiguous() || !dst.is_contiguous() || src.dim() != 1 ||
      dst.dim() != 1 || src.numel() != dst.numel() || src.scalar_type() != dst.scalar_type()) {
    throw std::invalid_argument(std::string(op) + ": needs two contiguous 1-D tensors of the same dtype and numel");
  }
}

enum class Direction { kToHost, kFromHost };

// Double-buffered chunked copy between `dev` (any device) and `host` through the staging
// buffers. Chunk k uses buffer k % 2; before a buffer is reused, its event is waited for
// and (to host) its contents are moved on.
void staged_copy(const at::Tensor& dev, const at::Tensor& host, Direction dir) {
  Staging& st = staging();
  std::lock_guard<std::mutex> lock(st.mu);
  st.ensure(host_staging_bytes());
  const int64_t esize = static_cast<int64_t>(dev.element_size());
  const int64_t chunk = std::max<int64_t>(1, st.bytes / esize);
  const auto opts = at::TensorOptions().dtype(dev.scalar_type());
  at::Tensor buf[2] = {at::from_blob(st.buf[0], {chunk}, opts), at::from_blob(st.buf[1], {chunk}, opts)};
  DeviceEvent ev0(dev.device()), ev1(dev.device());
  DeviceEvent* ev[2] = {&ev0, &ev1};
  int64_t pending_off[2] = {-1, -1}, pending_len[2] = {0, 0};
  auto drain = [&](int b) {
    if (pending_off[b] < 0) return;
    ev[b]->wait();
    if (dir == Direction::kToHost) {
      host.narrow(0, pending_off[b], pending_len[b]).copy_(buf[b].narrow(0, 0, pending_len[b]));
    }
    pending_off[b] = -1;
  };
  const int64_t n = dev.numel();
  int64_t k = 0;
  for (int64_t off = 0; off < n; off += chunk, ++k) {
    const int b = static_cast<int>(k % 2);
    const int64_t len = std::min(chunk, n - off);
    drain(b);
    at::Tensor stage = buf[b].narrow(0, 0, len);
    if (dir == Direction::kToHost) {
      stage.copy_(dev.narrow(0, off, len), /*non_blocking=*/true);
    } else {
      stage.copy_(host.narrow(0, off, len));
      dev.narrow(0, off, len).copy_(stage, /*non_blocking=*/true);
    }
    ev[b]->record();
    pending_off[b] = off;
    pending_len[b] = len;
  }
  // The older chunk first.
  drain(static_cast<int>(k % 2));
  drain(static_cast<int>((k + 1) % 2));
}

// copy_to_host / copy_from_host: checks `dev` (any device) and `host` (a host tensor), then
// copies in `dir`, directly between two CPU tensors unless the test switch forces staging.
void checked_copy(const at::Tensor& dev, const at::Tensor& host, Direction dir, const char* op) {
  const bool to_host = dir == Direction::kToHost;
  check_pair(dev, host, op);
  if (!host.device().is_cpu()) {
    throw std::invalid_argument(std::string(op) + ": the " + (to_host ? "destination" : "source") +
                                " must be a host tensor");
  }
  if (dev.device().is_cpu() && !test_staging()) {
    (to_host ? host : dev).copy_(to_host ? dev : host);
    return;
  }
  staged_copy(dev, host, dir);
}

}  // namespace

DeviceEvent::DeviceEvent(c10::Device device) : device_(device) {
  if (device_.is_cuda()) event_ = detail::cuda_event_create(device_.index() < 0 ? 0 : device_.index());
}

DeviceEvent::~DeviceEvent() { detail::cuda_event_destroy(event_); }

void DeviceEvent::record() { record_on(nullptr); }

void DeviceEvent::record_on(void* stream) {
  recorded_ = true;
  if (!event_) {
    g_cpu_records.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  const int index = device_.index() < 0 ? 0 : device_.index();
  if (stream) {
    detail::cuda_event_record_on(event_, stream, index);
  } else {
    detail::cuda_event_record(event_, index);
  }
}

void DeviceEvent::wait() {
  if (!recorded_) return;
  if (!event_) {
    g_cpu_waits.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  detail::cuda_event_synchronize(event_);
}

CopyStream::CopyStream(c10::Device device) : device_(device) {
  if (device_.is_cuda()) stream_ = detail::cuda_stream_create(device_.index() < 0 ? 0 : device_.index());
}

CopyStream::~CopyStream() { detail::cuda_stream_destroy(stream_); }

void CopyStream::copy(const at::Tensor& dst, const at::Tensor& src) {
  if (!dst.is_contiguous() || !src.is_contiguous() || dst.scalar_type() != src.scalar_type() ||
      dst.numel() != src.numel()) {
    throw std::invalid_argument("CopyStream::copy: tensors must be contiguous with one dtype and numel");
  }
  if (!stream_) {
    dst.copy_(src);
    return;
  }
  for (const at::Tensor* t : {&dst, &src}) {
    if (!t->is_cpu() && t->device() != device_) {
      throw std::invalid_argument("CopyStream::copy: a tensor on " + t->device().str() + ", the stream is on " +
                                  device_.str());
    }
  }
  detail::cuda_memcpy_async(dst.data_ptr(), src.data_ptr(), static_cast<int64_t>(src.nbytes()), stream_,
                            device_.index() < 0 ? 0 : device_.index());
}

void CopyStream::record(DeviceEvent& ev) { ev.record_on(stream_); }

int64_t DeviceEvent::cpu_records() { return g_cpu_records.load(std::memory_order_relaxed); }
int64_t DeviceEvent::cpu_waits() { return g_cpu_waits.load(std::memory_order_relaxed); }

int64_t host_staging_bytes() {
  if (const char* e = std::getenv("SHARDGAN_HOST_STAGING_BYTES")) {
    char* end = nullptr;
    const long long v = std::strtoll(e, &end, 10);
    if (end != e && *end == '\0' && v >= 4096) return v;
    throw std::invalid_argument(std::string("SHARDGAN_HOST_STAGING_BYTES='") + e + "': expected bytes >= 4096");
  }
  return int64_t{64} << 20;
}

void copy_to_host(const at::Tensor& src, at::Tensor& dst) { checked_copy(src, dst, Direction::kToHost, "copy_to_host"); }

void copy_from_host(const at::Tensor& src, at::Tensor& dst) {
  checked_copy(dst, src, Direction::kFromHost, "copy_from_host");
}

at::Tensor host_copy(const at::Tensor& t) {
  if (t.device().is_cpu() && t.is_contiguous() && !test_staging()) return t;
  at::Tensor flat = t.contiguous().reshape({-1});
  at::Tensor out = at::empty({flat.numel()}, t.options().device(at::kCPU));
  copy_to_host(flat, out);
  return out.view(t.sizes());
}

bool pin_host_memory(void* p, int64_t bytes) {
  if (!g_pin.load(std::memory_order_relaxed) || !p || bytes <= 0) return false;
  detail::cuda_host_register(p, bytes);
  return true;
}

void unpin_host_memory(void* p) { detail::cuda_host_unregister(p); }

void set_pin_host_memory(bool on) { g_pin.store(on, std::memory_order_relaxed); }
bool pin_host_memory_enabled() { return g_pin.load(std::memory_order_relaxed); }

}  // namespace shardgan
