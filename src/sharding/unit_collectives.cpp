// A sharding unit's collectives (unit_collectives.h; FSDP2's FSDPParamGroup): all-gather
// with prefetch, gradient staging, reduce-scatter or all-reduce, and the all-gather after an
// optimizer step. Contracts: ShardedUnit's methods of the same names (sharded_unit.h).
#include "sharding/unit_collectives.h"

#include <algorithm>
#include <mutex>

#include <torch/torch.h>

#include "shardgan/comm/node_shared.h"
#include "shardgan/comm/quantized_collectives.h"
#include "shardgan/sharding/flat_param.h"
#include "shardgan/sharding/grad_sink.h"
#include "shardgan/sharding/sharded_model.h"
#include "shardgan/sharding/sharded_unit.h"
#include "shardgan/util/test_control.h"
#include "sharding/torch_internals.h"
#include "sharding/unit_runtime.h"

namespace shardgan::detail {
namespace {
// The node-shared all-gather in flight: this rank's block is published; wait() returns once
// every rank's block of the same gather is.
class SharedGatherWork final : public Work {
 public:
  SharedGatherWork(const NodeSharedPool& pool, int64_t seq, Communicator& comm)
      : pool_(pool), seq_(seq), comm_(comm) {}
  void wait() override {
    pool_.wait_published(seq_, comm_.timeout_s(), [this] { comm_.poll(); });
  }

 private:
  const NodeSharedPool& pool_;
  int64_t seq_;
  Communicator& comm_;
};
}  // namespace

std::unique_ptr<Work> UnitCollectives::start_quantized_gather() {
  const QuantSpec q{cfg_.quantized_weights_bits, cfg_.quantization_block};
  const int64_t pb = quantized_bytes(flat_.shard_numel(), q);
  const at::Tensor master = read_master();
  peak_comm_bytes_ = std::max(peak_comm_bytes_, pb * (1 + comm_.world_size()));
  Timed t(collective_sink());
  return quantized_all_gather_async(comm_, flat_.full(), master.contiguous(), q);
}

UnitCollectives::UnitCollectives(ShardedUnit& unit, FlatParam& flat, Communicator& comm,
                                 const ShardingConfig& cfg, ShardedModel* owner)
    : unit_(unit), flat_(flat), comm_(comm), cfg_(cfg), owner_(owner) {
  reduce_dtype_ = cfg_.reduce_dtype.value_or(flat_.master_dtype());
  const int64_t S = flat_.shard_numel(), P = flat_.padded_numel();
  if (cfg_.stage <= 1) {
    grad_flat_ = torch::zeros({P}, torch::TensorOptions().dtype(reduce_dtype_).device(flat_.device()));
    grad_shard_aliases_flat_ = reduce_dtype_ == flat_.master_dtype();
  }
  // A gradient shard of its own is not allocated until the first gradient arrives (a built
  // model holds its shards only; see grad_shard()).
  if (grad_shard_aliases_flat_) grad_shard_ = grad_flat_.narrow(0, flat_.shard_offset(), S);
  gathered_ = cfg_.stage <= 2;
}

UnitCollectives::~UnitCollectives() {
  if (shared_seq_ != 0 && gathered_) flat_.release_full();
}

double* UnitCollectives::collective_sink() { return owner_ ? &owner_->comm_times().collective_s : nullptr; }

at::Tensor UnitCollectives::read_master() {
  Timed t(flat_.offloaded() && owner_ ? &owner_->comm_times().offload_read_s : nullptr);
  // With an owner, an offloaded shard comes through it: from the read-ahead started one
  // unit earlier, or read now with the tier serialized against the worker.
  return flat_.offloaded() && owner_ ? owner_->read_master_shard(unit_) : flat_.master_shard();
}

at::Tensor UnitCollectives::fill_own_block() {
  const at::Tensor master = read_master();
  // Converted straight into this rank's block of the flat parameter: the all-gather then
  // runs in place, with no send buffer to allocate and no copy of it inside the backend.
  at::Tensor own = flat_.full().narrow(0, flat_.shard_offset(), flat_.shard_numel());
  own.copy_(master);
  return own;
}

int64_t UnitCollectives::persistent_grad_bytes() const { return nbytes(grad_flat_) + released_grad_bytes(); }

int64_t UnitCollectives::released_grad_bytes() const {
  // Counted while released too: it is the shard's size at the model's update.
  if (grad_shard_aliases_flat_ || grad_sink_) return 0;
  return flat_.shard_numel() * static_cast<int64_t>(c10::elementSize(flat_.master_dtype()));
}

void UnitCollectives::set_grad_sink(GradSink* sink) {
  grad_sink_ = sink;
  grad_in_tier_ = false;
  grad_shard_ = at::Tensor();
}

void UnitCollectives::with_offloaded_grad(const std::function<void(at::Tensor&)>& fn, bool write) {
  if (owner_) owner_->drain_grad_writes();
  at::Tensor g = torch::zeros({flat_.shard_numel()}, torch::TensorOptions().dtype(flat_.master_dtype()));
  // The tier's lock around each access (the read-ahead worker shares the store), not
  // around fn, which may run a collective.
  auto on_tier = [&](const std::function<void()>& io) {
    Timed t(owner_ ? &owner_->comm_times().offload_grad_s : nullptr);
    std::unique_lock<std::mutex> lk;
    if (owner_) lk = std::unique_lock<std::mutex>(owner_->tier_mutex());
    io();
  };
  if (grad_in_tier_) on_tier([&] { grad_sink_->read_grad(unit_.index(), g); });
  fn(g);
  if (!write) return;
  on_tier([&] { grad_sink_->write_grad(unit_.index(), g); });
  grad_in_tier_ = true;
}

at::Tensor& UnitCollectives::grad_shard() {
  if (!grad_shard_.defined()) {
    // Zeros, so that a reduction is added as into a kept shard: the same bits (a -0 comes
    // out +0). Not at::add with a 0-dim zero instead: that broadcast path made the 1e9
    // BigGAN's step 20-35% slower on the CPU (38-44 s against 28-34 s).
    grad_shard_ = torch::zeros({flat_.shard_numel()},
                               torch::TensorOptions().dtype(flat_.master_dtype()).device(flat_.device()));
  }
  return grad_shard_;
}

std::unique_ptr<Work> UnitCollectives::start_shared_gather() {
  NodeSharedPool* pool = cfg_.node_shared_gather && owner_ ? owner_->shared_pool() : nullptr;
  if (!pool || flat_.padded_numel() == 0) return nullptr;
  const int64_t seq = owner_->next_shared_seq();
  // Symmetric on every rank: gathers and releases run in the same program order.
  if (pool->held_here(seq)) {
    owner_->count_shared_fallback();
    return nullptr;
  }
  owner_->take_shared_seq();
  {
    Timed t(collective_sink());
    pool->wait_free(seq, comm_.timeout_s(), [this] { comm_.poll(); });
  }
  flat_.attach_full(pool->data(pool->slot_of(seq)));
  fill_own_block();
  pool->publish(seq);
  shared_seq_ = seq;
  return std::make_unique<SharedGatherWork>(*pool, seq, comm_);
}

Communicator* UnitCollectives::secondary_group() const {
  return cfg_.stage == 3 && owner_ ? owner_->secondary_group() : nullptr;
}

int64_t UnitCollectives::secondary_bytes() const { return nbytes(secondary_); }

void UnitCollectives::drop_secondary() {
  secondary_ = at::Tensor();
  keep_secondary_ = false;
}

std::unique_ptr<Work> UnitCollectives::start_secondary_gather() {
  Communicator* g = secondary_group();
  if (!g || !secondary_.defined()) return nullptr;
  torch::NoGradGuard no_grad;
  flat_.allocate_full();
  // In place, like the world gather: the kept block goes where the group's all-gather
  // expects this rank's block, so nothing is allocated beyond the flat parameter.
  at::Tensor own = flat_.full().narrow(0, g->rank() * secondary_.numel(), secondary_.numel());
  own.copy_(secondary_);
  gather_.send = own;
  Timed t(collective_sink());
  return g->all_gather_async(flat_.full(), own);
}

void UnitCollectives::keep_secondary() {
  Communicator* g = secondary_group();
  if (!g || secondary_.defined() || flat_.padded_numel() == 0) return;
  torch::NoGradGuard no_grad;
  // P is N * S and K divides N, so the K blocks tile the flat parameter exactly.
  const int64_t b = flat_.padded_numel() / g->world_size();
  secondary_ = flat_.full().narrow(0, g->rank() * b, b).clone();
}

void UnitCollectives::mark_gathered() {
  gathered_ = true;
  if (owner_) owner_->on_unit_gathered();
}

void UnitCollectives::prefetch() {
  if (cfg_.stage != 3 || gathered_) return;
  if ((gather_.work = start_shared_gather())) {
    mark_gathered();
    return;
  }
  if ((gather_.work = start_secondary_gather())) {
    mark_gathered();
    return;
  }
  flat_.allocate_full();
  keep_secondary_ = secondary_group() != nullptr;  // gather() keeps the block once this completes
  if (cfg_.quantized_weights_bits != 0) {
    gather_.work = start_quantized_gather();
    mark_gathered();
    return;
  }
  gather_.send = fill_own_block();  // with parameter offload, read from the tier here
  {
    Timed t(collective_sink());
    gather_.work = comm_.all_gather_async(flat_.full(), gather_.send);
  }
  mark_gathered();
}

void UnitCollectives::gather() {
  if (gather_.work) {
    Timed t(collective_sink());
    gather_.work->wait();
    gather_ = AllGatherState();
    if (keep_secondary_) keep_secondary();
    keep_secondary_ = false;
  }
  if (gathered_) return;
  if (std::unique_ptr<Work> w = start_shared_gather()) {
    Timed t(collective_sink());
    w->wait();
  } else if (std::unique_ptr<Work> w2 = start_secondary_gather()) {
    {
      Timed t(collective_sink());
      w2->wait();
    }
    gather_ = AllGatherState();
  } else if (cfg_.stage == 3 && cfg_.quantized_weights_bits != 0) {
    flat_.allocate_full();
    std::unique_ptr<Work> w3 = start_quantized_gather();
    {
      Timed t(collective_sink());
      w3->wait();
    }
    keep_secondary();
  } else {
    flat_.allocate_full();
    at::Tensor send = fill_own_block();
    {
      Timed t(collective_sink());
      comm_.all_gather(flat_.full(), send);
    }
    keep_secondary();
  }
  mark_gathered();
}

void UnitCollectives::free_full() {
  if (cfg_.stage != 3 || !gathered_) return;
  gather();  // an all-gather in flight still writes into the flat parameter: let it finish first
  flat_.release_full();
  if (shared_seq_ != 0) {
    owner_->shared_pool()->release(shared_seq_);
    shared_seq_ = 0;
  }
  gathered_ = false;
}

void UnitCollectives::stage_gradients() {
  if (!flat_.trainable()) return;
  const bool persistent = cfg_.stage <= 1;
  // A fresh buffer (stages 2-3) takes the first gradients by copy, not by adding them to
  // zeros: one pass instead of a fill and an add. Only slots without a gradient and the
  // padding are zeroed.
  const bool fresh = !staged_ && !persistent;
  if (!staged_) {
    staged_flat_ = persistent ? grad_flat_
                              : torch::empty({flat_.padded_numel()},
                                             torch::TensorOptions().dtype(reduce_dtype_).device(flat_.device()));
    if (!persistent) peak_comm_bytes_ = std::max(peak_comm_bytes_, nbytes(staged_flat_));
    staged_ = true;
    expects_reduce_ = true;  // a staged gradient is always reduced
  }
  for (auto& s : flat_.slots()) {
    at::Tensor& g = s.param.mutable_grad();
    at::Tensor dst = staged_flat_.narrow(0, s.offset, s.numel);
    if (!g.defined()) {  // unused on this rank: its part stays zero, as in FSDP
      if (fresh) dst.zero_();
      continue;
    }
    if (fresh) {
      dst.copy_(g.reshape({-1}));
    } else {
      dst.add_(g.reshape({-1}));
    }
    g.reset();
  }
  if (fresh) {  // the padding: the alignment gaps between parameters and the tail
    int64_t end = 0;
    for (auto& s : flat_.slots()) {
      if (s.offset > end) staged_flat_.narrow(0, end, s.offset - end).zero_();
      end = s.offset + s.numel;
    }
    staged_flat_.narrow(0, end, flat_.padded_numel() - end).zero_();
  }
}

void UnitCollectives::start_reduce() {
  if (!staged_) stage_gradients();  // nothing arrived on this rank: reduce zeros
  if (!staged_) return;             // no trainable parameter
  at::Tensor flat = std::move(staged_flat_);
  staged_flat_ = at::Tensor();
  staged_ = false;
  expects_reduce_ = false;
  const bool persistent = cfg_.stage <= 1;
  if (persistent && !sync_) return;  // accumulate locally until the boundary (DDP no_sync)
  if (cfg_.stage == 0) {
    {
      Timed t(collective_sink());
      comm_.all_reduce(flat, ReduceOp::kAvg);
    }
    if (!grad_shard_aliases_flat_) grad_shard().add_(flat.to(flat_.master_dtype()));
    return;
  }
  // Start the reduce-scatter and return: it overlaps the rest of backward. The owner
  // bounds how many are in flight and finishes them all before backward returns.
  if (owner_) owner_->before_reduce_start(unit_);
  if (cfg_.quantized_gradients_bits != 0 && !persistent) {
    // qgZ: each destination block quantized, exchanged with an all-to-all, and summed in
    // float32 on arrival (quantized_reduce_scatter_async).
    const QuantSpec q{cfg_.quantized_gradients_bits, cfg_.quantization_block};
    const int64_t S = flat_.shard_numel(), n = comm_.world_size();
    reduce_.out = torch::empty({S}, flat.options().dtype(at::kFloat));
    peak_comm_bytes_ = std::max(peak_comm_bytes_, 2 * n * quantized_bytes(S, q) + nbytes(reduce_.out) + nbytes(flat));
    {
      Timed t(collective_sink());
      reduce_.work = quantized_reduce_scatter_async(comm_, reduce_.out, flat, q);
    }
    if (owner_) owner_->on_reduce_started(unit_);
    return;
  }
  reduce_.in = flat;
  reduce_.out = torch::empty({flat_.shard_numel()}, flat.options());
  peak_comm_bytes_ = std::max(peak_comm_bytes_, nbytes(reduce_.out) + (persistent ? 0 : nbytes(flat)));
  {
    Timed t(collective_sink());
    reduce_.work = comm_.reduce_scatter_async(reduce_.out, reduce_.in,
                                              avg_on_accumulate() ? ReduceOp::kSum : ReduceOp::kAvg);
  }
  if (owner_) owner_->on_reduce_started(unit_);
}

bool UnitCollectives::avg_on_accumulate() const {
  // A bfloat16 reduction into a wider gradient shard: reduce the sum and scale by 1/N while
  // adding it into the shard, so the average takes no pass of its own. For a power-of-two
  // N the scaling is exact, so the shard gets the same bits as from an averaged reduction
  // (halving a 16-bit sum rounds nothing, short of subnormals). Not float16: its sum of N
  // gradients overflows at 65504 where their average fits (N times less headroom under
  // dynamic loss scaling), so float16 is averaged by the collective, which scales before it
  // rounds to 16 bits (ReduceOp::kAvg).
  const int n = comm_.world_size();
  return cfg_.quantized_gradients_bits == 0 && !grad_shard_aliases_flat_ && (n & (n - 1)) == 0 && reduce_dtype_ == at::kBFloat16 &&
         c10::elementSize(flat_.master_dtype()) > c10::elementSize(reduce_dtype_);
}

void UnitCollectives::finish_reduce() {
  if (!reduce_.work) return;
  {
    Timed t(collective_sink());
    reduce_.work->wait();
  }
  reduce_.work.reset();
  reduced_ = true;
  if (grad_shard_aliases_flat_) {
    grad_shard_.copy_(reduce_.out);  // stage 1: the owned slice of the accumulated flat gradient
  } else if (grad_sink_) {
    // Gradient offload: added into the tier's shard chunk by chunk, by the same operations
    // as into a resident one (a released shard starts from zeros). With an owner, on its
    // writer thread while backward goes on (in submission order, so a unit's micro-batches
    // add up in order); the shard is held until written.
    const double scale = avg_on_accumulate() ? 1.0 / comm_.world_size() : 1.0;
    // Negative control grad_offload_stale_first (tests/gradient_offload_test.sh): the step's
    // first reduction is added onto the tier's stale values.
    const bool first = !grad_in_tier_ && !test_control("grad_offload_stale_first");
    grad_in_tier_ = true;
    if (owner_) {
      Timed t(&owner_->comm_times().offload_grad_s);  // waits only while 2 writes are pending
      GradSink* sink = grad_sink_;
      const size_t index = unit_.index();
      at::Tensor out = reduce_.out;
      owner_->write_grad_async([sink, index, out, scale, first] { sink->accumulate_grad(index, out, scale, first); });
    } else {
      grad_sink_->accumulate_grad(unit_.index(), reduce_.out, scale, first);
    }
  } else {
    const double scale = avg_on_accumulate() ? 1.0 / comm_.world_size() : 1.0;
    grad_shard().add_(reduce_.out.to(flat_.master_dtype()), scale);
  }
  reduce_ = ReduceScatterState();
}

void UnitCollectives::after_optimizer_step() {
  torch::NoGradGuard no_grad;
  if (cfg_.stage == 3) {  // the next gather reads the updated shard, over the world
    // Negative control hpz_keep_secondary (tests/hpz_train_test.sh): the stale blocks stay.
    if (!test_control("hpz_keep_secondary")) drop_secondary();
    return;
  }
  at::Tensor& shard = flat_.shard();
  if (cfg_.stage == 0) {
    if (!flat_.shard_aliases_full()) flat_.full().copy_(shard);
    return;
  }
  Timed t(collective_sink());
  comm_.all_gather(flat_.full(), flat_.shard_aliases_full() ? shard : shard.to(flat_.compute_dtype()));
}

void UnitCollectives::zero_grad() {
  finish_reduce();
  reduced_ = false;
  grad_in_tier_ = false;  // the tier's values are stale now: the next reduction overwrites them
  if (grad_flat_.defined()) grad_flat_.zero_();
  if (grad_shard_aliases_flat_ || !release_grad_shard_) {
    if (grad_shard_.defined()) grad_shard_.zero_();
  } else {
    // Released, like the fp32 gradient partition DeepSpeed's ZeRO-3 frees after each
    // sub-group's step (stage3.py, _optimizer_step) or PyTorch's zero_grad(set_to_none=True):
    // D's shard is not held through the G step, nor G's through the D steps, so a GAN step
    // holds the larger of the two models' gradient shards instead of both.
    grad_shard_ = at::Tensor();
  }
}

void UnitCollectives::abandon() {
  free_full();  // waits for a prefetch in flight
  expects_reduce_ = false;
  staged_ = false;
  staged_flat_ = at::Tensor();
  for (auto& s : flat_.slots()) s.param.mutable_grad().reset();
  zero_grad();  // completes a reduce-scatter in flight first
}

at::Tensor UnitCollectives::gather_full_copy() {
  const int64_t T = flat_.data_end();
  if (cfg_.stage == 0) return (flat_.shard_aliases_full() ? flat_.full() : flat_.shard()).narrow(0, 0, T).clone();
  at::Tensor full = torch::empty({flat_.padded_numel()},
                                 torch::TensorOptions().dtype(flat_.master_dtype()).device(flat_.device()));
  comm_.all_gather(full, flat_.master_shard());
  return full.narrow(0, 0, T).clone();
}

}  // namespace shardgan::detail
