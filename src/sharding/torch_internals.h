#pragma once
// Every LibTorch internal the project uses (torch/csrc/autograd's engine, nodes and hooks,
// StorageImpl, c10::detail), in one place, so that a LibTorch upgrade touches this file and
// torch_internals.cpp alone (built and tested on LibTorch 2.15 from the PyTorch wheel). No
// other file includes torch/csrc/autograd/{engine,function_hook,functions/...}.h or names
// c10::detail. Sharding and the layers above it (optim) include it:
//  - storage free and refill under live views (FSDP's `untyped_storage().resize_(0)`);
//  - gradient-readiness hooks on a leaf's AccumulateGrad node (DeepSpeed, FSDP1);
//  - a callback at the end of the current backward pass (the engine's queue_callback);
//  - a walk over the leaves of an autograd graph;
//  - activation checkpointing's replayed backward (the engine's execute from gradient
//    edges, with a pre-hook on the root node);
//  - IEEE float16 rounding (the fused Adam kernel's float16 parameter copy).
#include <cstddef>
#include <cstdint>
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

/// Activation checkpointing's backward through a replayed forward: the gradients of the
/// graph behind `outputs` with respect to `wrt`, given the outputs' incoming gradients
/// `grads`, as torch::autograd::grad(outputs, wrt, grads, keep_graph = false, create_graph =
/// false, allow_unused = true) computes them inside (the default engine's execute from the
/// outputs' gradient edges, accumulate_grad = false; nothing is written to any .grad). Output
/// i is a root when outputs[i], grads[i] are defined and outputs[i] requires grad (entries
/// past the shorter list are ignored). Unlike torch::autograd::grad:
///  - both lists are cleared (their references dropped) before the backward runs, so an
///    output's data goes unless a node saved it;
///  - with exactly one root, the incoming gradient is also released as soon as the root
///    node starts (the engine then holds its own reference), not when the backward ends.
/// Each `wrt` entry must require grad (a leaf, or a detached copy made to require it).
/// Returns one gradient per `wrt` entry (undefined where it does not depend on the roots),
/// or an empty list when there is no root or `wrt` is empty. Runs on the calling thread
/// (inside an outer backward, as a node's backward does); the engine's errors propagate.
std::vector<at::Tensor> backward_from_roots(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& grads,
                                            const std::vector<at::Tensor>& wrt);

/// The IEEE 754 binary16 bits of `f`, rounded to nearest even (NaN stays NaN, overflow gives
/// Inf): c10::detail::fp16_ieee_from_fp32_value, c10::Half's own conversion on the CPU.
uint16_t fp16_bits(float f);

}  // namespace shardgan::detail
