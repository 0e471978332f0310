#pragma once
/// Per-model sharding options (ShardingConfig) and the tensor lists units take and return.
/// Kept apart from sharded_unit.h so that config parsing and the unit's private parts can
/// name them without the unit's class.
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

namespace shardgan {

/// Per-model sharding options. Changing them after the model is built has no effect.
///
/// | stage | sharded                        | parameters between steps      | gradients          |
/// |-------|--------------------------------|-------------------------------|--------------------|
/// | 0     | nothing (replicated reference) | full                          | all-reduced        |
/// | 1     | optimizer state                | full; owned slice updated,    | reduce-scattered at|
/// |       |                                | then all-gathered             | the accumulation   |
/// |       |                                |                               | boundary           |
/// | 2     | + gradients                    | as stage 1                    | reduce-scattered   |
/// |       |                                |                               | every micro-step   |
/// | 3     | + parameters                   | shard only; gathered per unit | as stage 2         |
/// (ZeRO paper, Rajbhandari et al. 2020, Sec. 5.1-5.3.)
struct ShardingConfig {
  /// ZeRO stage, 0 to 3 (table above).
  int stage = 3;
  /// Stage 3: free the gathered parameters after forward and gather them again for
  /// backward (FSDP's reshard_after_forward). False keeps them from forward until the
  /// unit's gradients are reduced, so a D run on real and then fake images is gathered
  /// once per step (the "gather D once" policy, at the cost of memory).
  bool reshard_after_forward = true;
  /// Mixed precision: dtype the parameters are gathered and computed in. Undefined means
  /// the master dtype (the dtype the module was built in). bfloat16 or float16 keep a
  /// float32 master shard and float32 optimizer state.
  c10::optional<at::ScalarType> compute_dtype;
  /// Dtype gradients are reduced in (undefined: the master dtype).
  c10::optional<at::ScalarType> reduce_dtype;
  /// Stage 3: start the next unit's all-gather (non-blocking) before the current unit
  /// computes, in forward and in backward. At most three units are then gathered at once:
  /// the one computing, the one prefetched, and in backward the one whose gradients are
  /// being reduced (two in forward with reshard_after_forward).
  bool prefetch = true;
  /// Activation checkpointing (activation_checkpoint.h; FSDP's
  /// apply_activation_checkpointing on every unit): each unit keeps only its inputs from
  /// forward to backward and recomputes its forward in backward, gathering its parameters
  /// again at stage 3 if they were freed. Bit-identical results; costs one more forward
  /// per unit (and at stage 3 with reshard_after_forward, no extra all-gather: backward
  /// gathers the unit anyway).
  bool activation_checkpointing = false;
  /// With activation_checkpointing: the unit's forward may also checkpoint parts of
  /// itself (checkpoint_segment in activation_checkpoint.h; a model family marks them, e.g.
  /// BigGAN's residual and shortcut paths). The unit's replay in backward then keeps only
  /// each segment's inputs, and each segment is replayed once more when backward reaches
  /// it: the peak holds one segment's activations instead of one unit's, for one more
  /// forward of the segmented parts. Bit-identical results. Ignored without
  /// activation_checkpointing.
  bool checkpoint_segments = false;
  /// Stage 3 with parameter offload (offload_shard): read the master shard of the unit
  /// after next from its tier on a worker thread while the current unit computes and the
  /// next one is all-gathered, in forward and in backward (DeepSpeed's partitioned-parameter
  /// swapper, ZeRO-Infinity Sec. 6.2). False reads each shard on the compute thread when
  /// its all-gather starts.
  bool read_ahead = true;
  /// Stage 3 on the CPU with every rank on one host: the gathered flat parameter lives in
  /// node-shared memory (comm/node_shared.h). Each rank converts its master shard into its
  /// own block there and the others compute from the same pages: the all-gather copies
  /// nothing, and the node holds one gathered copy of a unit instead of one per rank.
  /// Ignored (with the MPI all-gather instead) on a GPU, across hosts, under HSDP and for
  /// other backends. The same bits as the all-gather. Memory: a pool of
  /// ShardedModel::kSharedSlots slots of the model's largest gathered unit, kept for the
  /// run and mapped by every rank of the node.
  bool node_shared_gather = false;
  /// Stage 3, ZeRO++ qwZ (Wang et al. 2023, Sec. 4.1): 8 gathers the parameters as int8
  /// blocks (comm/quantize.h), 0 in the compute dtype. Every rank, its own block included,
  /// computes with the dequantized values: each element within max|block| / 254 of the
  /// master value. Master shards and optimizer state stay in the master dtype. Where the
  /// node-shared gather applies (one host), it moves no bytes and is used unquantized.
  int quantized_weights_bits = 0;
  /// Stages 2-3, ZeRO++ qgZ (Sec. 4.3): 8 or 4 quantizes each destination block of a
  /// micro-batch's gradients, exchanges them with an all-to-all and sums the dequantized
  /// blocks in float32 (one hop: no re-quantization between hops), 0 reduce-scatters in the
  /// reduce dtype. Each element of the averaged gradient is within
  /// sum_q max|block_q| / (2 q_max N) of the exact average (q_max 127 or 7).
  int quantized_gradients_bits = 0;
  /// Elements per float32 scale of both quantized collectives.
  int64_t quantization_block = 256;
  /// Stage 3, ZeRO++ hpZ (Wang et al. 2023, Sec. 4.2; DeepSpeed's zero_hpz_partition_size):
  /// the ranks of a secondary group, usually one node's. 1 is off. K > 1: a unit's first
  /// all-gather after each parameter change (over all N ranks) also keeps block
  /// group-rank of the gathered flat parameter, P / K elements in the compute dtype, and
  /// every later gather of that unit until the next ShardedModel::after_optimizer_step()
  /// all-gathers those blocks inside the secondary group only: backward's gathers, and
  /// with a GAN the discriminator's second and third forward of a step, stay inside the
  /// node. The same bits as the world gather (with qwZ, its dequantized values). Costs P / K
  /// compute-dtype elements per unit per rank between steps (MemoryStats::
  /// secondary_param_bytes). 0 means one group per node (the launcher's local ranks). The
  /// group itself is built by the caller (ShardedModel::set_secondary_group); this field
  /// only sizes the memory pre-flight. Where the node-shared gather applies (one host), it
  /// serves the gathers first; only its fallbacks gather over the world or the group.
  int hpz_partition_size = 1;
  /// Alignment, in elements, of every parameter's first element in the flat parameter and
  /// of every shard boundary (flat_layout.h). 1 (the default) packs the parameters back to
  /// back. 8-bit optimizer states (optim.<model>.state_dtype: int8) set it to their block,
  /// so that no block spans two parameters or two ranks; the trainer derives it, it is not
  /// a config key. The gaps are padding: zero, never trained, counted in padding_elements.
  int64_t flat_align = 1;
};

/// Inputs or outputs of a unit or model. Tensors may be undefined (e.g. no labels).
using TensorList = std::vector<at::Tensor>;

}  // namespace shardgan
