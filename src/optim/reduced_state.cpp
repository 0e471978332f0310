#include "shardgan/optim/reduced_state.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <vector>

#include <torch/torch.h>

#include "shardgan/optim/fused_adam.h"
#include "shardgan/sharding/sharded_model.h"

namespace shardgan {

at::Tensor widen_state(const StateLayout& l, int64_t shard_numel, const ReducedFormat& f, const ReducedState& s) {
  at::Tensor out = torch::zeros({shard_numel}, torch::kFloat);
  float* o = out.data_ptr<float>();
  for (const StateRun& r : l.runs) {
    if (!r.reduced) {
      std::memcpy(o + r.begin, s.f32.data_ptr<float>() + r.store_offset, sizeof(float) * r.numel);
    } else if (f.dtype == StateDtype::kBFloat16) {
      bf16_to_float(static_cast<const uint16_t*>(s.values.data_ptr()) + r.store_offset, r.numel, o + r.begin, f.isa);
    } else {
      dequantize_blockwise(s.values.data_ptr<uint8_t>() + r.store_offset, s.absmax.data_ptr<float>() + r.block_offset,
                           r.numel, f.block, f.map, o + r.begin);
    }
  }
  return out;
}

void narrow_state(const StateLayout& l, const ReducedFormat& f, const at::Tensor& values, ReducedState& s) {
  const at::Tensor in = values.to(at::kFloat).contiguous();
  const float* x = in.data_ptr<float>();
  for (const StateRun& r : l.runs) {
    if (!r.reduced) {
      std::memcpy(s.f32.data_ptr<float>() + r.store_offset, x + r.begin, sizeof(float) * r.numel);
    } else if (f.dtype == StateDtype::kBFloat16) {
      float_to_bf16(x + r.begin, r.numel, static_cast<uint16_t*>(s.values.data_ptr()) + r.store_offset, f.isa);
    } else {
      quantize_blockwise(x + r.begin, r.numel, f.block, f.map, s.values.data_ptr<uint8_t>() + r.store_offset,
                         s.absmax.data_ptr<float>() + r.block_offset);
    }
  }
}

namespace {

// The run of `l` holding shard-local element `at`.
const StateRun& run_at(const StateLayout& l, int64_t at) {
  for (const StateRun& r : l.runs) {
    if (at >= r.begin && at < r.begin + r.numel) return r;
  }
  throw std::logic_error("state layout: element " + std::to_string(at) + " is in no run");
}

// Calls fn(parameter index, run, a, b) for each parameter of `u` whose elements [a, b)
// (flat offsets) are in its shard, with the run holding them.
template <class Fn>
void for_owned_parts(const ShardedUnit& u, const StateLayout& l, Fn&& fn) {
  const int64_t s0 = u.shard_offset(), S = u.shard_numel();
  for (size_t k = 0; k < u.slots().size(); ++k) {
    const auto& sl = u.slots()[k];
    const int64_t a = std::max(s0, sl.offset), b = std::min(s0 + S, sl.offset + sl.numel);
    if (a < b) fn(k, run_at(l, a - s0), a, b);
  }
}

}  // namespace

void visit_raw_state(const ShardedUnit& u, const StateLayout& l, int64_t block, const std::string& state,
                     const ReducedState& s, const ShardedOptimizer::RawVisitor& fn) {
  const int64_t s0 = u.shard_offset();
  for_owned_parts(u, l, [&](size_t k, const StateRun& r, int64_t a, int64_t b) {
    const int64_t in_run = a - s0 - r.begin;
    if (r.reduced) {
      fn(state, k, "codes", s.values.narrow(0, r.store_offset + in_run, b - a));
      fn(state, k, "absmax", s.absmax.narrow(0, r.block_offset + in_run / block, num_blocks(b - a, block)));
    } else {
      fn(state, k, "float32", s.f32.narrow(0, r.store_offset + in_run, b - a));
    }
  });
}

void load_raw_state(const ShardedUnit& u, const StateLayout& l, const ReducedFormat& f, const std::string& state,
                    ReducedState& s, StateSource& src) {
  const int64_t s0 = u.shard_offset(), B = f.block;
  for_owned_parts(u, l, [&](size_t k, const StateRun& r, int64_t a, int64_t b) {
    const auto& sl = u.slots()[k];
    const int64_t in_run = a - s0 - r.begin, lo = a - sl.offset, hi = b - sl.offset;
    if (!r.reduced) {
      src.read_values(state, k, lo, hi, s.f32.data_ptr<float>() + r.store_offset + in_run);
      return;
    }
    uint8_t* codes = s.values.data_ptr<uint8_t>() + r.store_offset + in_run;
    float* absmax = s.absmax.data_ptr<float>() + r.block_offset + in_run / B;
    if (src.block(state, k) == B) {  // the stored bits: a bit-exact resume
      src.read_raw(state, k, lo, hi, codes, absmax);
      return;
    }
    // Stored as float32, or in other blocks: through float32, requantized in this run's blocks.
    std::vector<float> values(static_cast<size_t>(hi - lo));
    src.read_values(state, k, lo, hi, values.data());
    quantize_blockwise(values.data(), hi - lo, B, f.map, codes, absmax);
  });
}

void restore_state_ranges(const StateLayout& l, StateDtype d, int64_t block,
                          const std::vector<std::pair<int64_t, int64_t>>& ranges, const ReducedState& kept,
                          ReducedState& live) {
  for (const StateRun& r : l.runs) {
    for (auto [lo, hi] : ranges) {
      const int64_t a = std::max(lo, r.begin), b = std::min(hi, r.begin + r.numel);
      if (a >= b) continue;
      const int64_t off = r.store_offset + (a - r.begin), n = b - a;
      const at::Tensor& from = r.reduced ? kept.values : kept.f32;
      at::Tensor& to = r.reduced ? live.values : live.f32;
      if (!to.defined()) continue;
      to.narrow(0, off, n).copy_(from.narrow(0, off, n));
      if (r.reduced && d == StateDtype::kInt8) {
        const int64_t b0 = r.block_offset + (a - r.begin) / block, b1 = r.block_offset + (b - 1 - r.begin) / block;
        live.absmax.narrow(0, b0, b1 - b0 + 1).copy_(kept.absmax.narrow(0, b0, b1 - b0 + 1));
      }
    }
  }
}

std::vector<ShardedOptimizer::RawState> adam_raw_states(const StatePolicy& policy, bool stores_m) {
  if (policy.dtype != StateDtype::kInt8) return {};
  std::vector<ShardedOptimizer::RawState> out;
  if (stores_m) out.push_back({"exp_avg", true});
  out.push_back({"exp_avg_sq", false});
  return out;
}

}  // namespace shardgan
