#pragma once
/// Activation checkpointing per sharding unit (ShardingConfig::activation_checkpointing;
/// PyTorch's torch.utils.checkpoint and FSDP's apply_activation_checkpointing; Chen et al.
/// 2016, "Training Deep Nets with Sublinear Memory Cost", Sec. 3).
///
/// A checkpointed unit's forward runs without recording a graph and keeps only its inputs.
/// When backward reaches it, the unit is gathered again if it was freed (ZeRO-3), its
/// forward is run a second time with autograd on, and the gradients of its inputs and
/// trainable parameters are taken from that recomputed graph. The recomputation replays the
/// forward exactly:
///  - the module's buffers (spectral norm's u, SyncBatchNorm's running statistics) are put
///    back to their values at the original forward for the replay, then restored, so a
///    running statistic is counted once and a power iteration advances once;
///  - the default generator of the CPU and of the unit's device are put back to their
///    states at the original forward (torch.utils.checkpoint's preserve_rng_state), then
///    restored;
///  - recomputing_activations() is true during the replay, for layers that keep counters.
/// Results are bit-identical with and without checkpointing (tests/test_activation_checkpointing.cpp).
///
/// Not checkpointed: a unit in plain (higher-order) mode, i.e. the R1 penalty's pass
/// between ShardedModel::begin_higher_order and end_higher_order, whose double backward
/// needs the first-order graph; a forward with autograd off.
#include <cstdint>

namespace shardgan {

/// Local: whether this thread is replaying a checkpointed unit's forward in backward.
bool recomputing_activations();

/// Local: how many checkpointed unit forwards this process has replayed in backward since
/// it started (for tests and logs).
int64_t activation_recomputes();

}  // namespace shardgan
