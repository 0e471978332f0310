#pragma once
/// A scoped switch for spectral normalization's power iteration (Miyato et al. 2018,
/// Alg. 1). BigGAN-PyTorch runs D once per training forward on cat([fake, real]), so D's
/// singular-vector estimate u advances once per D forward of a D step, and once in the G
/// step. shardgan runs real and fake as two forwards (each with its own backward, so that
/// ZeRO-3 units are released early) unless train.d_joint_pass is on; the second one runs
/// under a PowerIterationPause, so that u still advances once per D step and micro-batch.
/// While a pause is alive on this thread, spectral-norm layers compute sigma from their
/// stored u (as in eval mode) and leave it unchanged. Local, no tensors; nestable.
namespace shardgan {

namespace detail {
inline thread_local int power_iteration_pauses = 0;
}  // namespace detail

/// Whether a PowerIterationPause is alive on this thread.
inline bool power_iteration_paused() { return detail::power_iteration_pauses > 0; }

class PowerIterationPause {
 public:
  PowerIterationPause() { ++detail::power_iteration_pauses; }
  ~PowerIterationPause() { --detail::power_iteration_pauses; }
  PowerIterationPause(const PowerIterationPause&) = delete;
  PowerIterationPause& operator=(const PowerIterationPause&) = delete;
};

}  // namespace shardgan
