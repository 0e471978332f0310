// NCCL backend of Communicator. Compiled only when CMake finds CUDA and NCCL
// (SHARDGAN_HAVE_NCCL). Raw device pointers come from at::Tensor::data_ptr(); no c10::cuda.
#include "shardgan/comm/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <sstream>

#include <ATen/ATen.h>

#include "shardgan/comm/mpi_communicator.h"
#include "shardgan/comm/watchdog.h"
#include "comm/counted.h"
#include "comm/reduced_float.h"
#include "shardgan/util/poll.h"

namespace shardgan {
using detail::is_16bit_float;
using detail::counted;
namespace {

using Clock = std::chrono::steady_clock;

ncclDataType_t nccl_type(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return ncclFloat32;
    case at::kDouble: return ncclFloat64;
    case at::kBFloat16: return ncclBfloat16;
    case at::kHalf: return ncclFloat16;
    case at::kByte: return ncclUint8;
    case at::kInt: return ncclInt32;
    case at::kLong: return ncclInt64;
    default:
      throw CollectiveError(std::string("NCCL backend: unsupported dtype ") + c10::toString(t));
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kAvg: return ncclAvg;
    case ReduceOp::kMax: return ncclMax;
  }
  return ncclSum;
}

void check_cuda_contiguous(const at::Tensor& t, const char* op, const char* arg, int rank,
                           int device) {
  if (!t.defined() || !t.is_contiguous() || !t.is_cuda() || t.get_device() != device) {
    std::ostringstream s;
    s << op << " on rank " << rank << ": argument '" << arg
      << "' must be a defined, contiguous CUDA tensor on device " << device
      << " (the NCCL backend handles CUDA tensors only)";
    throw CollectiveError(s.str());
  }
}

std::string describe(const char* op, int rank, int world, const at::Tensor& t) {
  std::ostringstream s;
  s << op << " (rank " << rank << " of " << world << ", numel " << t.numel() << ", dtype "
    << c10::toString(t.scalar_type()) << ", " << t.numel() * t.element_size() << " bytes)";
  return s.str();
}

}  // namespace

// A CUDA event recorded after a collective, shared by its Work and the watchdog: destroyed
// when both have let go.
struct SharedEvent {
  cudaEvent_t ev = nullptr;
  ~SharedEvent() {
    if (ev) cudaEventDestroy(ev);
  }
};
using EventPtr = std::shared_ptr<SharedEvent>;

#define SG_NCCL_CHECK(impl, call, what) (impl).check_nccl((call), #call, __FILE__, __LINE__, (what))
#define SG_CUDA_CHECK(impl, call, what) (impl).check_cuda((call), #call, __FILE__, __LINE__, (what))

struct NcclCommunicator::Impl {
  ncclComm_t comm = nullptr;
  cudaStream_t gather_stream = nullptr;  // all-gathers
  cudaStream_t reduce_stream = nullptr;  // reduce-scatters, all-reduces, broadcasts, barriers
  cudaEvent_t ready = nullptr;  // recorded on the legacy default stream before a collective
  float* barrier_buf = nullptr;
  int device = 0;
  int rank = 0;  // in messages
  bool blocking_wait = false;  // dist.blocking_wait: Work::wait() polls on the host
  std::atomic<bool> aborted{false};
  // Guards `comm` between the compute thread and the watchdog thread, which may abort it
  // (ncclCommAbort frees it). Recursive: an error inside start() aborts.
  std::recursive_mutex comm_mu;
  std::unique_ptr<CollectiveWatchdog> watchdog;  // with device-side waits

  ~Impl() {
    watchdog.reset();  // joins its thread before the communicator goes
    abort();
    if (ready) cudaEventDestroy(ready);
    if (gather_stream) cudaStreamDestroy(gather_stream);
    if (reduce_stream) cudaStreamDestroy(reduce_stream);
    if (barrier_buf) cudaFree(barrier_buf);
  }

  /// Aborts the communicator (idempotent; the watchdog thread may call it too); later
  /// collectives throw CollectiveError.
  void abort() {
    std::lock_guard<std::recursive_mutex> lock(comm_mu);
    if (comm && !aborted.exchange(true)) ncclCommAbort(comm);
  }

  /// Throws if the communicator was aborted: the watchdog's message when it failed.
  void check_alive(const std::string& what) const {
    if (!aborted.load()) return;
    const std::string why = watchdog ? watchdog->failure() : std::string();
    if (watchdog && watchdog->timed_out()) throw CollectiveTimeout(what + " failed: " + why);
    throw CollectiveError(what + " failed: the NCCL communicator was aborted after an earlier error or timeout" +
                          (why.empty() ? std::string() : ": " + why));
  }

  /// ncclInProgress is not an error on a non-blocking communicator: wait_async resolves it.
  void check_nccl(ncclResult_t r, const char* expr, const char* file, int line,
                  const std::string& what) {
    if (r == ncclSuccess || r == ncclInProgress) return;
    std::ostringstream s;
    s << file << ":" << line << ": " << what << " failed: " << expr << ": "
      << ncclGetErrorString(r);
    const char* last = comm && !aborted.load() ? ncclGetLastError(comm) : nullptr;
    if (last && *last) s << " (" << last << ")";
    abort();  // NCCL requires aborting a communicator after an error
    throw CollectiveError(s.str());
  }

  void check_cuda(cudaError_t e, const char* expr, const char* file, int line,
                  const std::string& what) {
    if (e == cudaSuccess) return;
    std::ostringstream s;
    s << file << ":" << line << ": " << what << " failed: " << expr << ": "
      << cudaGetErrorName(e) << ": " << cudaGetErrorString(e);
    throw CollectiveError(s.str());
  }

  [[noreturn]] void timeout(const std::string& what, double timeout_s) {
    abort();
    std::ostringstream s;
    s << what << " timed out after " << timeout_s
      << " s: a peer rank never joined or died. HINT: check that every rank calls the "
         "same collectives in the same order, or raise dist.timeout_s";
    throw CollectiveTimeout(s.str());
  }

  /// Polls the communicator's state until it leaves ncclInProgress (init, or an enqueue).
  void wait_async(const std::string& what, Clock::time_point deadline, double timeout_s) {
    ncclResult_t state = ncclInProgress;
    const bool ok = poll_until(deadline, [&] {
      SG_NCCL_CHECK(*this, ncclCommGetAsyncError(comm, &state), what);
      check_nccl(state, "communicator state", __FILE__, __LINE__, what);
      return state != ncclInProgress;
    });
    if (!ok) timeout(what, timeout_s);
  }

  /// Issues one collective: `enqueue` puts it on `stream`, after the work already queued on
  /// the legacy default stream. Returns an event recorded after it on `stream`, for
  /// finish() or wait_on_device(); when `watched`, the watchdog polls it from now on.
  EventPtr start(const std::string& what, Clock::time_point deadline, double timeout_s, cudaStream_t stream,
                 const std::function<ncclResult_t()>& enqueue, bool watched) {
    std::lock_guard<std::recursive_mutex> lock(comm_mu);
    check_alive(what);
    SG_CUDA_CHECK(*this, cudaSetDevice(device), what);
    SG_CUDA_CHECK(*this, cudaEventRecord(ready, cudaStreamLegacy), what);
    SG_CUDA_CHECK(*this, cudaStreamWaitEvent(stream, ready, 0), what);
    SG_NCCL_CHECK(*this, enqueue(), what);
    wait_async(what, deadline, timeout_s);
    auto ev = std::make_shared<SharedEvent>();
    SG_CUDA_CHECK(*this, cudaEventCreateWithFlags(&ev->ev, cudaEventDisableTiming), what);
    SG_CUDA_CHECK(*this, cudaEventRecord(ev->ev, stream), what);
    if (watched && watchdog) {
      watchdog->watch(what, deadline, timeout_s, [this, ev] { return finished_on_device(ev->ev); }, [] {});
    }
    return ev;
  }

  /// Watchdog thread: whether the collective behind `ev` has finished; throws on a CUDA
  /// error or the communicator's asynchronous error (a peer's failure surfaces here).
  bool finished_on_device(cudaEvent_t ev) {
    // The watchdog's thread starts with the CUDA runtime's current device unset (device 0):
    // without this, its first runtime call would create a primary context on GPU 0 for every
    // rank of a node (about 0.5 GiB each). Cheap once the device is current.
    if (cudaSetDevice(device) != cudaSuccess) throw std::runtime_error("cudaSetDevice on the watchdog thread");
    const cudaError_t e = cudaEventQuery(ev);
    if (e == cudaSuccess) return true;
    if (e != cudaErrorNotReady) throw std::runtime_error(std::string("cudaEventQuery: ") + cudaGetErrorString(e));
    std::lock_guard<std::recursive_mutex> lock(comm_mu);
    if (aborted.load()) throw std::runtime_error("the NCCL communicator was aborted");
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm, &state);
    if (r != ncclSuccess) throw std::runtime_error(std::string("ncclCommGetAsyncError: ") + ncclGetErrorString(r));
    if (state != ncclSuccess && state != ncclInProgress) {
      throw std::runtime_error(std::string("NCCL: ") + ncclGetErrorString(state));
    }
    return false;
  }

  /// Device-side wait (c10d's default): the legacy default stream, where LibTorch computes,
  /// waits for `ev`; the host goes on at once. The watchdog enforces the timeout.
  void wait_on_device(const std::string& what, const EventPtr& ev) {
    check_alive(what);
    SG_CUDA_CHECK(*this, cudaSetDevice(device), what);
    SG_CUDA_CHECK(*this, cudaStreamWaitEvent(cudaStreamLegacy, ev->ev, 0), what);
  }

  /// Polls `ev` (from start()) on the host until the collective finished on the device, or
  /// times out.
  void finish(const std::string& what, Clock::time_point deadline, double timeout_s, const EventPtr& event) {
    cudaEvent_t ev = event->ev;
    const bool ok = poll_until(deadline, [&] {
      const cudaError_t e = cudaEventQuery(ev);
      if (e == cudaSuccess) return true;
      if (e != cudaErrorNotReady) check_cuda(e, "cudaEventQuery", __FILE__, __LINE__, what);
      std::lock_guard<std::recursive_mutex> lock(comm_mu);
      check_alive(what);
      ncclResult_t state = ncclSuccess;  // a peer's failure surfaces here
      SG_NCCL_CHECK(*this, ncclCommGetAsyncError(comm, &state), what);
      check_nccl(state, "communicator state", __FILE__, __LINE__, what);
      return false;
    });
    if (!ok) timeout(what, timeout_s);
  }

  /// Runs one collective and returns once it has finished on the device.
  void run(const std::string& what, double timeout_s,
           const std::function<ncclResult_t()>& enqueue) {
    const auto deadline = deadline_after(timeout_s);
    finish(what, deadline, timeout_s, start(what, deadline, timeout_s, reduce_stream, enqueue, false));
  }
};

namespace {

// A collective in flight on the communicator's stream. wait() makes the compute stream wait
// for its event (or, with dist.blocking_wait, polls it on the host); `on_done` (16-bit
// rounding, queued on the compute stream) then runs. `keep` holds the buffers until then:
// after a device-side wait, freeing them is safe for the caching allocator, whose next
// user of the memory is ordered after the collective on the compute stream (as FSDP).
class NcclWork final : public Work {
 public:
  NcclWork(NcclCommunicator::Impl& im, std::string what, Clock::time_point deadline,
           double timeout_s, EventPtr ev, std::vector<at::Tensor> keep,
           std::function<void()> on_done)
      : im_(im), what_(std::move(what)), deadline_(deadline), timeout_s_(timeout_s),
        ev_(std::move(ev)), keep_(std::move(keep)), on_done_(std::move(on_done)) {}
  ~NcclWork() override {
    if (done_) return;
    if (std::uncaught_exceptions() > 0) {
      // The error path, as MpiWork's: this rank unwinds to main(), which ends the job. A
      // blocking wait here could poll for dist.timeout_s while the peers wait on this rank,
      // so the collective is left in flight and its buffers are kept (leaked) for the device.
      std::fprintf(stderr, "shardgan: rank %d leaves %s in flight on an error path\n", im_.rank, what_.c_str());
      new std::vector<at::Tensor>(std::move(keep_));  // NOLINT: deliberate leak
      return;
    }
    try {
      wait();
    } catch (...) {  // never throw from a destructor
    }
  }
  void wait() override {
    if (done_) return;
    done_ = true;
    if (im_.blocking_wait) {
      im_.finish(what_, deadline_, timeout_s_, ev_);
    } else {
      im_.wait_on_device(what_, ev_);
    }
    if (on_done_) on_done_();
    keep_.clear();
  }

 private:
  NcclCommunicator::Impl& im_;
  std::string what_;
  Clock::time_point deadline_;
  double timeout_s_;
  EventPtr ev_;
  std::vector<at::Tensor> keep_;
  std::function<void()> on_done_;
  bool done_ = false;
};

}  // namespace

NcclCommunicator::NcclCommunicator(MPI_Comm bootstrap, int device_index, double timeout_s, bool blocking_wait)
    : impl_(std::make_unique<Impl>()), device_index_(device_index) {
  timeout_s_ = timeout_s;
  MPI_Comm_rank(bootstrap, &rank_);
  MPI_Comm_size(bootstrap, &world_size_);
  Impl& im = *impl_;
  im.device = device_index;
  im.rank = rank_;
  im.blocking_wait = blocking_wait;
  const std::string what = "NCCL init (rank " + std::to_string(rank_) + " of " +
                           std::to_string(world_size_) + ", device " +
                           std::to_string(device_index) + ")";
  const auto deadline = deadline_after(timeout_s_);

  // Rank 0 makes the unique id and broadcasts it with a success flag, so that a failure on
  // rank 0 is an error on every rank rather than a hang in the other ranks' MPI_Bcast.
  struct {
    int ok;
    ncclUniqueId id;
  } boot{};
  std::string rank0_error;
  if (rank_ == 0) {
    const ncclResult_t r = ncclGetUniqueId(&boot.id);
    boot.ok = r == ncclSuccess;
    if (!boot.ok) rank0_error = ncclGetErrorString(r);
  }
  const int rc = MPI_Bcast(&boot, static_cast<int>(sizeof(boot)), MPI_BYTE, 0, bootstrap);
  if (rc != MPI_SUCCESS) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    throw CollectiveError(what + " failed: MPI_Bcast of the NCCL unique id: " +
                          std::string(msg, len));
  }
  if (!boot.ok) {
    throw CollectiveError(what + " failed: ncclGetUniqueId failed on rank 0" +
                          (rank0_error.empty() ? std::string() : ": " + rank0_error));
  }

  SG_CUDA_CHECK(im, cudaSetDevice(device_index), what);
  SG_CUDA_CHECK(im, cudaStreamCreateWithFlags(&im.gather_stream, cudaStreamNonBlocking), what);
  SG_CUDA_CHECK(im, cudaStreamCreateWithFlags(&im.reduce_stream, cudaStreamNonBlocking), what);
  SG_CUDA_CHECK(im, cudaEventCreateWithFlags(&im.ready, cudaEventDisableTiming), what);
  SG_CUDA_CHECK(im, cudaMalloc(reinterpret_cast<void**>(&im.barrier_buf), sizeof(float)), what);
  SG_CUDA_CHECK(im, cudaMemset(im.barrier_buf, 0, sizeof(float)), what);

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // non-blocking: init and collectives can be polled with a timeout
  SG_NCCL_CHECK(im, ncclCommInitRankConfig(&im.comm, world_size_, boot.id, rank_, &config),
                what);
  im.wait_async(what, deadline, timeout_s_);
  if (!blocking_wait) {
    // Polls every 2 ms; ends the process a minute after a failure the compute thread has
    // not turned into an exit (it throws at its next collective, and main() calls MPI_Abort).
    im.watchdog = std::make_unique<CollectiveWatchdog>(std::chrono::microseconds(2000),
                                                       [&im](const std::string&) { im.abort(); }, 60.0);
  }
  host_ = std::make_unique<MpiCommunicator>(bootstrap, timeout_s_);
}

NcclCommunicator::~NcclCommunicator() = default;  // Impl::~Impl aborts and frees; never throws

void NcclCommunicator::all_gather(at::Tensor& full, const at::Tensor& shard) {
  all_gather_async(full, shard)->wait();
}

void NcclCommunicator::reduce_scatter(at::Tensor& shard, const at::Tensor& full, ReduceOp op) {
  reduce_scatter_async(shard, full, op)->wait();
}

std::unique_ptr<Work> NcclCommunicator::all_gather_async(at::Tensor& full, const at::Tensor& shard) {
  if (on_host(full, shard)) return counted(stats_, *host_, [&] { return host_->all_gather_async(full, shard); });
  check_cuda_contiguous(full, "all_gather", "full", rank_, device_index_);
  check_cuda_contiguous(shard, "all_gather", "shard", rank_, device_index_);
  check_block_sizes("all_gather", full, shard);
  const ncclDataType_t dt = nccl_type(shard.scalar_type());
  stats_.all_gather_calls++;
  stats_.all_gather_bytes += full.numel() * full.element_size();
  Impl& im = *impl_;
  const std::string what = describe("all_gather", rank_, world_size_, full);
  const auto deadline = deadline_after(timeout_s_);
  EventPtr ev = im.start(what, deadline, timeout_s_, im.gather_stream, [&] {
    return ncclAllGather(shard.data_ptr(), full.data_ptr(), static_cast<size_t>(shard.numel()),
                         dt, im.comm, im.gather_stream);
  }, true);
  return std::make_unique<NcclWork>(im, what, deadline, timeout_s_, ev,
                                    std::vector<at::Tensor>{full, shard}, nullptr);
}

std::unique_ptr<Work> NcclCommunicator::reduce_scatter_async(at::Tensor& shard, const at::Tensor& full,
                                                            ReduceOp op) {
  if (on_host(full, shard)) {
    return counted(stats_, *host_, [&] { return host_->reduce_scatter_async(shard, full, op); });
  }
  check_cuda_contiguous(full, "reduce_scatter", "full", rank_, device_index_);
  check_cuda_contiguous(shard, "reduce_scatter", "shard", rank_, device_index_);
  check_block_sizes("reduce_scatter", full, shard);
  nccl_type(full.scalar_type());
  stats_.reduce_scatter_calls++;
  stats_.reduce_scatter_bytes += full.numel() * full.element_size();
  const bool up = is_16bit_float(full);
  at::Tensor in = up ? full.to(at::kFloat) : full;
  at::Tensor out = up ? at::empty({shard.numel()}, in.options()) : shard;
  Impl& im = *impl_;
  const std::string what = describe("reduce_scatter", rank_, world_size_, full);
  const auto deadline = deadline_after(timeout_s_);
  EventPtr ev = im.start(what, deadline, timeout_s_, im.reduce_stream, [&] {
    return ncclReduceScatter(in.data_ptr(), out.data_ptr(), static_cast<size_t>(out.numel()),
                             nccl_type(in.scalar_type()), nccl_op(op), im.comm, im.reduce_stream);
  }, true);
  at::Tensor dst = shard;
  std::function<void()> on_done;
  if (up) on_done = [dst, out]() mutable { dst.copy_(out); };
  return std::make_unique<NcclWork>(im, what, deadline, timeout_s_, ev,
                                    std::vector<at::Tensor>{in, out, full}, std::move(on_done));
}

void NcclCommunicator::all_reduce(at::Tensor& t, ReduceOp op) {
  if (on_host(t, t)) return counted(stats_, *host_, [&] { host_->all_reduce(t, op); });
  check_cuda_contiguous(t, "all_reduce", "t", rank_, device_index_);
  nccl_type(t.scalar_type());  // reject unsupported dtypes before counting
  stats_.all_reduce_calls++;
  stats_.all_reduce_bytes += t.numel() * t.element_size();
  const bool up = is_16bit_float(t);
  at::Tensor buf = up ? t.to(at::kFloat) : t;
  Impl& im = *impl_;
  im.run(describe("all_reduce", rank_, world_size_, t), timeout_s_, [&] {
    return ncclAllReduce(buf.data_ptr(), buf.data_ptr(), static_cast<size_t>(buf.numel()),
                         nccl_type(buf.scalar_type()), nccl_op(op), im.comm, im.reduce_stream);
  });
  if (up) t.copy_(buf);
}

void NcclCommunicator::broadcast(at::Tensor& t, int root) {
  if (on_host(t, t)) return counted(stats_, *host_, [&] { host_->broadcast(t, root); });
  check_cuda_contiguous(t, "broadcast", "t", rank_, device_index_);
  if (root < 0 || root >= world_size_) {
    throw CollectiveError("broadcast on rank " + std::to_string(rank_) + ": root " +
                          std::to_string(root) + " is outside [0, world size)");
  }
  const ncclDataType_t dt = nccl_type(t.scalar_type());
  stats_.broadcast_calls++;
  stats_.broadcast_bytes += t.numel() * t.element_size();
  Impl& im = *impl_;
  im.run(describe("broadcast", rank_, world_size_, t), timeout_s_, [&] {
    return ncclBroadcast(t.data_ptr(), t.data_ptr(), static_cast<size_t>(t.numel()), dt, root,
                         im.comm, im.reduce_stream);
  });
}

void NcclCommunicator::barrier() {
  stats_.barrier_calls++;
  Impl& im = *impl_;
  im.run("barrier (rank " + std::to_string(rank_) + " of " + std::to_string(world_size_) + ")",
         timeout_s_, [&] {
           return ncclAllReduce(im.barrier_buf, im.barrier_buf, 1, ncclFloat32, ncclSum, im.comm,
                                im.reduce_stream);
         });
}

}  // namespace shardgan
