#pragma once
/// Sharded checkpoints: one HDF5 file per rank (rank-00000.h5, ...) holding that rank's
/// parameter shards, Adam moments, the replicated buffers, its RNG state, the step and the
/// sampler position. Layout of a rank file (schema 1):
///   /                              attrs: schema_version, world_size, rank, step, epoch,
///                                         batch_in_epoch, config (resolved YAML)
///   /<model>                       attrs: optim_step, stage
///   /<model>/units/<unit>/param_shard   [S] flat shard (model dtype)
///   /<model>/units/<unit>/optim/<name>  [S] each optimizer state tensor (unit_state())
///                                       attrs on the unit group: numel, padded_numel,
///                                       shard_offset
///   /<model>/buffers/<name>        full tensor (replicated, e.g. BatchNorm running stats)
///   /rng/noise                     uint8 CPU generator state of the latent sampler
/// A checkpoint is written as <run>/checkpoints/step-XXXXXXXX.tmp, fsynced, renamed to
/// step-XXXXXXXX once every rank has finished, and only then named in
/// <run>/checkpoints/latest, so an interrupted save leaves the previous one valid.
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace shardgan {

class Communicator;
class ShardedModel;
class ShardedOptimizer;

inline constexpr int64_t kCheckpointSchemaVersion = 1;

/// A checkpoint that cannot be loaded; the message names the file and the problem.
class CheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

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
  ShardedOptimizer* optim;
  /// Further per-unit shard state saved beside the parameters under a stable name, e.g.
  /// {"ema", f}: f(unit index) returns the live 1-D tensor of shard_numel() elements.
  std::vector<std::pair<std::string, std::function<at::Tensor(size_t)>>> extra = {};
};

/// Collective (barriers on `comm`). Writes and commits checkpoint step-<step> under
/// `run_dir`/checkpoints and returns its directory. Throws CheckpointError or h5::H5Error
/// on an I/O failure; the previous checkpoint is untouched then.
/// Keeps the newest `keep_last` committed checkpoints (>= 1) and deletes older ones.
std::string save_checkpoint(const std::string& run_dir, const TrainCounters& counters,
                            const std::vector<ModelAndOptimizer>& models,
                            const std::string& config_yaml, Communicator& comm,
                            int keep_last = 3);

/// Collective (a barrier). Restores this rank's shards, moments, buffers and counters
/// from checkpoint directory `ckpt_dir`. Throws CheckpointError if the checkpoint's world
/// size or stages differ from this run's (resharding comes later), or if a file is
/// missing, truncated or holds tensors of other sizes.
void load_checkpoint(const std::string& ckpt_dir, TrainCounters& counters,
                     const std::vector<ModelAndOptimizer>& models, Communicator& comm);

/// Local. Resolves what `--resume` names: a checkpoint directory, a checkpoints folder
/// with a `latest` file, or a run directory holding one. Throws CheckpointError.
std::string resolve_checkpoint_dir(const std::string& path);

}  // namespace shardgan
