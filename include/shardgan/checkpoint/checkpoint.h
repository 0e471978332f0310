#pragma once
/// Sharded checkpoints (schema 2; docs/checkpoints.md). A checkpoint is one directory,
/// <run>/checkpoints/step-XXXXXXXX, holding
///   rank-NNNNN.h5  each rank's flat shards: per unit and model
///                    /<model>/units/<unit>/param_shard      [S] flat elements [off, off+S)
///                    /<model>/units/<unit>/optim/<state>    [S] (ShardedOptimizer::unit_state)
///                    /<model>/units/<unit>/<extra>          [S] (ModelAndOptimizer::extra)
///                  plus /<model>/buffers/<name> (rank 0 only: replicated) and /rng/noise.
///                  At stage 0 every rank holds everything, so only rank 0 writes units.
///   index.h5       written last by rank 0: root attributes (schema_version, world_size,
///                  step, epoch, batch_in_epoch, config, scalar.<name>), /manifest.json
///                  (layout and per-block xxh3 checksums of every dataset), and one HDF5
///                  virtual dataset per full tensor: /<model>/params/<unit>.<param>,
///                  /<model>/optim/<state>/<unit>.<param>, /<model>/<extra>/<unit>.<param>,
///                  /<model>/buffers/<unit>.<buffer>. h5py and h5dump read them unsharded.
/// Commit: files are written into step-XXXXXXXX.tmp/, fsynced, the directory is renamed
/// and fsynced, and `latest` is replaced last; an interrupted save (kill -9 of any rank)
/// never touches a committed checkpoint. Any world size and stage can load any checkpoint:
/// each rank reads, with hyperslab reads, the global flat range it owns now.
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "shardgan/checkpoint/manifest.h"

namespace shardgan {

class Communicator;
class ShardedModel;
class ShardedOptimizer;

inline constexpr int64_t kCheckpointSchemaVersion = ckpt::kSchemaVersion;

/// What besides the models a checkpoint restores.
struct TrainCounters {
  int64_t step = 0;            ///< optimizer steps done
  int64_t epoch = 0;           ///< sampler epoch
  int64_t batch_in_epoch = 0;  ///< next global batch index within the epoch
  at::Tensor noise_rng_state;  ///< uint8 state of the latent-noise generator
  /// Further trainer scalars by stable name (e.g. "loss_scale"), saved as attributes.
  std::map<std::string, double> scalars;
};

struct ModelAndOptimizer {
  ShardedModel* model;
  ShardedOptimizer* optim;  ///< may be null: no optimizer state is saved or loaded
  /// Further per-unit shard state saved beside the parameters under a stable name, e.g.
  /// {"ema", f}: f(unit index) returns the live 1-D tensor of shard_numel() elements.
  std::vector<std::pair<std::string, std::function<at::Tensor(size_t)>>> extra = {};
  /// The lowest rank (of the save's communicator) that holds the model: it writes the
  /// model's replicated state (buffers; every unit at stage 0) and its entry in the index.
  /// 0 unless the model lives on a subset of the ranks (train.placement: split, where a
  /// rank passes only the model it holds).
  int leader = 0;
};

/// What one save cost on this rank (for logs and the benchmark).
struct SaveStats {
  int64_t bytes = 0;         ///< bytes of this rank's file
  double write_s = 0;        ///< writing and fsyncing this rank's file
  double total_s = 0;        ///< the whole collective save, commit included
};

/// Collective (three all-reduces and one all-gather on `comm`). Writes and commits
/// checkpoint step-<step> under `run_dir`/checkpoints and returns its directory; the name
/// is zero-padded to 8 digits and grows past step 99,999,999 (directories are ordered by
/// step, not by name). An I/O failure on any rank (a write error, a full disk) makes every
/// rank throw CheckpointError at the next agreement point: the failing rank with its
/// cause, the others naming the failed rank. Nobody waits for the collective timeout, and
/// committed checkpoints are untouched. Keeps the newest `keep_last` committed checkpoints
/// (>= 1), deletes older ones and leftovers of interrupted saves.
std::string save_checkpoint(const std::string& run_dir, const TrainCounters& counters,
                            const std::vector<ModelAndOptimizer>& models,
                            const std::string& config_yaml, Communicator& comm,
                            int keep_last = 3, SaveStats* stats = nullptr);

/// Collective (one all-reduce). Restores this rank's shards, optimizer states, extras,
/// buffers and counters from checkpoint directory `ckpt_dir`, whatever world size and
/// stages wrote it: each rank reads the flat range it owns under the current layout
/// (resharding on load), verifying the checksums of what it reads. A checkpoint written
/// at the same world size and stages loads bit for bit. Throws CheckpointError on every
/// rank if any rank fails (missing, truncated or corrupted file, wrong schema, another
/// model); the models' state is unspecified after a throw.
void load_checkpoint(const std::string& ckpt_dir, TrainCounters& counters,
                     const std::vector<ModelAndOptimizer>& models, Communicator& comm);

/// Local. The committed checkpoints in checkpoints folder `folder` (step-<digits>
/// directories, not interrupted *.tmp saves): those save_checkpoint's rotation counts
/// against `keep_last`. 0 when `folder` is not a directory; throws nothing.
int64_t committed_checkpoint_count(const std::string& folder);

/// Local. Waits until this process's background deletion of old checkpoints (started by
/// the last save_checkpoint on rank 0) has finished; returns at once if there is none.
/// The benchmark calls it so that a timed load does not share the disk with a deletion.
void wait_for_checkpoint_cleanup();

/// Local. Resolves what `--resume` names: a checkpoint directory (holding index.h5), or a
/// checkpoints folder or run directory, where it picks the newest committed checkpoint
/// (interrupted *.tmp saves are ignored; `latest` names the same one unless a crash hit
/// between the rename and its update). Throws CheckpointError, whose message starts with
/// `what` and the path (`what`: how the caller's user named the path, e.g. the tool's
/// "checkpoint").
std::string resolve_checkpoint_dir(const std::string& path, const std::string& what = "--resume");

/// Collective (every rank, same order: two broadcasts from rank 0 and one all-reduce of
/// world_size() doubles). Rank 0 alone resolves `path` (resolve_checkpoint_dir) and
/// broadcasts its choice; every rank then confirms that it sees that checkpoint's index,
/// so that all ranks load the same step or none does. Returns the directory, or "" when
/// there is nothing to resume and `none_is_fresh` (--resume auto on a first start).
/// Throws CheckpointError on every rank: rank 0's resolution error, or, naming the ranks,
/// when some rank cannot see the chosen checkpoint.
std::string agree_checkpoint_dir(const std::string& path, Communicator& comm, bool none_is_fresh);

}  // namespace shardgan
