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
///
/// Segments (ShardingConfig::checkpoint_segments): a model's forward may mark parts of a unit
/// with checkpoint_segment(). While a checkpointed unit with segments on is replayed, each
/// such part runs as a nested checkpoint: the replayed graph keeps the segment's inputs,
/// not its activations, and the segment is replayed once more when backward reaches it
/// (with its own buffers and the generators put back, as above). Everywhere else the part
/// just runs. Bits: a tensor used in several places sums its gradient terms in the order
/// backward reaches them, and a segment hands back one sum for its uses inside it. Results
/// keep their bits when every segment input has at most two uses in all (x + y = y + x
/// exactly); BigGAN computes its conditional BatchNorm scales outside the segments, since
/// its conditioning vector feeds four.
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <vector>

#include <ATen/core/Tensor.h>

namespace torch::nn {
class Module;
}

namespace shardgan {

/// Runs `fn` on `inputs` (tensors of any shape, dtype and device; undefined entries are
/// passed through) and returns its outputs; see "Segments" above. `scope` are the modules
/// `fn` uses: their trainable parameters get gradients through the segment (none for one
/// that `fn` does not use), and their buffers are put back for its replay. `fn` must
/// compute its outputs from `inputs` and `scope` alone, the same way each time (it runs up
/// to three times per step). Local unless `fn` itself runs a collective (SyncBatchNorm),
/// which every rank then replays in the same order. Throws what `fn` throws.
std::vector<at::Tensor> checkpoint_segment(std::initializer_list<torch::nn::Module*> scope,
                                           const std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>& fn,
                                           const std::vector<at::Tensor>& inputs);

/// Local: whether this thread is replaying a checkpointed unit's forward in backward.
bool recomputing_activations();

/// Local: how many checkpointed unit forwards this process has replayed in backward since
/// it started (for tests and logs).
int64_t activation_recomputes();

}  // namespace shardgan
