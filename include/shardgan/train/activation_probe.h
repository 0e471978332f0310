#pragma once
/// The activation term of the memory pre-flight, measured rather than padded: one GAN step
/// (d_steps = 1, one micro-batch, R1 when configured) of the configured G and D runs as rank
/// 0 of a ShadowCommunicator world (comm/shadow_communicator.h), so that each unit is built
/// and sharded 1/W as usual and gathered at its full size when it runs, while the shards
/// this rank keeps are small. The bytes LibTorch's CPU allocator hands out during the step
/// (c10's memory-reporting hook, the one torch.profiler's profile_memory uses) peak at the
/// activations of the passes, the gathered units, the gradient buffers and the
/// reduce-scatters' receive buffers together, as they coincide in the real step. Up to
/// kProbeExactMaxBatch samples per rank the probe runs at the configured micro-batch itself;
/// above, at kProbeExactMaxBatch and twice that, and the line through both is scaled to the
/// configured micro-batch. (At 1-2 samples the gathered units and gradient buffers dominate
/// and the peak is not yet linear in the batch; from about 4 samples on it is: the demo
/// DCGAN and a 67M BigGAN grow by a constant 0.28 and 12.0 MB per sample from 8 to 64.)
#include <cstdint>
#include <string>

#include "shardgan/train/config.h"

namespace shardgan {

/// The largest micro-batch probed as it is; larger ones are scaled from it and its double.
inline constexpr int64_t kProbeExactMaxBatch = 8;

struct ActivationProbe {
  int64_t micro_batch_a = 0, micro_batch_b = 0;  ///< per-rank samples of the probes (b: 0 if one)
  int64_t peak_a_bytes = 0, peak_b_bytes = 0;    ///< allocator peak during each step (bytes)
  int shadow_world = 0;                          ///< W: the shadow ranks the models are sharded over
  double seconds = 0;                            ///< wall time of both probes
  /// Transient bytes of one step at `micro_batch` samples per rank: the line through both
  /// probes (never below the larger probe's peak when micro_batch is above it); with one
  /// probe, its peak.
  int64_t bytes_at(int64_t micro_batch) const;
  /// Bytes per sample: the line's slope (0 with one probe).
  double bytes_per_sample() const;
};

/// Local (no collectives, no MPI). Probes `cfg` for a step at `micro_batch` samples per
/// rank, as described above (one or two probes).
ActivationProbe probe_step_memory(const TrainConfig& cfg, const std::string& work_dir, int64_t micro_batch);

/// Local. Runs the probe at `micro_batch_a` and, unless `micro_batch_b` is 0, at
/// `micro_batch_b` (> micro_batch_a >= 1) samples per rank,
/// with offload switched off (the offload tiers are counted by the estimate), in a
/// directory under cfg.run_dir that it removes. Throws std::invalid_argument naming
/// train.memory_probe for a run it cannot probe (run.device cuda, hybrid sharding), and
/// whatever building or stepping the models throws (a NaN in the stand-in values is not an
/// error: the peak has been seen by then).
ActivationProbe probe_step_memory(const TrainConfig& cfg, const std::string& work_dir, int64_t micro_batch_a,
                                  int64_t micro_batch_b);

}  // namespace shardgan
