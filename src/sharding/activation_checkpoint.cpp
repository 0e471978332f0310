// Activation checkpointing for one sharding unit (include/shardgan/sharding/activation_checkpoint.h):
// an autograd function whose forward runs the unit without a graph and keeps its inputs,
// and whose backward replays the forward with autograd on and differentiates it.
#include "shardgan/sharding/activation_checkpoint.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>

#include <torch/torch.h>

#include "sharding/torch_internals.h"
#include "sharding/unit_runtime.h"

namespace shardgan {
namespace {

thread_local int g_recomputing = 0;
thread_local bool g_segments_on = false;  // replaying a unit whose checkpoint_segments is on
std::atomic<int64_t> g_recomputes{0};

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using TensorList = std::vector<at::Tensor>;

// The default generator's state of `device`, under its lock.
at::Tensor rng_state(const c10::Device& device) {
  at::Generator gen = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lk(gen.mutex());
  return gen.get_state();
}

void set_rng_state(const c10::Device& device, const at::Tensor& state) {
  at::Generator gen = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lk(gen.mutex());
  gen.set_state(state);
}

// What the replay needs besides the saved inputs; owned by the autograd node (a capsule in
// its saved_data), so it goes when the graph goes.
struct Replay : torch::CustomClassHolder {
  detail::CheckpointedForward run;
  std::function<void()> before_replay;
  size_t n_inputs = 0;                 // the unit's input list, undefined entries included
  std::vector<size_t> defined_at;      // position in that list of each saved input
  std::vector<bool> input_requires_grad;
  std::vector<at::Tensor> params;      // trainable parameters (leaves), passed as inputs
  std::vector<at::Tensor> buffers;     // the module's buffers (the live tensors)
  std::vector<at::Tensor> buffers_at_forward;  // their values when the forward ran
  c10::Device device{c10::kCPU};
  at::Tensor cpu_rng, device_rng;      // generator states when the forward ran
  bool segments = false;               // checkpoint_segment() nests inside this replay
};

// Sets the buffers and generators to their values at the forward for its lifetime, and
// back to the values they had when it was made.
class ReplayState {
 public:
  explicit ReplayState(const Replay& r) : r_(r) {
    torch::NoGradGuard g;
    now_.reserve(r.buffers.size());
    for (size_t i = 0; i < r.buffers.size(); ++i) {
      now_.push_back(r.buffers[i].clone());
      r.buffers[i].copy_(r.buffers_at_forward[i]);
    }
    cpu_rng_ = rng_state(c10::kCPU);
    set_rng_state(c10::kCPU, r.cpu_rng);
    if (r.device_rng.defined()) {
      device_rng_ = rng_state(r.device);
      set_rng_state(r.device, r.device_rng);
    }
    ++g_recomputing;
  }
  ~ReplayState() {
    --g_recomputing;
    torch::NoGradGuard g;
    for (size_t i = 0; i < r_.buffers.size(); ++i) r_.buffers[i].copy_(now_[i]);
    set_rng_state(c10::kCPU, cpu_rng_);
    if (device_rng_.defined()) set_rng_state(r_.device, device_rng_);
  }
  ReplayState(const ReplayState&) = delete;
  ReplayState& operator=(const ReplayState&) = delete;

 private:
  const Replay& r_;
  std::vector<at::Tensor> now_;
  at::Tensor cpu_rng_, device_rng_;
};

// Sets g_segments_on for its lifetime (a replay), then puts the previous value back.
class SegmentsScope {
 public:
  explicit SegmentsScope(bool on) : before_(g_segments_on) { g_segments_on = on; }
  ~SegmentsScope() { g_segments_on = before_; }
  SegmentsScope(const SegmentsScope&) = delete;
  SegmentsScope& operator=(const SegmentsScope&) = delete;

 private:
  bool before_;
};

TensorList expand(const Replay& r, const variable_list& defined) {
  TensorList full(r.n_inputs);
  for (size_t i = 0; i < defined.size(); ++i) full[r.defined_at[i]] = defined[i];
  return full;
}

struct CheckpointFn : torch::autograd::Function<CheckpointFn> {
  // `inputs`: the unit's defined inputs; `params`: its trainable parameters, inputs only so
  // that the node has edges to their gradient accumulators (the forward reads them through
  // the module).
  static variable_list forward(AutogradContext* ctx, at::TensorList inputs, at::TensorList params,
                               c10::intrusive_ptr<Replay> replay) {
    (void)params;
    ctx->set_materialize_grads(false);
    ctx->save_for_backward(inputs.vec());
    ctx->saved_data["replay"] = c10::IValue::make_capsule(replay);
    return replay->run(expand(*replay, inputs.vec()));
  }

  // `grads` is the node's own list (a reference, not a copy): its entries are moved out, so
  // that the checkpoint does not hold the incoming gradient for the whole replay.
  static variable_list backward(AutogradContext* ctx, variable_list& grads) {
    // Grad mode is on inside a backward only when it builds a graph (create_graph=true):
    // the replayed graph below is differentiated without one, so second-order terms would
    // be silently missing.
    TORCH_CHECK(!at::GradMode::is_enabled(),
                "a checkpointed sharding unit has no double backward (create_graph=true, e.g. an R1 or "
                "gradient penalty); run that pass between ShardedModel::begin_higher_order() and "
                "end_higher_order(), where units are not checkpointed");
    auto replay = c10::static_intrusive_pointer_cast<Replay>(ctx->saved_data["replay"].toCapsule());
    const variable_list saved = ctx->get_saved_variables();
    replay->before_replay();  // gathers the unit if it was freed; throws if it is gone
    variable_list detached(saved.size());
    for (size_t i = 0; i < saved.size(); ++i) {
      detached[i] = saved[i].detach().requires_grad_(replay->input_requires_grad[i]);
    }
    TensorList outs;
    {
      ReplayState state(*replay);
      at::AutoGradMode on(true);
      SegmentsScope segments(replay->segments);
      outs = replay->run(expand(*replay, detached));
    }
    ++g_recomputes;
    // The engine runs from the replayed outputs' gradient edges, as torch::autograd::grad
    // does inside, but the output tensors are dropped first: their data is not needed to
    // differentiate them, so it goes before the backward runs unless a node saved it (tanh,
    // relu). That is one output-sized buffer less per checkpointed unit or segment at the
    // peak, with the same arithmetic. With a single root the incoming gradient goes as soon
    // as the root node starts (torch_internals.h).
    TensorList wrt;
    std::vector<size_t> slot;  // position of each wrt entry in the result
    for (size_t i = 0; i < detached.size(); ++i) {
      if (replay->input_requires_grad[i]) {
        wrt.push_back(detached[i]);
        slot.push_back(i);
      }
    }
    for (size_t j = 0; j < replay->params.size(); ++j) {
      wrt.push_back(replay->params[j]);
      slot.push_back(saved.size() + j);
    }
    variable_list result(saved.size() + replay->params.size() + 1);  // + the Replay argument
    const variable_list g = detail::backward_from_roots(outs, grads, wrt);
    for (size_t k = 0; k < g.size(); ++k) result[slot[k]] = g[k];
    return result;
  }
};

}  // namespace

bool recomputing_activations() { return g_recomputing > 0; }

int64_t activation_recomputes() { return g_recomputes.load(); }

namespace {

// The autograd node of a checkpointed unit or segment: `run` on `inputs`, saving only them.
std::vector<at::Tensor> apply_checkpoint(detail::CheckpointedForward run,
                                         const std::vector<torch::nn::Module*>& modules, const TensorList& inputs,
                                         std::vector<at::Tensor> params, std::function<void()> before_replay,
                                         bool segments) {
  auto replay = c10::make_intrusive<Replay>();
  replay->run = std::move(run);
  replay->before_replay = std::move(before_replay);
  replay->segments = segments;
  replay->n_inputs = inputs.size();
  replay->params = std::move(params);
  std::vector<at::Tensor> defined;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined()) continue;
    replay->defined_at.push_back(i);
    replay->input_requires_grad.push_back(inputs[i].requires_grad());
    defined.push_back(inputs[i]);
    if (inputs[i].device() != c10::Device(c10::kCPU)) replay->device = inputs[i].device();
  }
  if (!replay->params.empty() && replay->params.front().device() != c10::Device(c10::kCPU)) {
    replay->device = replay->params.front().device();
  }
  {
    torch::NoGradGuard g;
    for (torch::nn::Module* m : modules) {
      for (const auto& b : m->buffers(/*recurse=*/true)) {
        replay->buffers.push_back(b);
        replay->buffers_at_forward.push_back(b.clone());
      }
    }
  }
  replay->cpu_rng = rng_state(c10::kCPU);
  if (!replay->device.is_cpu()) replay->device_rng = rng_state(replay->device);
  return CheckpointFn::apply(at::TensorList(defined), at::TensorList(replay->params), replay);
}

}  // namespace

std::vector<at::Tensor> checkpoint_segment(std::initializer_list<torch::nn::Module*> scope,
                                           const std::function<TensorList(const TensorList&)>& fn,
                                           const TensorList& inputs) {
  // Outside a unit's replay (its forward, a run without segments, eval, the R1 pass), and
  // inside a segment's own replay, the part just runs.
  if (!g_segments_on || !at::GradMode::is_enabled()) return fn(inputs);
  std::vector<at::Tensor> params;
  for (torch::nn::Module* m : scope) {
    for (const auto& p : m->parameters(/*recurse=*/true)) {
      if (p.requires_grad()) params.push_back(p);
    }
  }
  const bool graph = !params.empty() || std::any_of(inputs.begin(), inputs.end(), [](const at::Tensor& t) {
                       return t.defined() && t.requires_grad();
                     });
  if (!graph) return fn(inputs);
  return apply_checkpoint(fn, std::vector<torch::nn::Module*>(scope), inputs, std::move(params), [] {},
                          /*segments=*/false);
}

namespace detail {

std::vector<at::Tensor> checkpointed_forward(CheckpointedForward run, torch::nn::Module& module,
                                             const TensorList& inputs, std::vector<at::Tensor> params,
                                             std::function<void()> before_replay, bool segments) {
  return apply_checkpoint(std::move(run), {&module}, inputs, std::move(params), std::move(before_replay),
                          segments);
}

}  // namespace detail
}  // namespace shardgan
