#pragma once
/// Collective communication over torch tensors: the one interface the sharding engine uses.
///
/// Contract (as in c10d): every method here is a collective. All ranks of the communicator
/// call the same collectives in the same order with matching sizes and dtypes. Each call
/// blocks until it completes or until `timeout_s` elapses; a timeout throws
/// CollectiveTimeout, and the program's main() must then end the job on every rank
/// (MPI_Abort), since the peers may be stuck inside the same collective.
#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace shardgan {

/// Default collective timeout: 10 minutes, as in torch.distributed.
inline constexpr double kDefaultCollectiveTimeoutS = 600.0;

enum class ReduceOp { kSum, kAvg, kMax };

const char* to_string(ReduceOp op);

/// Thrown when a collective fails (a library error, or mismatched arguments).
/// The message names the operation, the rank and the sizes.
class CollectiveError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Thrown when a collective does not complete within the communicator's timeout:
/// a peer never joined, or died.
class CollectiveTimeout : public CollectiveError {
 public:
  using CollectiveError::CollectiveError;
};

/// Counters of what a communicator moved, per collective type (bytes this rank sent and
/// received, as the algorithm-independent volume: see the ZeRO paper, Sec. 7).
struct CommStats {
  int64_t all_gather_calls = 0, reduce_scatter_calls = 0, all_reduce_calls = 0,
          broadcast_calls = 0, barrier_calls = 0, all_to_all_calls = 0;
  int64_t all_gather_bytes = 0;      ///< bytes of the full (gathered) output, per call summed
  int64_t reduce_scatter_bytes = 0;  ///< bytes of the full (unreduced) input, per call summed
  int64_t all_reduce_bytes = 0;      ///< bytes of the reduced tensor, per call summed
  int64_t broadcast_bytes = 0;
  int64_t all_to_all_bytes = 0;      ///< bytes of the input (every block, the own one included), per call summed
  int64_t send_recv_calls = 0;
  int64_t sent_bytes = 0;            ///< send_recv_async: bytes this rank sent to other ranks
};

/// One peer's buffer of a point-to-point exchange (send_recv_async).
struct PeerBuffer {
  int peer = 0;   ///< the other rank in this communicator
  at::Tensor t;   ///< contiguous; sent whole, or received into whole
};

/// Handle of a collective in flight (c10d's Work). wait() blocks until it completes, or
/// throws CollectiveTimeout after the communicator's timeout; the tensors passed to the
/// collective must stay alive and untouched until then. Destroying an unwaited Work waits.
/// On a GPU (NcclCommunicator), as in c10d, wait() by default blocks the device's compute
/// stream rather than the host: work queued after it sees the results, and a watchdog
/// thread keeps the timeout.
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  /// This process's rank in [0, world_size()).
  virtual int rank() const = 0;
  /// Number of ranks in the communicator.
  virtual int world_size() const = 0;
  /// "mpi" or "nccl".
  virtual std::string backend() const = 0;

  /// Collective. Concatenates every rank's `shard` into `full`, in rank order.
  /// `shard`: contiguous 1-D, numel S. `full`: contiguous 1-D, numel S * world_size(),
  /// same dtype and device. `shard` may be block rank() of `full` itself (in place).
  /// Supported dtypes: float32, float64, bfloat16, float16 (and uint8/int64 for
  /// bookkeeping). Throws CollectiveError on a size/dtype mismatch.
  virtual void all_gather(at::Tensor& full, const at::Tensor& shard) = 0;

  /// Collective, non-blocking: starts all_gather(full, shard) and returns its handle.
  /// Started collectives and blocking ones must still be issued in the same order on every
  /// rank. The default runs the blocking call and returns a completed handle.
  virtual std::unique_ptr<Work> all_gather_async(at::Tensor& full, const at::Tensor& shard);

  /// Collective, non-blocking: starts reduce_scatter(shard, full, op). `shard` holds the
  /// result only after wait(); neither tensor may be touched before. The default runs the
  /// blocking call and returns a completed handle.
  virtual std::unique_ptr<Work> reduce_scatter_async(at::Tensor& shard, const at::Tensor& full,
                                                     ReduceOp op);

  /// Collective. Reduces `full` (contiguous 1-D, numel S * world_size()) element-wise across
  /// ranks and writes block `rank()` of the result into `shard` (contiguous 1-D, numel S).
  /// 16-bit floats are reduced in float32 and rounded once; kAvg scales by 1/N before that
  /// rounding, so a float16 average whose sum exceeds 65504 is still finite.
  virtual void reduce_scatter(at::Tensor& shard, const at::Tensor& full, ReduceOp op) = 0;

  /// Collective, non-blocking (MPI_Alltoall): block q of `in` goes to rank q, and block p of
  /// `out` receives rank p's block number rank(). `in` and `out`: contiguous 1-D, numel
  /// B * world_size(), same dtype and device, distinct. Neither may be touched before wait().
  /// The quantized gradient reduce-scatter (qgZ) exchanges its blocks with it. The default
  /// throws CollectiveError: the backend has none (NCCL, for now).
  virtual std::unique_ptr<Work> all_to_all_async(at::Tensor& out, const at::Tensor& in);

  /// Point-to-point, non-blocking (MPI_Isend/MPI_Irecv): sends each `sends[i].t` to rank
  /// sends[i].peer and receives into each `recvs[i].t` from recvs[i].peer. Not a collective:
  /// only the named peers take part, each posting the matching receive or send in the same
  /// order (messages between one pair are matched in order). Tensors: contiguous, CPU, any
  /// dtype; none may be touched before wait(), which throws CollectiveTimeout after
  /// timeout_s() like a collective. split placement's transport of images and their
  /// gradients between G's and D's ranks uses it. The default throws CollectiveError: the
  /// backend has no point-to-point path (NCCL, for now).
  virtual std::unique_ptr<Work> send_recv_async(const std::vector<PeerBuffer>& sends,
                                                const std::vector<PeerBuffer>& recvs);

  /// Collective. Reduces `t` (contiguous, any shape) in place across ranks.
  virtual void all_reduce(at::Tensor& t, ReduceOp op) = 0;

  /// Collective. Copies `t` (contiguous) from rank `root` to every rank, in place.
  virtual void broadcast(at::Tensor& t, int root) = 0;

  /// Collective. Returns once every rank has entered it.
  virtual void barrier() = 0;

  /// Local: lets the backend progress the operations in flight (MPI: one MPI_Iprobe), for
  /// a rank that waits on something else (a node-shared gather) while its peers wait on
  /// it. Default: nothing.
  virtual void poll() {}

  /// Collective over this communicator (MPI_Comm_split): the ranks that pass the same
  /// `color` (>= 0) form a new communicator of the same backend and timeout, ordered by
  /// `key` (then by rank here); returns this rank's, which must not outlive MPI. A barrier
  /// with the timeout comes first, since MPI_Comm_split itself has none. The default (and
  /// NCCL, for now) throws CollectiveError: the backend cannot split.
  virtual std::unique_ptr<Communicator> split(int color, int key);

  /// Hybrid sharding (HSDP, see hybrid_communicator.h): this rank's replica group, in
  /// [0, replicate_degree()), and the number of groups that hold the same shards. A plain
  /// communicator is one group: 0 and 1. Local.
  virtual int replica_rank() const { return 0; }
  virtual int replicate_degree() const { return 1; }
  /// Hybrid sharding: all-reduces `t` (this rank's shard of a reduced gradient) with the
  /// ranks of the other replica groups that hold the same shard, in place. Collective over
  /// every rank of every group when replicate_degree() > 1; a no-op otherwise (the
  /// default). Same dtypes, devices and throws as all_reduce.
  virtual void all_reduce_replicas(at::Tensor& t, ReduceOp op) {}

  /// Seconds a collective may take before it throws CollectiveTimeout.
  double timeout_s() const { return timeout_s_; }
  void set_timeout_s(double s) { timeout_s_ = s; }

  /// Traffic counters since construction or the last reset (local, not a collective).
  const CommStats& stats() const { return stats_; }
  void reset_stats() { stats_ = CommStats{}; }

 protected:
  /// Throws CollectiveError naming `op` and this rank unless full.numel() equals
  /// shard.numel() * world_size() and the dtypes agree (all-gather, reduce-scatter).
  void check_block_sizes(const char* op, const at::Tensor& full, const at::Tensor& shard) const;

  double timeout_s_ = kDefaultCollectiveTimeoutS;
  CommStats stats_;
};

}  // namespace shardgan
