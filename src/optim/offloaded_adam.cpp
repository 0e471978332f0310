#include "shardgan/optim/offloaded_adam.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>
#include <stdexcept>

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "shardgan/device/host_copy.h"
#include "shardgan/offload/state_store.h"
#include "shardgan/optim/blockwise_quant.h"
#include "shardgan/sharding/sharded_model.h"
#include "optim/offload_array_io.h"

namespace shardgan {

using offload_io::read_array;
using offload_io::view;
using offload_io::write_array;

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

}  // namespace

int64_t OffloadArrays::bytes_per_element() const {
  int64_t b = 0;
  for (int64_t e : elem_bytes) b += e;
  return b;
}

OffloadArrays offload_arrays(const OffloadConfig& offload, bool stores_m, StateDtype state, int64_t master_bytes) {
  OffloadArrays a;
  const int64_t state_bytes = state == StateDtype::kFloat32 ? master_bytes : state_element_bytes(state);
  auto add = [&](int& index, int64_t bytes) {
    index = static_cast<int>(a.elem_bytes.size());
    a.elem_bytes.push_back(bytes);
  };
  if (offload.param != OffloadDevice::kNone) add(a.param, master_bytes);
  if (stores_m) add(a.m, state_bytes);
  add(a.v, state_bytes);
  if (offload.gradient != OffloadDevice::kNone) {
    add(a.grad, offload.gradient_dtype == OffloadGradDtype::kBFloat16 ? 2 : master_bytes);
  }
  return a;
}

OffloadedAdam::OffloadedAdam(ShardedModel& model, AdamConfig cfg, const OffloadConfig& offload)
    : ShardedOptimizer(model, cfg.lr), cfg_(cfg) {
  dtype_ = model.units().empty() ? at::kFloat : model.units()[0]->shard().scalar_type();
  std::vector<int64_t> numel;
  for (auto& u : model.units()) numel.push_back(u->shard_numel());
  init(offload, std::move(numel));
  // Each unit's shard is written to the store and freed before the next one.
  for (auto& u : model.units()) adopt_unit(*u);
}

OffloadedAdam::OffloadedAdam(ShardedModel& model, AdamConfig cfg, const OffloadConfig& offload,
                             std::vector<int64_t> unit_shard_numels, at::ScalarType dtype)
    : ShardedOptimizer(model, cfg.lr), cfg_(cfg) {
  if (!model.units().empty()) throw std::invalid_argument("OffloadedAdam: a streamed build starts from a model with no units");
  dtype_ = dtype;
  init(offload, std::move(unit_shard_numels));
}

void OffloadedAdam::adopt_unit(ShardedUnit& u) {
  const size_t i = u.index();
  if (i >= store_->unit_count() || store_->unit_numel(i) != u.shard_numel()) {
    throw std::invalid_argument("OffloadedAdam: unit '" + u.name() + "' (index " + std::to_string(i) + ", " +
                                std::to_string(u.shard_numel()) + " shard elements) does not match the store made for " +
                                std::to_string(store_->unit_count()) + " units");
  }
  const at::Tensor& s = u.shard();
  // Shards on a GPU are staged through the store's (pinned) host buffers: the gradient
  // goes down, the updated parameters come back (ZeRO-Offload).
  if ((s.scalar_type() != at::kFloat && s.scalar_type() != at::kDouble) || s.scalar_type() != dtype_) {
    throw std::invalid_argument("optimizer offload needs float32 or float64 shards of one dtype; unit '" +
                                u.name() + "' has " + std::string(c10::toString(s.scalar_type())) + " on " +
                                s.device().str());
  }
  if (reduced()) {
    // The unit's StateLayout, with each reduced run's store offset at its shard position:
    // the store's arrays are shard-shaped. Its absmax and float32 runs stay here.
    if (cfg_.state.dtype == StateDtype::kInt8 && model_.config().flat_align != cfg_.state.block) {
      throw std::invalid_argument("Adam state_dtype int8 with blocks of " + std::to_string(cfg_.state.block) +
                                  " needs the model's flat parameters aligned to the block (ShardingConfig::"
                                  "flat_align " + std::to_string(model_.config().flat_align) + "); unit '" +
                                  u.name() + "'");
    }
    std::vector<StateParam> params;
    for (const auto& sl : u.slots()) params.push_back({u.name() + "." + sl.name, sl.offset, sl.numel});
    StateLayout l = make_state_layout(params, u.padded_numel(), u.shard_offset(), u.shard_numel(), cfg_.state);
    for (StateRun& r : l.runs) {
      if (r.reduced) r.store_offset = r.begin;
    }
    l.reduced_numel = u.shard_numel();
    const auto f32 = torch::TensorOptions().dtype(at::kFloat);
    const bool int8 = cfg_.state.dtype == StateDtype::kInt8;
    auto resident = [&](bool stored) {
      if (!stored) return ReducedState{};
      return ReducedState{torch::zeros({l.float32_numel}, f32), at::Tensor(),
                          int8 ? torch::zeros({l.blocks}, f32) : at::Tensor()};
    };
    m_res_.at(i) = resident(moments_ == 2);
    v_res_.at(i) = resident(true);
    layouts_.at(i) = std::move(l);
  }
  if (params_offloaded()) u.offload_shard(this);
  if (grads_offloaded()) u.offload_grad(this);
}

void OffloadedAdam::init(const OffloadConfig& offload, std::vector<int64_t> numel) {
  ShardedModel& model = model_;
  validate_adam_config(cfg_);
  if (offload.optimizer == OffloadDevice::kNone) throw std::invalid_argument("OffloadedAdam: offload.optimizer is none");
  if (cfg_.param_copy != ParamCopy::kNone) throw std::invalid_argument("OffloadedAdam: param_copy is not supported");
  validate_state_policy(cfg_.state);
  moments_ = adam_stores_m(cfg_.beta1, /*device_is_cpu=*/true) ? 2 : 1;  // the step runs on the CPU
  if (offload.param != OffloadDevice::kNone) {
    if (offload.param != offload.optimizer) {
      throw std::invalid_argument(std::string("parameter offload to ") + to_string(offload.param) +
                                  " needs the optimizer state on the same device (offload.optimizer " +
                                  to_string(offload.optimizer) + "): the master shard and its moments share one store");
    }
    if (model.config().stage != 3) {
      throw std::invalid_argument("parameter offload needs ZeRO stage 3 (" + model.name() + " is at stage " +
                                  std::to_string(model.config().stage) + ")");
    }
  }
  if (offload.gradient != OffloadDevice::kNone) {
    if (offload.gradient != offload.optimizer) {
      throw std::invalid_argument(std::string("gradient offload to ") + to_string(offload.gradient) +
                                  " needs the optimizer state on the same device (offload.optimizer " +
                                  to_string(offload.optimizer) + "): the step reads the gradient beside the moments");
    }
    if (model.config().stage < 2) {
      throw std::invalid_argument("gradient offload needs ZeRO stage 2 or 3 (" + model.name() + " is at stage " +
                                  std::to_string(model.config().stage) + ")");
    }
  } else if (offload.gradient_dtype != OffloadGradDtype::kMaster) {
    throw std::invalid_argument("offload gradient_dtype bfloat16 needs gradient offload (" + model.name() + ")");
  }
  if ((reduced() || offload.gradient_dtype == OffloadGradDtype::kBFloat16) && dtype_ != at::kFloat) {
    throw std::invalid_argument(std::string("Adam state_dtype ") + to_string(cfg_.state.dtype) + " and gradient_dtype " +
                                to_string(offload.gradient_dtype) + " need float32 shards; " + model.name() + " has " +
                                std::string(c10::toString(dtype_)));
  }
  arrays_ = offload_arrays(offload, moments_ == 2, cfg_.state.dtype, static_cast<int64_t>(c10::elementSize(dtype_)));
  param_array_ = arrays_.param;
  moment_array_ = moments_ == 2 ? arrays_.m : arrays_.v;
  grad_array_ = arrays_.grad;
  state_dtype_ = cfg_.state.dtype == StateDtype::kInt8 ? at::kByte
                 : cfg_.state.dtype == StateDtype::kBFloat16 ? at::kBFloat16 : dtype_;
  grad_dtype_ = offload.gradient_dtype == OffloadGradDtype::kBFloat16 ? at::kBFloat16 : dtype_;
  if (reduced()) {
    layouts_.resize(numel.size());
    m_res_.resize(numel.size());
    v_res_.resize(numel.size());
  }
  // Under HSDP ranks of different replica groups share a shard index: the group tells them apart.
  const Communicator& c = model.comm();
  const std::string stem = model.name() + ".rank" + std::to_string(c.rank()) +
                           (c.replicate_degree() > 1 ? ".replica" + std::to_string(c.replica_rank()) : "");
  // Arrays: exp_avg, exp_avg_sq (after the master shard with parameter offload, before the
  // gradient with gradient offload). Staging slices: the gradient and the parameters,
  // each unless it is an array of the store.
  // A bfloat16 gradient array gets one more staging slice, where each chunk is widened.
  // 8-bit states: chunks start on block boundaries.
  const bool params = params_offloaded(), grads = grads_offloaded();
  const int64_t esize = static_cast<int64_t>(c10::elementSize(dtype_));
  std::vector<int64_t> scratch;
  auto stage = [&](int& index) {
    index = static_cast<int>(scratch.size());
    scratch.push_back(esize);
  };
  grad_scratch_ = param_scratch_ = grad32_scratch_ = -1;
  if (!grads) stage(grad_scratch_);
  if (!params) stage(param_scratch_);
  if (grads && grad_dtype_ != dtype_) stage(grad32_scratch_);
  const int64_t state_block = cfg_.state.dtype == StateDtype::kInt8 ? cfg_.state.block : 1;
  store_ = std::make_unique<OffloadStore>(offload.optimizer, offload, stem, std::move(numel), arrays_.elem_bytes,
                                          scratch, state_block);
  if (offload.optimizer == OffloadDevice::kDisk) {
    if (!store_->direct()) {
      spdlog::warn("offload: '{}' refuses O_DIRECT; {} optimizer state uses buffered I/O (page cache) instead, "
                   "so its RAM is not bounded by offload.buffer_bytes. Use a local disk (ext4, xfs) for offload.path",
                   store_->path(), model.name());
    }
    spdlog::info("offload: {} optimizer state{}{} on disk, {} ({:.3f} GiB, O_DIRECT {}), ring {} x {} bytes",
                 model.name(), params ? ", master parameters" : "", grads ? ", gradients" : "", store_->path(), store_->disk_bytes() / 1073741824.0, store_->direct() ? "on" : "off",
                 offload.buffer_count, offload.buffer_bytes);
  }
  overlap_ = offload.overlap_copies;
  block_numel_ = std::max<int64_t>(1, offload.copy_block_bytes / esize);
  block_numel_ = std::max(state_block, block_numel_ / state_block * state_block);
  if (cfg_.state.dtype == StateDtype::kInt8) clear_reduced_arrays();
}

void OffloadedAdam::clear_reduced_arrays() {
  // The store starts as zero bytes; 8-bit states start at the map's zero code, as ShardedAdam's.
  const uint8_t zm = zero_code(CodeMap::kSigned), zv = zero_code(CodeMap::kUnsigned);
  std::vector<size_t> all(store_->unit_count());
  std::iota(all.begin(), all.end(), size_t{0});
  const uint32_t mask = (moments_ == 2 ? 1u << arrays_.m : 0u) | 1u << arrays_.v;
  store_->stream(all, OffloadStore::Mode::kWrite, [&](const OffloadStore::Chunk& c) {
    if (moments_ == 2) std::memset(c.data[arrays_.m], zm, static_cast<size_t>(c.numel));
    std::memset(c.data[arrays_.v], zv, static_cast<size_t>(c.numel));
  }, mask);
}

void OffloadedAdam::accumulate_grad(size_t unit, const at::Tensor& reduced, double scale, bool first) {
  if (!grads_offloaded()) throw std::logic_error("OffloadedAdam: gradients of " + model_.name() + " are not offloaded");
  const uint32_t mask = 1u << grad_array_;
  // first: nothing to read. The shard is zeroed and the reduction added, as into a
  // resident shard allocated as zeros (the same bits: a -0 comes out +0). A bfloat16
  // array: the sum in float32, rounded to nearest even.
  store_->stream({unit}, first ? OffloadStore::Mode::kWrite : OffloadStore::Mode::kUpdate,
                 [&](const OffloadStore::Chunk& c) {
                   at::Tensor g = view(c.data[grad_array_], c.numel, grad_dtype_);
                   at::Tensor r = reduced.narrow(0, c.offset, c.numel).to(at::kCPU, dtype_);
                   if (grad_dtype_ == dtype_) {
                     if (first) g.zero_();
                     g.add_(r, scale);
                     return;
                   }
                   at::Tensor sum = first ? torch::zeros_like(r) : g.to(dtype_);
                   sum.add_(r, scale);
                   g.copy_(sum);
                 }, mask);
}

void OffloadedAdam::read_grad(size_t unit, at::Tensor& dst) {
  if (!grads_offloaded()) throw std::logic_error("OffloadedAdam: gradients of " + model_.name() + " are not offloaded");
  read_array(*store_, unit, grad_array_, grad_dtype_, dst);
}

void OffloadedAdam::write_grad(size_t unit, const at::Tensor& src) {
  if (!grads_offloaded()) throw std::logic_error("OffloadedAdam: gradients of " + model_.name() + " are not offloaded");
  write_array(*store_, unit, grad_array_, grad_dtype_, src);
}

void OffloadedAdam::read_shard(size_t unit, at::Tensor& dst) {
  if (!params_offloaded()) throw std::logic_error("OffloadedAdam: parameters of " + model_.name() + " are not offloaded");
  read_array(*store_, unit, param_array_, dtype_, dst);
}

void OffloadedAdam::write_shard(size_t unit, const at::Tensor& src) {
  if (!params_offloaded()) throw std::logic_error("OffloadedAdam: parameters of " + model_.name() + " are not offloaded");
  write_array(*store_, unit, param_array_, dtype_, src);
}

OffloadedAdam::~OffloadedAdam() = default;

void OffloadedAdam::adam_block(at::Tensor& p, const at::Tensor& g, at::Tensor& m, at::Tensor& v,
                               const AdamCoefficients& c) {
  if (dtype_ == at::kFloat) {
    fused_adam_step(p.data_ptr<float>(), g.data_ptr<float>(), m.defined() ? m.data_ptr<float>() : nullptr,
                    v.data_ptr<float>(), p.numel(), c);
  } else {
    at::Tensor mm = m.defined() ? m : torch::zeros_like(p);  // m not stored: zero, overwritten by g
    adam_torch_step(p, g, mm, v, cfg_, lr_, step_);  // ShardedAdam's float64 path
  }
}

void OffloadedAdam::step_runs(size_t unit, int64_t lo, int64_t n, float* p, const float* g, void* m, void* v,
                              const AdamCoefficients& c) {
  const int64_t B = cfg_.state.block;
  const bool int8 = cfg_.state.dtype == StateDtype::kInt8;
  ReducedState& mr = m_res_[unit];
  ReducedState& vr = v_res_[unit];
  for (const StateRun& r : layouts_[unit].runs) {
    const int64_t a = std::max(lo, r.begin), b = std::min(lo + n, r.begin + r.numel);
    if (a >= b) continue;
    float* pa = p + (a - lo);
    const float* ga = g + (a - lo);
    const int64_t in_run = a - r.begin;
    if (!r.reduced) {
      float* m32 = mr.f32.defined() ? mr.f32.data_ptr<float>() + r.store_offset + in_run : nullptr;
      fused_adam_step(pa, ga, m32, vr.f32.data_ptr<float>() + r.store_offset + in_run, b - a, c, ParamCopy::kNone,
                      nullptr, isa_);
    } else if (!int8) {
      uint16_t* mb = m ? static_cast<uint16_t*>(m) + (a - lo) : nullptr;
      fused_adam_bf16_step(pa, ga, mb, static_cast<uint16_t*>(v) + (a - lo), b - a, c, ParamCopy::kNone, nullptr, isa_);
    } else {
      if (in_run % B != 0) {
        throw std::logic_error("OffloadedAdam: a chunk of unit " + std::to_string(unit) + " starts inside an 8-bit block");
      }
      const int64_t blk = r.block_offset + in_run / B;
      QuantizedState mq, vq;
      if (m) mq = {static_cast<uint8_t*>(m) + (a - lo), mr.absmax.data_ptr<float>() + blk};
      vq = {static_cast<uint8_t*>(v) + (a - lo), vr.absmax.data_ptr<float>() + blk};
      nonfinite_blocks_ += fused_adam8_step(pa, ga, mq, vq, b - a, B, c, ParamCopy::kNone, nullptr, isa_);
    }
  }
}

void OffloadedAdam::update() {
  torch::NoGradGuard no_grad;
  model_.drain_grad_writes();  // gradient offload: every reduced shard is in the tier
  auto& units = model_.units();
  // On a GPU the host may be ahead of the device: wait for the work that wrote the
  // gradients first, so that the copy time below is the copies' alone.
  if (!units.empty()) {
    DeviceEvent ready(units[0]->device());
    ready.record();
    ready.wait();
  }
  const auto t_start = Clock::now();
  const AdamCoefficients c = adam_coefficients(lr_, cfg_.beta1, cfg_.beta2, cfg_.eps, cfg_.weight_decay,
                                               cfg_.decoupled_weight_decay, step_);
  compute_s_ = store_->device() == OffloadDevice::kCpu ? update_in_memory(c) : update_streamed(c);
  io_s_ = since(t_start) - compute_s_;
  io_total_s_ += io_s_;
}

// The cpu tier. The moments (and, with parameter offload, the master shard) are host
// arrays, so only the gradient (and the parameters) go through the staging ring, and one
// pipeline of blocks runs across every chunk and unit boundary: the copies in of the next
// `ahead` blocks are queued before block b is stepped, and block b's parameters go back
// without a wait (ZeRO-Offload, Ren et al. 2021, Sec. 4.2: the CPU step overlapped with
// the transfers). The ring's staging slices are cut into `slots` blocks; a slot is
// refilled only after the parameters it sent back have arrived (its `out` event).
// With the overlap the copies down and up run on two copy streams of their own, so that
// on a GPU they use its two copy engines at once. They need no order against the default
// stream: update() waited for its work first, and drain() waits for every copy up before
// the parameters are used. On the CPU the copies are synchronous and the events no-ops
// that count.
double OffloadedAdam::update_in_memory(const AdamCoefficients& c) {
  auto& units = model_.units();
  const bool params = params_offloaded();
  const int64_t esize = static_cast<int64_t>(c10::elementSize(dtype_));
  // Blocks of whole 4096-byte pages and, with 8-bit states, whole state blocks.
  const int64_t align = std::lcm(std::max<int64_t>(1, 4096 / esize),
                                 cfg_.state.dtype == StateDtype::kInt8 ? cfg_.state.block : int64_t{1});
  const int64_t slice = store_->chunk_numel();
  // Gradient offload: a unit that nothing was reduced into since the last step holds
  // stale values in its array; its gradient is zero, as a released resident shard's.
  if (grads_offloaded()) {
    for (auto& u : units) {
      if (!u->grad_in_tier()) view(store_->host_array(u->index(), grad_array_), u->shard_numel(), grad_dtype_).zero_();
    }
  }
  // With the overlap, at least two slots, each a whole number of 4096-byte blocks.
  int64_t block = slice;
  if (overlap_) block = std::min({block_numel_, slice, std::max(align, slice / 2 / align * align)});
  block = std::max(align, block / align * align);
  const int64_t slots = std::max<int64_t>(1, slice / block);
  const int64_t ahead = slots >= 3 ? slots - 2 : slots - 1;
  struct Block {
    size_t unit;
    int64_t offset, numel;
  };
  std::vector<Block> blocks;
  for (size_t u = 0; u < units.size(); ++u) {
    const int64_t n = units[u]->shard_numel();
    for (int64_t o = 0; o < n; o += block) blocks.push_back({u, o, std::min(block, n - o)});
  }
  if (blocks.empty()) return 0;
  const c10::Device dev = units[0]->device();
  std::vector<std::unique_ptr<DeviceEvent>> in, out;
  std::vector<char> out_pending(slots, 0);
  for (int64_t s = 0; s < slots; ++s) {
    in.push_back(std::make_unique<DeviceEvent>(dev));
    out.push_back(std::make_unique<DeviceEvent>(dev));
  }
  auto drain = [&] {
    for (int64_t s = 0; s < slots; ++s) {
      if (out_pending[s]) out[s]->wait();
      out_pending[s] = 0;
    }
  };
  auto at = [&](void* base, int64_t offset, int64_t n, at::ScalarType dt) {
    return view(static_cast<char*>(base) + offset * static_cast<int64_t>(c10::elementSize(dt)), n, dt);
  };
  auto staged = [&](int s, size_t b) {
    return at(store_->staging(s), static_cast<int64_t>(b % slots) * block, blocks[b].numel, dtype_);
  };
  const bool grads = grads_offloaded();
  CopyStream down(dev), up(dev);
  auto copy = [&](CopyStream& stream, const at::Tensor& dst, const at::Tensor& src) {
    if (overlap_) {
      stream.copy(dst, src);
    } else {
      dst.copy_(src);  // synchronous
    }
  };
  auto mark = [&](CopyStream& stream, DeviceEvent& ev) {
    if (overlap_) {
      stream.record(ev);
    } else {
      ev.record();
    }
  };
  auto stage_in = [&](size_t b) {
    const Block& k = blocks[b];
    const size_t slot = b % slots;
    if (out_pending[slot]) out[slot]->wait();  // its last parameters have gone back
    out_pending[slot] = 0;
    ShardedUnit& u = *units[k.unit];
    if (!params) copy(down, staged(param_scratch_, b), u.shard().narrow(0, k.offset, k.numel));
    if (!grads) copy(down, staged(grad_scratch_, b), u.grad_shard().narrow(0, k.offset, k.numel));
    mark(down, *in[slot]);
  };
  double compute = 0;
  size_t next = 0;
  try {
    for (size_t b = 0; b < blocks.size(); ++b) {
      for (; next < blocks.size() && next <= b + static_cast<size_t>(ahead); ++next) stage_in(next);
      const Block& k = blocks[b];
      const size_t slot = b % slots;
      in[slot]->wait();
      at::Tensor p = params ? at(store_->host_array(k.unit, param_array_), k.offset, k.numel, dtype_)
                            : staged(param_scratch_, b);
      at::Tensor g = grads ? at(store_->host_array(k.unit, grad_array_), k.offset, k.numel, grad_dtype_)
                           : staged(grad_scratch_, b);
      if (grad32_scratch_ >= 0) g = staged(grad32_scratch_, b).copy_(g);  // bfloat16 widened (exact)
      at::Tensor m = moments_ == 2 ? at(store_->host_array(k.unit, moment_array_), k.offset, k.numel, state_dtype_)
                                   : at::Tensor();
      at::Tensor v = at(store_->host_array(k.unit, v_array()), k.offset, k.numel, state_dtype_);
      const auto t0 = Clock::now();
      if (reduced()) {
        step_runs(k.unit, k.offset, k.numel, p.data_ptr<float>(), g.data_ptr<float>(), m.defined() ? m.data_ptr() : nullptr,
                  v.data_ptr(), c);
      } else {
        adam_block(p, g, m, v, c);
      }
      compute += since(t0);
      if (!params) {  // stage out (host-to-device in a CUDA build)
        copy(up, units[k.unit]->shard().narrow(0, k.offset, k.numel), p);
        mark(up, *out[slot]);
        out_pending[slot] = 1;
      }
    }
    drain();
  } catch (...) {
    // No copy may still be writing the staging ring after we return.
    try {
      for (size_t b = 0; b < next; ++b) in[b % slots]->wait();
      drain();
    } catch (...) {
    }
    throw;
  }
  return compute;
}

// The disk tier: the store streams chunks through its ring (reads ahead, writes behind).
// Within a chunk, block i's copies in (device-to-host in a CUDA build) are enqueued one
// block ahead and waited for on in[i % 2]; its parameters go back without a wait, and the
// chunk's last event covers them all before the store reuses the chunk's buffers. Copies
// with non_blocking run in the device's queue order, so block i+1's gradient is read after
// the backward that wrote it; on the CPU they are synchronous and the events no-ops.
double OffloadedAdam::update_streamed(const AdamCoefficients& c) {
  auto& units = model_.units();
  double compute = 0;
  std::vector<size_t> all(units.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  const bool params = params_offloaded(), grads = grads_offloaded();
  // With gradient offload the gradient is read beside the moments and not written back.
  const uint32_t written = grads ? ~(1u << grad_array_) : OffloadStore::kAllArrays;
  store_->stream(all, OffloadStore::Mode::kUpdate, [&](const OffloadStore::Chunk& ch) {
    if (ch.numel == 0) return;
    ShardedUnit& u = *units[ch.unit];
    // With parameter offload the master chunk is an array of the store, updated in the
    // ring and written back with the moments; otherwise it is staged from the unit.
    at::Tensor p_dev = params ? at::Tensor() : u.shard().narrow(0, ch.offset, ch.numel);
    at::Tensor g_dev = grads ? at::Tensor() : u.grad_shard().narrow(0, ch.offset, ch.numel);
    at::Tensor p = params ? view(ch.data[param_array_], ch.numel, dtype_) : view(ch.scratch[param_scratch_], ch.numel, dtype_);
    at::Tensor g = grads ? view(ch.data[grad_array_], ch.numel, grad_dtype_) : view(ch.scratch[grad_scratch_], ch.numel, dtype_);
    if (grad32_scratch_ >= 0) g = view(ch.scratch[grad32_scratch_], ch.numel, dtype_).copy_(g);  // bfloat16 widened (exact)
    if (grads && !u.grad_in_tier()) g.zero_();  // nothing reduced since the last step: stale values
    at::Tensor m = moments_ == 2 ? view(ch.data[moment_array_], ch.numel, state_dtype_) : at::Tensor();
    at::Tensor v = view(ch.data[v_array()], ch.numel, state_dtype_);
    const int64_t block = overlap_ ? block_numel_ : ch.numel;
    const int64_t blocks = (ch.numel + block - 1) / block;
    auto part = [&](const at::Tensor& t, int64_t i) { return t.narrow(0, i * block, std::min(block, ch.numel - i * block)); };
    const c10::Device dev = u.device();
    DeviceEvent in0(dev), in1(dev), out(dev);
    DeviceEvent* in[2] = {&in0, &in1};
    auto stage_in = [&](int64_t i) {
      if (!params) part(p, i).copy_(part(p_dev, i), overlap_);
      if (!grads) part(g, i).copy_(part(g_dev, i), overlap_);
      in[i % 2]->record();
    };
    stage_in(0);
    for (int64_t i = 0; i < blocks; ++i) {
      if (i + 1 < blocks) stage_in(i + 1);
      in[i % 2]->wait();
      at::Tensor pi = part(p, i), gi = part(g, i), mi = m.defined() ? part(m, i) : at::Tensor(), vi = part(v, i);
      const auto t0 = Clock::now();
      if (reduced()) {
        step_runs(ch.unit, ch.offset + i * block, pi.numel(), pi.data_ptr<float>(), gi.data_ptr<float>(),
                  mi.defined() ? mi.data_ptr() : nullptr, vi.data_ptr(), c);
      } else {
        adam_block(pi, gi, mi, vi, c);
      }
      compute += since(t0);
      if (!params) part(p_dev, i).copy_(pi, overlap_);  // stage out (host-to-device in a CUDA build)
    }
    out.record();
    out.wait();
  }, OffloadStore::kAllArrays, written);
  return compute;
}

}  // namespace shardgan
