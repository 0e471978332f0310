#pragma once
/// MPI backend of Communicator for CPU tensors (Open MPI, MPI-3 non-blocking collectives).
#include <mpi.h>

#include <climits>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shardgan/comm/communicator.h"

namespace shardgan {

class ProgressThread;

/// Runs each collective as an MPI-3 non-blocking call (MPI_Iallgather, ...) and polls it
/// with MPI_Test until it completes or timeout_s() passes, so that a peer that never joins
/// raises CollectiveTimeout instead of hanging. Every MPI communicator it wraps gets
/// MPI_ERRORS_RETURN, and an MPI error (a failed post, or a request that completes in error,
/// such as MPI_ERR_TRUNCATE for a receive shorter than the message) throws CollectiveError
/// naming the call, the communicator (name()), this rank and its host, the peer where there
/// is one, and MPI's error string; the caller's error path then ends every rank. bfloat16 and float16 are reduced in
/// float32 and rounded back once. Tensors must be on the CPU.
class MpiCommunicator final : public Communicator {
 public:
  /// `comm` is not duplicated or freed; it must outlive this object (MPI_COMM_WORLD,
  /// MPI_COMM_SELF, or a communicator the caller owns). MPI must be initialized. Sets
  /// MPI_ERRORS_RETURN on `comm`. `name` names it in error messages ("world" for the one
  /// make_communicator builds).
  explicit MpiCommunicator(MPI_Comm comm, double timeout_s = kDefaultCollectiveTimeoutS,
                           std::string name = "world");
  /// Frees the MPI communicator if split() made it (MPI must still be initialized then).
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  std::string backend() const override { return "mpi"; }
  void poll() override;

  void all_gather(at::Tensor& full, const at::Tensor& shard) override;
  /// MPI_Iallgather; the request progresses whenever this rank calls into MPI (for
  /// example inside SyncBatchNorm's all-reduce), as Open MPI has no progress thread of its
  /// own, and, after enable_progress_thread(), whenever that thread polls.
  std::unique_ptr<Work> all_gather_async(at::Tensor& full, const at::Tensor& shard) override;
  void reduce_scatter(at::Tensor& shard, const at::Tensor& full, ReduceOp op) override;
  /// Direct exchange over point-to-point messages (MPI_Isend/MPI_Irecv, every pair posted
  /// at once): rank r receives block r of every peer's `full` in `full`'s dtype, holding
  /// (N - 1) x shard.numel() elements of it until wait(), and wait() adds the N blocks in
  /// rank order (16-bit in float32, rounded once) and averages. Each rank moves and
  /// reduces (N - 1) / N of the tensor, as a ring does. At N <= 2 (one addition) the result
  /// equals MPI_Reduce_scatter_block's bit for bit.
  std::unique_ptr<Work> reduce_scatter_async(at::Tensor& shard, const at::Tensor& full,
                                             ReduceOp op) override;
  /// Point-to-point like reduce_scatter_async: every pair posted at once, blocks above
  /// max_count() elements as one derived-type element.
  std::unique_ptr<Work> all_to_all_async(at::Tensor& out, const at::Tensor& in) override;
  /// One MPI_Irecv / MPI_Isend per buffer (tag kSendRecvTag), receives posted first;
  /// buffers above max_count() elements travel as one derived-type element.
  std::unique_ptr<Work> send_recv_async(const std::vector<PeerBuffer>& sends,
                                        const std::vector<PeerBuffer>& recvs) override;
  void all_reduce(at::Tensor& t, ReduceOp op) override;
  void broadcast(at::Tensor& t, int root) override;
  void barrier() override;
  /// Ibarrier (with the timeout), then MPI_Comm_split; the result owns its MPI_Comm,
  /// inherits max_count() and is named "<name()> split <color>" (e.g. "world split 1":
  /// split placement's D group, a replica or secondary group).
  std::unique_ptr<Communicator> split(int color, int key) override;

  MPI_Comm comm() const { return comm_; }

  /// Collective over comm() (MPI_Comm_dup). Starts a helper thread that enters MPI every
  /// `interval_us` microseconds (>= 1) while a non-blocking collective of this process is in
  /// flight, so that prefetched all-gathers and reduce-scatters advance during compute
  /// instead of inside the wait; it sleeps while none is. Communicators made by split()
  /// afterwards share the thread. Throws CollectiveError if MPI was initialized below
  /// MPI_THREAD_MULTIPLE. Not thread-safe against this communicator's own collectives.
  void enable_progress_thread(double interval_us);
  /// MPI calls the progress thread made so far (0 without one). Local.
  int64_t progress_polls() const;
  /// Collective over comm() (with the timeout): all-gathers every rank's host name
  /// (MPI_Get_processor_name) and MPI_COMM_WORLD rank, so that a timeout names the hosts
  /// and ranks of the peers, e.g. "this is world rank 0 on node-a; this collective's ranks:
  /// world ranks 0-1 on node-a, 2-3 on node-b". make_communicator()
  /// and split() call it; throws CollectiveTimeout or CollectiveError as a collective does.
  void learn_hosts();
  /// "world ranks 0-1 on node-a, 2-3 on node-b" after learn_hosts(), else "".
  const std::string& hosts() const { return hosts_; }
  /// The communicator's name in error messages (see the constructor and split()).
  const std::string& name() const { return name_; }
  /// Throws CollectiveError unless `rc` is MPI_SUCCESS: "`call` failed on rank R of the
  /// <name()> communicator (N ranks; world rank W on HOST)[, peer P]: <MPI error string>".
  void check(int rc, const std::string& call, int peer = -1) const {
    if (rc != MPI_SUCCESS) fail(rc, call, peer);
  }
  /// The same for a posted message of `bytes` bytes; the text is built only on failure, so
  /// a successful post (the hot path of every transfer) allocates nothing.
  void check(int rc, const char* call, int peer, int64_t bytes) const {
    if (rc != MPI_SUCCESS) fail(rc, std::string(call) + " of " + std::to_string(bytes) + " bytes", peer);
  }

  /// Largest element count passed to one MPI call: INT_MAX by default, since MPI counts
  /// are `int`. Above it, an all-gather is one call on a derived datatype as large as the
  /// shard (no copy), and so is each block of a reduce-scatter; all-reduce and broadcast
  /// are split into calls of at most this many elements per rank. Tests lower it to
  /// exercise these paths with small tensors. `n` >= 1.
  void set_max_count(int64_t n) { max_count_ = n; }
  int64_t max_count() const { return max_count_; }

 private:
  /// Waits for `req`; throws CollectiveTimeout naming `what` after timeout_s().
  void wait(MPI_Request& req, const std::string& what);
  /// Waits for every request of `reqs` (MPI_Testall), with the same timeout.
  void wait(std::vector<MPI_Request>& reqs, const std::string& what);
  /// Checks arguments, counts traffic and starts the all-gather (above max_count_ elements
  /// per rank on a derived datatype).
  MPI_Request start_all_gather(at::Tensor& full, const at::Tensor& shard);
  /// Throws the CollectiveError check() describes.
  [[noreturn]] void fail(int rc, const std::string& call, int peer) const;
  friend class MpiWork;

  MPI_Comm comm_;
  int rank_ = 0;
  int world_size_ = 1;
  int64_t max_count_ = INT_MAX;
  bool owns_comm_ = false;  // made by split(): freed by the destructor
  std::shared_ptr<ProgressThread> progress_;  // shared with split() children; may be null
  std::string host_;        // "world rank R on HOST", after learn_hosts()
  std::string hosts_;       // every rank's host, grouped (see hosts())
  std::string name_;        // see name()
};

}  // namespace shardgan
