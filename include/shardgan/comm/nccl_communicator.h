#pragma once
/// NCCL backend of Communicator for CUDA tensors (one GPU per process).
///
/// This header deliberately includes no CUDA or NCCL header (the state is behind a pimpl),
/// so code built without CUDA can include it. The implementation is compiled only when
/// CMake finds CUDA and NCCL (SHARDGAN_HAVE_NCCL).
#include <mpi.h>

#include <memory>
#include <string>

#include "shardgan/comm/communicator.h"

namespace shardgan {

/// Runs collectives on dedicated non-blocking CUDA streams of a non-blocking NCCL
/// communicator. A collective that does not finish within timeout_s() aborts the
/// communicator, so that a peer that never joins ends the job instead of hanging it; every
/// later call then throws (CollectiveTimeout for a timeout, else CollectiveError).
///
/// Waits (as c10d's ProcessGroupNCCL): by default the Work of an async all-gather or
/// reduce-scatter waits on the device. wait() makes the legacy default stream wait for the
/// collective's event and returns at once, so the host keeps queueing compute; a watchdog
/// thread (watchdog.h) polls every such collective from its launch and enforces the
/// timeout. With `blocking_wait` (dist.blocking_wait, c10d's TORCH_NCCL_BLOCKING_WAIT)
/// wait() polls the event on the host instead and throws CollectiveTimeout itself. The
/// blocking all_gather and reduce_scatter are the async call followed by that wait(): by
/// default they return once the compute stream is ordered after the collective, not once
/// it has finished, and a timeout is the watchdog's (the next call then throws). all_reduce,
/// broadcast and barrier return only once the collective has finished on the device, and
/// throw CollectiveTimeout themselves.
///
/// Streams (as FSDP): all-gathers run on one stream and reduce-scatters on another, so that
/// a prefetched all-gather need not queue behind a gradient reduction on the same stream;
/// all-reduce, broadcast and barrier use the reduce-scatter stream. Both streams share one
/// NCCL communicator, and NCCL does not promise that two operations of one communicator
/// progress concurrently: whether they overlap on a GPU has not been measured. Ordering: each collective first waits (on the
/// GPU, not the host) for an event recorded on the legacy default CUDA stream (stream 0,
/// where LibTorch computes); after its Work's wait(), the default stream's later work sees
/// its results (and, with blocking_wait or a blocking call, any stream's).
///
/// Host tensors: bookkeeping collectives of the engine (votes, norms, checkpoint status)
/// use small CPU tensors; they go through an MpiCommunicator over the same ranks (as
/// PyTorch pairs a gloo group with NCCL for CPU objects), with the same timeout.
///
/// Tensors: contiguous CUDA tensors on device `device_index`, or CPU tensors (above); all
/// tensors of one call on the same side. Supported dtypes: float32,
/// float64, bfloat16, float16 (and uint8/int32/int64 for bookkeeping). As in the MPI backend,
/// bfloat16/float16 reductions are done in float32 and rounded once (a float32 temporary of
/// the tensor's size is allocated on the device).
///
/// Errors: a validation failure (undefined, non-contiguous, non-CUDA or wrong-device tensor,
/// mismatched size/dtype, bad root, unsupported dtype) or any CUDA/NCCL error throws
/// CollectiveError naming the operation, rank, and the library's error string; a timeout
/// throws CollectiveTimeout. Every method except the accessors is a collective.
class NcclCommunicator final : public Communicator {
 public:
  /// Collective over `bootstrap`: rank 0 creates the NCCL unique id and broadcasts it with
  /// MPI_Bcast; every rank then selects CUDA device `device_index` (cudaSetDevice, left set
  /// on return) and joins the NCCL communicator, whose rank and size are those of
  /// `bootstrap`. `bootstrap` is kept for host-tensor collectives and must outlive this
  /// object. MPI must be initialized.
  /// Throws CollectiveError on an MPI/CUDA/NCCL error, CollectiveTimeout if the NCCL
  /// initialization does not finish within `timeout_s` seconds.
  /// `blocking_wait`: Work::wait() blocks the host (see above); false starts the watchdog.
  NcclCommunicator(MPI_Comm bootstrap, int device_index,
                   double timeout_s = kDefaultCollectiveTimeoutS, bool blocking_wait = false);
  /// Aborts (never destroys: that can block on a dead peer) the NCCL communicator and frees
  /// the stream, events and buffer. Does not throw.
  ~NcclCommunicator() override;

  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  std::string backend() const override { return "nccl"; }
  /// The CUDA device this communicator runs on.
  int device_index() const { return device_index_; }

  /// See Communicator::all_gather. `shard`: numel S, `full`: numel S * world_size(),
  /// both contiguous CUDA tensors on device_index() with equal dtypes. Runs ncclAllGather.
  void all_gather(at::Tensor& full, const at::Tensor& shard) override;
  /// See Communicator::reduce_scatter. Shapes as in all_gather. Runs ncclReduceScatter.
  void reduce_scatter(at::Tensor& shard, const at::Tensor& full, ReduceOp op) override;
  /// Non-blocking variants: the collective is queued on the communicator's own CUDA stream
  /// (after the work already on the legacy default stream). wait() makes the default stream
  /// wait for a CUDA event recorded after it (or, with blocking_wait, polls that event on
  /// the host), with the same timeout.
  std::unique_ptr<Work> all_gather_async(at::Tensor& full, const at::Tensor& shard) override;
  std::unique_ptr<Work> reduce_scatter_async(at::Tensor& shard, const at::Tensor& full,
                                             ReduceOp op) override;
  /// See Communicator::all_reduce. `t`: contiguous CUDA tensor, any shape. ncclAllReduce.
  void all_reduce(at::Tensor& t, ReduceOp op) override;
  /// See Communicator::broadcast. `t`: contiguous CUDA tensor; `root` in [0, world_size()).
  void broadcast(at::Tensor& t, int root) override;
  /// See Communicator::barrier: an all-reduce of one float on the device.
  void barrier() override;

  /// Opaque CUDA/NCCL state (defined in the .cpp; public only so that its Work handles can
  /// name it).
  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
  std::unique_ptr<Communicator> host_;  // MpiCommunicator for CPU tensors
  /// Whether a call's tensors are host tensors (then host_ runs it).
  static bool on_host(const at::Tensor& a, const at::Tensor& b) { return a.defined() && a.is_cpu() && b.defined() && b.is_cpu(); }
  int rank_ = 0;
  int world_size_ = 1;
  int device_index_ = 0;
};

}  // namespace shardgan
