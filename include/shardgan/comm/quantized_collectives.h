#pragma once
/// ZeRO++'s quantized collectives (Wang et al. 2023, arXiv 2306.10209) over any
/// Communicator, with the block quantization of quantize.h.
#include <memory>

#include <ATen/core/Tensor.h>

#include "shardgan/comm/communicator.h"
#include "shardgan/comm/quantize.h"

namespace shardgan {

/// Collective (one all-gather of quantized_bytes(S, q) bytes per rank): qwZ (Sec. 4.1).
/// Quantizes `shard` (contiguous 1-D, S elements, floating) and starts the all-gather;
/// wait() writes every rank's dequantized block, this rank's included, into `full`
/// (contiguous 1-D, S * world_size() elements, any floating dtype, same device), so every
/// rank holds the same values. Each element is within max|its block| / (2 q.qmax()) of
/// the rank's value (plus the rounding to full's dtype). Throws CollectiveError on a size
/// mismatch; the communicator's errors and timeouts otherwise.
std::unique_ptr<Work> quantized_all_gather_async(Communicator& comm, at::Tensor full, const at::Tensor& shard,
                                                 const QuantSpec& q);

/// Collective (one all-to-all of quantized_bytes(S, q) bytes per destination): qgZ
/// (Sec. 4.3), one hop. Quantizes each block q of `full` (contiguous 1-D, S * world_size()
/// elements, floating) and sends it to rank q; wait() writes into `out` (contiguous 1-D,
/// S elements, float32 or float64) the average of the N dequantized blocks this rank
/// received, summed in float32 in rank order. Each element is within
///   sum over ranks p of max|block of p's gradient holding it| / (2 q.qmax() N)
/// of the exact average (plus float32 rounding of the sum). Throws as above.
std::unique_ptr<Work> quantized_reduce_scatter_async(Communicator& comm, at::Tensor out, const at::Tensor& full,
                                                     const QuantSpec& q);

/// Collective (the all-to-all and the all-gather above, on `comm`): an average over the
/// ranks of `t` (contiguous 1-D, floating, any length; padded to a multiple of the world
/// size internally), in place, as ZeRO++ does across nodes: quantize, reduce in float32
/// (quantized_reduce_scatter_async with `q`), re-quantize the average as int8 and gather it
/// (quantized_all_gather_async). Every rank ends with the same values. Each element is
/// within the reduce-scatter's bound plus max|block of the average| / 254 of the exact
/// average (plus float32 rounding). HSDP's cross-replica gradient average uses it when the
/// model has sharding.<model>.quantized_gradients.
void quantized_all_reduce_avg(Communicator& comm, at::Tensor& t, const QuantSpec& q);

}  // namespace shardgan
