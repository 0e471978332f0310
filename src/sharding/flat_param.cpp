#include "shardgan/sharding/flat_param.h"

#include <algorithm>
#include <stdexcept>

#include <torch/torch.h>

#include "shardgan/device/host_copy.h"
#include "shardgan/sharding/flat_layout.h"
#include "shardgan/sharding/shard_source.h"
#include "sharding/ownership.h"
#include "sharding/torch_internals.h"

namespace shardgan {
namespace {
int64_t nbytes(const at::Tensor& t) { return t.defined() ? t.numel() * t.element_size() : 0; }
}  // namespace

FlatParam::FlatParam(const std::string& unit, const std::string& qualified, torch::nn::Module& module, int rank,
                     int world_size, int stage, c10::optional<at::ScalarType> compute_dtype, int64_t align)
    : stage_(stage) {
  torch::NoGradGuard no_grad;
  c10::optional<at::ScalarType> dtype;
  try {
    for (auto& kv : module.named_parameters(/*recurse=*/true)) {
      const at::Tensor& p = kv.value();
      if (dtype && *dtype != p.scalar_type()) {
        throw std::invalid_argument("unit '" + unit + "': parameter '" + kv.key() +
                                    "' has a different dtype from the unit's other parameters");
      }
      if (dtype && p.device() != device_) {
        throw std::invalid_argument("unit '" + unit + "': parameter '" + kv.key() + "' is on " + p.device().str() +
                                    ", the unit's other parameters on " + device_.str());
      }
      device_ = p.device();
      // Throws, naming both owners, if another unit already owns this parameter.
      detail::claim_parameter(p, qualified + kv.key());
      dtype = p.scalar_type();
      slots_.push_back({kv.key(), p.sizes().vec(), 0, p.numel(), p});
    }
  } catch (...) {
    for (auto& s : slots_) detail::release_parameter(s.param);
    throw;
  }
  master_dtype_ = dtype.value_or(at::kFloat);
  compute_dtype_ = compute_dtype.value_or(master_dtype_);
  std::vector<int64_t> numels;
  for (const auto& s : slots_) numels.push_back(s.numel);
  const FlatLayout layout = make_flat_layout(numels, align, world_size, stage);
  for (size_t k = 0; k < slots_.size(); ++k) slots_[k].offset = layout.offsets[k];
  numel_ = layout.numel;
  data_end_ = layout.data_end;
  padded_numel_ = layout.padded_numel;
  shard_numel_ = layout.shard_numel;
  shard_offset_ = stage == 0 ? 0 : shard_numel_ * rank;
  const auto master_opts = torch::TensorOptions().dtype(master_dtype_).device(device_);
  const auto compute_opts = torch::TensorOptions().dtype(compute_dtype_).device(device_);
  shard_aliases_full_ = compute_dtype_ == master_dtype_ && stage <= 2;
  if (stage == 3) {
    // Deferred sharded init: copy only the owned range of each parameter into the master
    // shard. full_ gets untouched (so never resident) memory that is freed below, and the
    // parameters' own storage goes with set_data, so the build peaks at one unit + shard.
    shard_ = torch::zeros({shard_numel_}, master_opts);
    for (auto& s : slots_) {
      const int64_t lo = std::max(s.offset, shard_offset_);
      const int64_t hi = std::min(s.offset + s.numel, shard_offset_ + shard_numel_);
      if (lo >= hi) continue;
      shard_.narrow(0, lo - shard_offset_, hi - lo).copy_(s.param.reshape({-1}).narrow(0, lo - s.offset, hi - lo));
    }
    full_ = torch::empty({padded_numel_}, compute_opts);
    for (auto& s : slots_) s.param.set_data(full_.narrow(0, s.offset, s.numel).view(s.shape));
    detail::free_storage(full_);
  } else {
    at::Tensor master_full = torch::zeros({padded_numel_}, master_opts);
    for (auto& s : slots_) master_full.narrow(0, s.offset, s.numel).copy_(s.param.reshape({-1}));
    full_ = master_full.to(compute_dtype_);  // no copy when the dtypes agree
    for (auto& s : slots_) s.param.set_data(full_.narrow(0, s.offset, s.numel).view(s.shape));
    at::Tensor owned = master_full.narrow(0, shard_offset_, shard_numel_);
    shard_ = shard_aliases_full_ ? full_.narrow(0, shard_offset_, shard_numel_) : owned.clone();
  }
}

FlatParam::~FlatParam() {
  for (auto& s : slots_) detail::release_parameter(s.param);
}

void FlatParam::allocate_full() {
  detail::refill_storage(full_, static_cast<size_t>(padded_numel_) * full_.element_size());
}

void FlatParam::attach_full(void* external) {
  detail::point_storage(full_, external, static_cast<size_t>(padded_numel_) * full_.element_size());
}

void FlatParam::release_full() { detail::free_storage(full_); }

int64_t FlatParam::full_bytes_alive() const {
  return stage_ == 3 ? static_cast<int64_t>(detail::storage_nbytes(full_)) : 0;
}

int64_t FlatParam::persistent_bytes() const {
  int64_t b = stage_ <= 2 ? nbytes(full_) : 0;
  if (!shard_aliases_full_ && !source_) b += nbytes(shard_);
  return b;
}

void FlatParam::offload(ShardSource* source, size_t index) {
  source->write_shard(index, shard_);
  source_ = source;
  source_index_ = index;
  detail::free_storage(shard_);
}

at::Tensor FlatParam::master_shard() {
  if (!source_) return shard_;
  // The tier reads into host memory; a device shard goes on through the staging copy.
  at::Tensor t = torch::empty({shard_numel_}, torch::TensorOptions().dtype(master_dtype_));
  source_->read_shard(source_index_, t);
  if (device_.is_cpu()) return t;
  at::Tensor d = torch::empty({shard_numel_}, t.options().device(device_));
  copy_from_host(t, d);
  return d;
}

void FlatParam::set_master_shard(const at::Tensor& values) {
  if (!source_) {
    shard_.copy_(values);
    return;
  }
  source_->write_shard(source_index_,
                       values.scalar_type() == master_dtype_ ? values.contiguous() : values.to(master_dtype_));
}

bool FlatParam::trainable() const {
  for (const Slot& s : slots_) {
    if (s.param.requires_grad() || s.param.grad().defined()) return true;
  }
  return false;
}

}  // namespace shardgan
