#pragma once
// The pieces of a checkpoint save (src/checkpoint/save.cpp), shared by the synchronous
// save_checkpoint and the asynchronous one (async_checkpoint.cpp). Internal to the library.
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "shardgan/checkpoint/checkpoint.h"
#include "shardgan/checkpoint/manifest.h"
#include "shardgan/h5/h5.h"

namespace shardgan::ckpt_detail {

h5::DType h5_type(at::ScalarType t);  ///< float32/64, int64, uint8; throws CheckpointError
/// The step of a committed directory name "step-XXXXXXXX", or -1 (*.tmp, *.old, *.del).
int64_t committed_step(const std::string& name);
bool by_step(const std::string& a, const std::string& b);  ///< orders names by step

/// What a save needs after the rank file is written, without the models: taken on the
/// training thread, so that a background commit never reads state that training changes.
struct SaveParts {
  std::string root, name, final_dir, tmp_dir, what;
  int64_t step = 0;
  int world_size = 1;
  int keep_last = 3;
  ckpt::Manifest mine;   ///< this rank's record: the shards it writes (files added after writing)
  ckpt::Manifest index;  ///< rank 0: the index without shards and files
};

/// Receives what one rank file holds, in order: datasets (1-D or N-D, any device) and
/// integer attributes. An attribute on a model's group with `if_exists` is set only when
/// that group was written (a rank that holds no shard of the model has none).
class RankFileSink {
 public:
  virtual ~RankFileSink() = default;
  virtual void dataset(const std::string& path, const at::Tensor& t) = 0;
  virtual void attr(const std::string& obj, const std::string& name, int64_t v, bool if_exists = false) = 0;
};

/// Local. Names and metadata of a save of `counters.step` (SaveParts without the rank file).
SaveParts plan_save(const std::string& run_dir, const TrainCounters& counters,
                    const std::vector<ModelAndOptimizer>& models, const std::string& config_yaml,
                    int rank, int world_size, int keep_last);

/// Local. Sends this rank's datasets and attributes to `sink` (materializing offloaded
/// state one unit at a time) and fills parts.mine's shard records.
void visit_rank_file(SaveParts& parts, const TrainCounters& counters, const std::vector<ModelAndOptimizer>& models,
                     int rank, RankFileSink& sink);

/// Collective (one all-reduce). Rank 0 makes an empty tmp_dir; every rank throws
/// CheckpointError if it could not.
void prepare_tmp_dir(const SaveParts& parts, Communicator& comm);

/// Collective (two all-reduces, two all-gathers). `error` is this rank's write error ("" if
/// none): if any rank has one, every rank throws CheckpointError (committed checkpoints
/// untouched). Otherwise rank 0 writes the index from every rank's record and commits
/// (rename, `latest`, retention); a commit error throws on every rank too.
void commit_save(SaveParts& parts, const std::string& error, Communicator& comm);

/// Collective (one all-reduce): every rank passes its own error ("" if none); if any rank
/// failed, every rank throws (the failing ones their own message, the others one naming
/// the failed ranks).
void agree_or_throw(Communicator& comm, const std::string& error, const std::string& what);

}  // namespace shardgan::ckpt_detail
