#include "sharding/torch_internals.h"

#include <unordered_set>
#include <utility>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/Half.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/torch.h>

namespace shardgan::detail {

void free_storage(const at::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(at::DataPtr(nullptr, t.device()));
  s->set_nbytes(static_cast<size_t>(0));
}

void refill_storage(const at::Tensor& t, size_t nbytes) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  // The allocator the storage was made with (CUDA's caching allocator for a GPU tensor, so
  // freed blocks are reused rather than returned to the driver), else the device's default.
  c10::Allocator* a = s->allocator();
  if (!a) a = t.device().is_cpu() ? c10::GetCPUAllocator() : c10::GetAllocator(t.device().type());
  TORCH_CHECK(a, "refill_storage: no allocator for device ", t.device());
  c10::DeviceGuard guard(t.device());  // the caching allocator allocates on the current device
  s->set_data_ptr_noswap(a->allocate(nbytes));
  s->set_nbytes(nbytes);
}

void point_storage(const at::Tensor& t, void* p, size_t nbytes) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(at::DataPtr(p, t.device()));  // no deleter: not ours to free
  s->set_nbytes(nbytes);
}

size_t storage_nbytes(const at::Tensor& t) { return t.storage().nbytes(); }

namespace {

struct GradReadyHook final : torch::autograd::FunctionPostHook {
  explicit GradReadyHook(std::function<void()> fn) : fn(std::move(fn)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    fn();
    return outputs;
  }
  std::function<void()> fn;
};

}  // namespace

GradReadyHookHandle add_grad_ready_hook(const at::Tensor& param, std::function<void()> on_ready) {
  // A c10::intrusive_ptr<Node> in LibTorch 2.15 (a std::shared_ptr in 1.x).
  using NodePtr = decltype(torch::autograd::impl::grad_accumulator(param));
  NodePtr acc = torch::autograd::impl::grad_accumulator(param);
  TORCH_CHECK(acc, "add_grad_ready_hook: the tensor is not a leaf that requires grad");
  acc->add_post_hook(std::make_unique<GradReadyHook>(std::move(on_ready)));
  return GradReadyHookHandle(new NodePtr(std::move(acc)), [](void* p) {
    auto* node = static_cast<NodePtr*>(p);
    (*node)->post_hooks().clear();
    delete node;
  });
}

void queue_backward_callback(std::function<void()> fn) {
  torch::autograd::Engine::get_default_engine().queue_callback(std::move(fn));
}

void visit_graph_leaves(const std::vector<at::Tensor>& outputs,
                        const std::function<void(const at::Tensor& leaf)>& visit) {
  std::vector<torch::autograd::Node*> stack;
  std::unordered_set<torch::autograd::Node*> seen;
  for (const auto& y : outputs) {
    if (y.defined() && y.grad_fn()) stack.push_back(y.grad_fn().get());
  }
  while (!stack.empty()) {
    torch::autograd::Node* n = stack.back();
    stack.pop_back();
    if (!seen.insert(n).second) continue;
    if (auto* acc = dynamic_cast<torch::autograd::AccumulateGrad*>(n)) visit(acc->variable);
    for (const auto& e : n->next_edges()) {
      if (e.function) stack.push_back(e.function.get());
    }
  }
}

namespace {

// Drops the checkpoint's own reference to the incoming gradient when the replayed graph's
// root node starts: by then the engine holds the gradient in that node's input buffer, so
// it is freed once the nodes that read it have run, not when the whole replayed backward
// ends. Registered only where the engine runs from a single root, which it starts from a
// copy of the gradient and never reads the caller's list again.
class ReleaseRootGradient : public torch::autograd::FunctionPreHook {
 public:
  explicit ReleaseRootGradient(std::shared_ptr<torch::autograd::variable_list> grads) : grads_(std::move(grads)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& inputs) override {
    grads_->clear();
    return inputs;
  }

 private:
  std::shared_ptr<torch::autograd::variable_list> grads_;
};

}  // namespace

std::vector<at::Tensor> backward_from_roots(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& grads,
                                            const std::vector<at::Tensor>& wrt) {
  torch::autograd::edge_list root_edges, wrt_edges;
  auto root_grads = std::make_shared<torch::autograd::variable_list>();
  for (size_t i = 0; i < outputs.size() && i < grads.size(); ++i) {
    if (grads[i].defined() && outputs[i].defined() && outputs[i].requires_grad()) {
      root_edges.push_back(torch::autograd::impl::gradient_edge(outputs[i]));
      root_grads->push_back(std::move(grads[i]));
    }
  }
  grads.clear();
  outputs.clear();
  if (root_edges.size() == 1) {
    root_edges.front().function->add_pre_hook(std::make_unique<ReleaseRootGradient>(root_grads));
  }
  wrt_edges.reserve(wrt.size());
  for (const at::Tensor& w : wrt) wrt_edges.push_back(torch::autograd::impl::gradient_edge(w));
  if (root_edges.empty() || wrt_edges.empty()) return {};
  return torch::autograd::Engine::get_default_engine().execute(
      root_edges, *root_grads, /*keep_graph=*/false, /*create_graph=*/false, /*accumulate_grad=*/false, wrt_edges);
}

uint16_t fp16_bits(float f) { return c10::detail::fp16_ieee_from_fp32_value(f); }

}  // namespace shardgan::detail
