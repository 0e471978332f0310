#pragma once
/// Offline operations on sharded checkpoints, for the shardgan-ckpt tool: no MPI, no
/// model, and memory bounded by the largest tensor (consolidate, diff) or the largest new
/// shard (reshard). All verify the checksums of what they read.
#include <cstdint>
#include <string>
#include <vector>

namespace shardgan::ckpt {

/// Writes `out_path` (through out_path.tmp and a rename): one plain HDF5 file with every
/// full tensor at its index path (<model>/params/<name>, <model>/optim/<state>/<name>,
/// <model>/<extra>/<name>, <model>/buffers/<name>) and the index's root attributes.
/// Streams tensor by tensor. Throws CheckpointError.
void consolidate(const std::string& ckpt_dir, const std::string& out_path);

/// Writes checkpoint `src` laid out for `world_size` ranks into the new directory `dst`
/// (through dst.tmp and a rename), at the same stages or, with `stage` >= 0, at that
/// stage for every model. Throws CheckpointError (also if `dst` exists).
void reshard(const std::string& src, const std::string& dst, int world_size, int stage = -1);

struct TensorDiff {
  std::string path;
  int64_t numel = 0;
  double max_abs = 0;  ///< max |a - b|
  double max_rel = 0;  ///< max |a - b| / max |b| (0 when equal)
  std::string note;    ///< "only in A", "shape differs", ... (then the numbers are unset)
};
/// Per-tensor differences between two checkpoints (matched by index path).
std::vector<TensorDiff> diff(const std::string& a_dir, const std::string& b_dir);

/// Fills d.max_abs and d.max_rel from values `a` and `b` (same length). A NaN or an
/// infinity on one side only (or infinities of opposite sign) is an infinite difference,
/// never dropped: max(x, NaN) would keep x; d.note gets "non-finite values differ". NaN
/// against NaN, and equal infinities, count as equal in the numbers, but d.note gets
/// "non-finite values on both sides": two runs that diverged to NaN alike are no match
/// (`shardgan-ckpt diff --rtol` fails on either note).
void compare_values(const std::vector<double>& a, const std::vector<double>& b, TensorDiff& d);

}  // namespace shardgan::ckpt
