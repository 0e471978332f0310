#pragma once
// Every LibTorch internal that FSDP-style sharding needs, in one place, so that a LibTorch
// upgrade touches this file alone (built and tested on LibTorch 2.15 from the PyTorch wheel):
//  - storage free and refill under live views (FSDP's `untyped_storage().resize_(0)`);
//  - gradient-readiness hooks on a leaf's AccumulateGrad node (DeepSpeed, FSDP1);
//  - a callback at the end of the current backward pass (the engine's queue_callback);
//  - a walk over the leaves of an autograd graph.
#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

namespace shardgan::detail {

/// Frees the memory behind `t`'s storage without replacing the StorageImpl, so that every
/// view of it (module parameters, tensors autograd saved for backward) stays valid and sees
/// the new memory after refill_storage(). This is FSDP's `untyped_storage().resize_(0)`.
void free_storage(const at::Tensor& t);

/// Gives `t`'s storage fresh, uninitialized memory of `nbytes` bytes from the allocator the
/// storage was made with (on a GPU: the CUDA caching allocator, on `t`'s device), or the
/// device's registered allocator. Throws c10::Error if there is none.
void refill_storage(const at::Tensor& t, size_t nbytes);
/// Points `t`'s storage at `nbytes` of memory owned elsewhere (a node-shared buffer):
/// every view stays valid, and free_storage() later drops the pointer without freeing it.
void point_storage(const at::Tensor& t, void* p, size_t nbytes);

/// Bytes currently allocated behind `t`'s storage.
size_t storage_nbytes(const at::Tensor& t);

/// Owns a gradient-readiness hook: destroying the last copy removes the hook from the node
/// (so a graph that outlives the hook's owner never calls into it) and releases the node.
using GradReadyHookHandle = std::shared_ptr<void>;

/// Makes `on_ready` run each time the AccumulateGrad node of the leaf `param` (requires_grad)
/// has run, i.e. once its .grad for the current backward pass is final: the engine sums every
/// contribution before running the node. The hook lives as long as the returned handle.
/// Throws c10::Error if `param` is not a leaf that requires grad.
GradReadyHookHandle add_grad_ready_hook(const at::Tensor& param, std::function<void()> on_ready);

/// Queues `fn` to run once the backward pass that is running now has finished (on the thread
/// that ran it). Must be called from inside a backward pass (a hook or an autograd function).
void queue_backward_callback(std::function<void()> fn);

/// Calls `visit` once for every leaf variable (a tensor with an AccumulateGrad node) that
/// the autograd graphs behind `outputs` accumulate into. Outputs without grad_fn are skipped.
void visit_graph_leaves(const std::vector<at::Tensor>& outputs,
                        const std::function<void(const at::Tensor& leaf)>& visit);

}  // namespace shardgan::detail
