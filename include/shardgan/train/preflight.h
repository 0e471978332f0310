#pragma once
/// Memory pre-flight of a training config (DeepSpeed's estimate_zero3_model_states_mem_needs
/// for two models): bytes per rank of G and D at every ZeRO stage under the configured world
/// size, next to this node's memory, before anything of the models is allocated.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "shardgan/train/config.h"

namespace shardgan {

class Communicator;

/// Thrown when the configured run would need more memory than the node has available.
class MemoryPreflightError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Thrown when the configured run's offload files or checkpoints would not fit on their disk.
class DiskPreflightError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Local (no collectives). Counts the parameters of every unit of G and D (building one
/// unit at a time, uninitialized, and dropping it) and estimates per-rank bytes at each
/// stage for `world_size` ranks, `local_ranks` of them on this node. The JSON holds the
/// integer keys generator_params and discriminator_params; "data" (the images the trainer
/// holds: data_image_count, their bytes per rank, and a paired folder's uint8 copy while it
/// is decoded); per stage 0-3 and model, the bytes per rank of params, grads, optimizer
/// state, EMA, the largest gathered unit and the peak; per stage, both models' state and
/// peak in the step's largest phase (step_phases.h: the buffers alive at once in each phase
/// of the configured update rule, d_steps and placement; "state_bytes_without_phases" is
/// the count that ignored them) and the async checkpoint's snapshot bytes; the configured
/// stages' phases, per-rank peak and per-node total; and the node's total and available
/// memory (bytes, /proc/meminfo capped by the cgroup limit). With cfg.memory_probe on the
/// CPU and without HSDP it also runs the activation probe (activation_probe.h; 1-20 s,
/// local) and adds "probe" and configured.predicted: the predicted peak RSS per rank and
/// its terms (bytes), which check_memory then uses. Under split placement,
/// `node_world_ranks` are the world ranks on this node (from a shared-memory split of the
/// world); empty: contiguous_node_ranks(). Throws what building or stepping the models
/// throws.
nlohmann::json memory_preflight(const TrainConfig& cfg, Communicator& comm, int world_size, int local_ranks,
                                const std::vector<int>& node_world_ranks = {});

/// The world ranks on a node of `local_ranks` ranks when no shared-memory split says which:
/// the block of local_ranks consecutive ranks, aligned at a multiple of local_ranks, that
/// holds `rank`, cut at world_size (Open MPI's default mapping by slot and Slurm's block
/// distribution, with the same number of ranks on every node). Local, pure.
std::vector<int> contiguous_node_ranks(int rank, int local_ranks, int world_size);

/// Split placement: how many of a node's ranks `node_world_ranks` hold G (world ranks
/// [0, k)) and how many hold D. Local, pure.
std::pair<int64_t, int64_t> split_ranks_on_node(int k, const std::vector<int>& node_world_ranks);

/// The training images the trainer keeps in memory: data.synthetic_size for synthetic,
/// 60000 for fashion-mnist, the image files directly in data.path for paired (the files
/// read_paired_folder decodes, counted by a directory listing; 0 if it cannot be read), 0
/// for hdf5 (streamed). Local.
int64_t data_image_count(const TrainConfig& cfg);

/// What a rank needs beyond the estimate, calibrated on measured peak RSS (VmHWM) of BigGAN
/// runs at 6.7e7-1e9 parameters, stages 0-3, N = 1, 2 and 4 (docs/results.md#memory-sweep): LibTorch's
/// own ~0.35 GiB per process, MPI's buffers, activations and the 16-bit reduction copies,
/// which the estimate leaves out. Checked: estimate * kPreflightFactor + overhead per rank.
/// The overhead was 1 GiB until the 514.5M-parameter cell at N = 2, stage 3 measured
/// 5.84 GiB per rank against 4.12 * 1.15 + 1 = 5.74 allowed; 1.25 GiB leaves every cell of
/// that sweep run with the current allocator settings at least 0.14 GiB under the bound.
/// These apply only without the probe (train.memory_probe false, run.device cuda, or HSDP).
inline constexpr double kPreflightFactor = 1.15;
inline constexpr int64_t kPreflightRankOverheadBytes = int64_t{5} << 28;  // 1.25 GiB

/// With the probe (train.memory_probe, the default on the CPU): the prediction is this
/// process's RSS after the probe + the persistent state + the data + the probe's
/// transient bytes at the configured micro-batch + this margin, which covers what neither
/// sees: MPI's own buffers (libnbc's reduction temporaries, shared-memory segments), the
/// allocator's free lists and fragmentation, and the final checkpoint save. A fit, not a
/// derivation: the 30-cell memory sweep (67M-1.03e9 parameters, N = 1, 2, 4, stages 0-3,
/// 1-128 samples per rank, one machine, tcmalloc; docs/results.md#memory-sweep) ran with 150 MiB;
/// the prediction is a sum, so each cell's is recomputed exactly with another margin, and
/// 100 MiB minimizes the worst error: measured VmHWM 0.91-1.08x the prediction.
/// It was 150 MiB until each model's gradient shards were released after its update: the
/// final save no longer stacks on them, and 150 MiB then over-predicted five cells by more
/// than 10%.
inline constexpr int64_t kPredictionMarginBytes = int64_t{100} << 20;

/// Local. Throws MemoryPreflightError when the configured stages' estimate, with the margin
/// above, times `local_ranks` exceeds the node's available memory. The message gives the bytes
/// needed and available, and the lowest stage (for both models) that would fit, or says
/// that none does. `report` is memory_preflight's result.
void check_memory(const TrainConfig& cfg, const nlohmann::json& report);

/// Local. The disk part of the pre-flight (memory_preflight puts it under "disk"): where the
/// run writes its disk-tier offload files (offload.path, else <run.dir>/offload) and its
/// checkpoints (<run.dir>/checkpoints), and for this node's ranks: `offload_bytes`, the
/// offload files (bytes), with offload_bytes_present of them already there (this run's
/// files of an earlier start, which the store truncates and reserves again);
/// `checkpoint_bytes`, one checkpoint (master shards, optimizer state, EMA; the HDF5
/// metadata and buffers are not counted); checkpoints_present, the committed checkpoints
/// already in that folder (the run's saves rotate them out); checkpoints_at_once, the
/// checkpoints' worth of new space the run needs at its peak: 0 without saves, else
/// max(1, min(present + saves, train.keep_checkpoints + 1) - present); leftovers_present and
/// leftover_bytes, the step-* directories of interrupted saves there (*.tmp, *.old, *.del)
/// and their files' bytes; checkpoint_bytes_needed(), the new space they need; the free
/// bytes of each folder's filesystem (statvfs of its nearest existing ancestor; -1 if
/// unknown) and whether the two share one. A checkpoint
/// folder on a filesystem shared between nodes holds every node's files: this counts one
/// node's.
nlohmann::json disk_report(const TrainConfig& cfg, int64_t offload_bytes, int64_t checkpoint_bytes);

/// New disk space the checkpoints need at their peak: 0 when `at_once` is 0, else the
/// larger of one checkpoint (the first save writes before its commit deletes anything) and
/// `at_once` checkpoints less the leftovers of interrupted saves (`leftover_bytes`, which
/// that commit deletes, and a save waits for the deletion before it writes). Local, pure.
int64_t checkpoint_bytes_needed(int64_t checkpoint_bytes, int64_t at_once, int64_t leftover_bytes);

/// Checkpoints a run of `cfg` saves: one every train.checkpoint_every steps, and one at the
/// end unless train.final_checkpoint is false or the last step saved one. Local, pure.
int64_t checkpoint_saves(const TrainConfig& cfg);

/// Local. Throws DiskPreflightError when the offload files do not fit in their folder's
/// free space (after crediting offload_bytes_present), or the checkpoints' new space
/// (checkpoint_bytes_needed) does not fit in theirs (after the offload files, when both
/// share a filesystem). The message
/// names the folder, the bytes needed and free, and the keys that change them
/// (offload.path, run.dir, train.keep_checkpoints, train.checkpoint_every,
/// train.final_checkpoint, train.skip_disk_check). Returns when `report` has no "disk" or a
/// free-space figure is unknown.
void check_disk(const TrainConfig& cfg, const nlohmann::json& report);

/// What check_memory compares for ZeRO `stage` (0-3) on both models: bytes for all ranks of
/// this node. With a prediction in `report`, the configured prediction with the persistent
/// state and checkpoint staging buffers of `stage` in place of the configured stages' (plus
/// any growth of the estimate's transient bound); without one, the estimate's peak with the
/// staging buffers and the margin above. Either way plus a fork snapshot's bytes at `stage`
/// (checkpoint.async). Local; throws nlohmann::json's errors for a report that is not
/// memory_preflight's.
int64_t stage_need_bytes(const nlohmann::json& report, int stage);

}  // namespace shardgan
