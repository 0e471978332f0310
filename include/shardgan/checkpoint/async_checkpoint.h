#pragma once
/// Asynchronous checkpoints (checkpoint.async; docs/checkpoints.md): training waits only
/// while each rank's state is snapshotted, and the rank files, the index and the commit
/// are written in the background with the same layout and commit protocol as
/// save_checkpoint (checkpoint.h). The design follows PyTorch DCP's async_save (snapshot
/// to host memory, write on a background thread; torch/distributed/checkpoint/
/// state_dict_saver.py) and, for the copy-on-write snapshot, Redis's BGSAVE (fork(); the
/// child writes the pages as they were at the fork).
///
/// Two snapshots:
///  - kFork (CPU): fork(). The child process writes this rank's HDF5 file from its
///    copy-on-write view of memory and exits; pages training changes meanwhile are copied
///    by the kernel (at most the rank's checkpoint bytes, usually far less: the optimizer
///    step, which rewrites the state, comes at the end of a step). The stall is the fork
///    (copying page tables: 0.19 s for a rank of 8 GiB resident on a 2-core guest).
///  - kCopy: every tensor is copied into host staging buffers reused from save to save
///    (pinned when the tensor is on a GPU), and a thread writes the file. The stall is the
///    copy; the memory is the rank's checkpoint bytes, held for the whole run.
///  - kAuto: kFork when every transport Open MPI selected in this job is shared memory or
///    TCP, kCopy otherwise (choose_snapshot_kind). A fork is unsafe once an RDMA transport
///    has registered memory: verbs mark registered pages MADV_DONTFORK, so the child would
///    not see them (and UCX, libfabric or PSM may hold such registrations).
/// In both, a thread of this process then waits for the file and commits the checkpoint
/// over a communicator of its own (Communicator::split), so that its collectives never
/// interleave with training's. At most one save is in flight: the next save, wait() and
/// the destructor wait for it.
///
/// Bounds: the fork writer must report and exit within the training communicator's
/// timeout_s() (dist.timeout_s) of the fork; otherwise it is killed (SIGKILL) and the save
/// fails on every rank (CheckpointError at the next save or wait()). The commit's own
/// communicator therefore waits twice that timeout per collective: a peer may spend one
/// timeout on its write before it joins. A kCopy write runs on a thread that cannot be
/// killed: it is held to the same timeout_s (plus 2 s, the time a killed fork writer's
/// report takes), checked by check_write() after every step and by wait(); past it, the
/// thread is left and CheckpointError is thrown on that rank (the caller ends the job, so
/// every rank exits within about timeout_s of a hung write; the previous checkpoint stays
/// the newest committed one). wait() gives the whole background save (write and commit)
/// 3 x timeout_s from its start.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "shardgan/checkpoint/checkpoint.h"

namespace shardgan {

enum class SnapshotKind { kFork, kCopy, kAuto };

/// "fork", "copy" or "auto" -> the kind; throws std::invalid_argument otherwise (naming
/// checkpoint.snapshot). kAuto is resolved by AsyncCheckpointer (collective) or, locally, by
/// choose_snapshot_kind().
SnapshotKind parse_snapshot_kind(const std::string& name);
const char* snapshot_kind_name(SnapshotKind k);

/// What checkpoint.snapshot: auto resolves to in this process, and why (one sentence).
struct SnapshotChoice {
  SnapshotKind kind = SnapshotKind::kCopy;  ///< kFork or kCopy, never kAuto
  std::string reason;
};

/// Local, no MPI call; valid after MPI_Init (the transports are chosen there). Reads which
/// Open MPI components this process has loaded (/proc/self/maps: Open MPI keeps the DSOs of
/// the components it selected and unloads the others) and the OMPI_MCA_pml / OMPI_MCA_btl
/// environment. kFork only when the pml is ob1 and every btl is self, vader, sm or tcp, no
/// UCX, HCOLL or SHARP library is loaded, and no other pml, btl, osc or coll component that
/// may register memory is (ucx, cm, openib, uct, ofi, usnic, smcuda, ...). When the
/// components cannot be seen (a static Open MPI, another MPI), kFork only if the
/// environment forces OMPI_MCA_pml=ob1 and an OMPI_MCA_btl list of those four; else kCopy.
/// MPI_T is not used: Open MPI 4.1.4 exposes the pml/btl include lists as cvars, not the
/// selection, and MPI_T_cvar_read of an unset string cvar crashes there.
SnapshotChoice choose_snapshot_kind();

/// What an asynchronous save cost (seconds; bytes of this rank's file).
struct AsyncSaveStats {
  double waited_s = 0;    ///< waiting for the previous save at the start of this one
  double snapshot_s = 0;  ///< the snapshot: fork, or the copy into staging
  double stall_s = 0;     ///< all the time training was held: wait + plan + snapshot
  int64_t staged_bytes = 0;  ///< bytes copied into staging (kCopy; device tensors under kFork)
};

/// Totals over a run (for its summary).
struct AsyncSaveTotals {
  int64_t saves = 0;         ///< asynchronous saves started
  int64_t waits = 0;         ///< saves that had to wait for the previous one
  double waited_s = 0, stall_s = 0, write_s = 0;  ///< write_s: background, file + commit
};

class AsyncCheckpointer {
 public:
  /// Collective over `comm` (one split: a barrier and MPI_Comm_split; with kAuto also one
  /// all-reduce and two broadcasts). kAuto becomes kCopy on every rank if any rank's
  /// choose_snapshot_kind() says kCopy, else kFork; rank 0 logs the choice and the reason
  /// (the first copying rank's). Throws CheckpointError when the background commit cannot
  /// have a communicator of its own (a backend that cannot split, or MPI initialized
  /// without MPI_THREAD_MULTIPLE).
  AsyncCheckpointer(Communicator& comm, SnapshotKind kind);
  /// Waits for the save in flight (errors are logged, not thrown), unless the stack is
  /// unwinding from an exception: then the background thread is left to the process's end.
  ~AsyncCheckpointer();
  AsyncCheckpointer(const AsyncCheckpointer&) = delete;
  AsyncCheckpointer& operator=(const AsyncCheckpointer&) = delete;

  /// Collective over the communicator given at construction (one all-reduce to create
  /// the directory), then returns while the save goes on. First waits for the previous save
  /// (and rethrows its error, CheckpointError, on every rank: every rank's background
  /// commit agreed on it). Snapshots this rank's shards, optimizer states, extras, buffers
  /// and counters as save_checkpoint would write them: the checkpoint equals a synchronous
  /// save at this point bit for bit. Returns the directory the checkpoint will have once
  /// committed. Nothing here may run concurrently with another thread that calls HDF5
  /// under kFork (see Hdf5Loader::pause_reads). Throws CheckpointError if fork() fails.
  /// A fork writer that has not finished within the training communicator's timeout_s()
  /// is killed, and the save fails on every rank (see the bounds above).
  std::string save(const std::string& run_dir, const TrainCounters& counters,
                   const std::vector<ModelAndOptimizer>& models, const std::string& config_yaml,
                   int keep_last, AsyncSaveStats* stats = nullptr);

  /// Local (the background commit's collectives run on every rank's thread). Waits for
  /// the save in flight, if any; rethrows its error (CheckpointError) on every rank.
  /// Returns the seconds waited. Throws CheckpointError on this rank when the save has not
  /// finished 3 x timeout_s after it started (see the bounds above).
  double wait();
  /// Local, no MPI call, cheap (an atomic load and a clock read): called after every step.
  /// Throws CheckpointError on this rank, naming the save, when the save in flight has not
  /// finished its write within timeout_s + 2 s of its start (a hung file system or writer),
  /// so that the job ends then instead of at the next save or at the commit's timeout.
  void check_write();
  /// Whether a save is in flight (local).
  bool in_flight() const { return state_ != nullptr; }
  const AsyncSaveTotals& totals() const { return totals_; }
  /// kFork or kCopy (kAuto resolved at construction).
  SnapshotKind kind() const { return kind_; }

 private:
  struct State;  // a save in flight: what its thread needs, shared with the thread
  void resolve_auto();  // collective over train_comm_: kAuto -> kFork or kCopy, logged
  [[noreturn]] void fail_hung_write(const char* bound);  // leaves the thread, throws CheckpointError
  std::shared_ptr<Communicator> comm_;  // the commit's own communicator
  Communicator& train_comm_;
  SnapshotKind kind_;
  std::shared_ptr<State> state_;
  std::vector<at::Tensor> staging_;      // kCopy: reused from save to save
  AsyncSaveTotals totals_;
};

}  // namespace shardgan
