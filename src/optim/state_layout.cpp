#include "shardgan/optim/state_layout.h"

#include <fnmatch.h>

#include <algorithm>
#include <stdexcept>

#include "shardgan/optim/blockwise_quant.h"
#include "shardgan/optim/fused_adam.h"

namespace shardgan {

const char* to_string(StateDtype d) {
  switch (d) {
    case StateDtype::kBFloat16: return "bfloat16";
    case StateDtype::kInt8: return "int8";
    default: return "float32";
  }
}

StateDtype parse_state_dtype(const std::string& s) {
  if (s == "float32") return StateDtype::kFloat32;
  if (s == "bfloat16") return StateDtype::kBFloat16;
  if (s == "int8") return StateDtype::kInt8;
  throw std::invalid_argument("unknown state dtype '" + s + "' (accepted: float32, bfloat16, int8)");
}

int64_t state_element_bytes(StateDtype d) {
  switch (d) {
    case StateDtype::kBFloat16: return 2;
    case StateDtype::kInt8: return 1;
    default: return 4;
  }
}

void validate_state_policy(const StatePolicy& p) {
  if (p.block < 1 || p.block > kMaxStateBlock) {
    throw std::invalid_argument("state_block must be in [1, " + std::to_string(kMaxStateBlock) + "], got " +
                                std::to_string(p.block));
  }
  if (p.min_numel < 0) throw std::invalid_argument("state_min_numel must be >= 0, got " + std::to_string(p.min_numel));
}

int64_t StateLayout::state_bytes(StateDtype d) const {
  return reduced_numel * state_element_bytes(d) + (d == StateDtype::kInt8 ? blocks * 4 : 0) + float32_numel * 4;
}

int64_t StateLayout::resident_bytes(StateDtype d) const {
  if (d == StateDtype::kFloat32) return 0;
  return (d == StateDtype::kInt8 ? blocks * 4 : 0) + float32_numel * 4;
}

namespace {

bool keeps_float32(const StateParam& p, const StatePolicy& policy) {
  if (p.numel < policy.min_numel) return true;
  for (const auto& g : policy.float32) {
    if (::fnmatch(g.c_str(), p.name.c_str(), 0) == 0) return true;
  }
  return false;
}

}  // namespace

StateLayout make_state_layout(const std::vector<StateParam>& params, int64_t padded_numel, int64_t shard_offset,
                              int64_t shard_numel, const StatePolicy& policy) {
  validate_state_policy(policy);
  StateLayout out;
  if (shard_numel <= 0) return out;
  if (shard_offset < 0 || shard_offset + shard_numel > padded_numel) {
    throw std::invalid_argument("make_state_layout: shard [" + std::to_string(shard_offset) + ", " +
                                std::to_string(shard_offset + shard_numel) + ") is outside the flat parameter of " +
                                std::to_string(padded_numel) + " elements");
  }
  // Extents in flat coordinates: each parameter up to the next one (or the end); elements
  // before the first parameter (none in FlatParam's layout) keep float32.
  struct Extent {
    int64_t lo, hi;
    bool reduced;
  };
  std::vector<Extent> ext;
  int64_t prev_hi = 0;
  for (size_t k = 0; k < params.size(); ++k) {
    const StateParam& p = params[k];
    const int64_t hi = k + 1 < params.size() ? params[k + 1].offset : padded_numel;
    if (p.offset < prev_hi || p.numel < 0 || p.offset + p.numel > hi) {
      throw std::invalid_argument("make_state_layout: parameter '" + p.name + "' at offset " + std::to_string(p.offset) +
                                  " (" + std::to_string(p.numel) + " elements) overlaps its neighbours or the end");
    }
    if (k == 0 && p.offset > 0) ext.push_back({0, p.offset, false});
    ext.push_back({p.offset, hi, policy.dtype != StateDtype::kFloat32 && !keeps_float32(p, policy)});
    prev_hi = hi;
  }
  if (params.empty()) ext.push_back({0, padded_numel, false});
  const int64_t s0 = shard_offset, s1 = shard_offset + shard_numel;
  const bool int8 = policy.dtype == StateDtype::kInt8;
  for (const Extent& e : ext) {
    const int64_t lo = std::max(e.lo, s0), hi = std::min(e.hi, s1);
    if (lo >= hi) continue;
    StateRun r;
    r.begin = lo - s0;
    r.numel = hi - lo;
    r.reduced = e.reduced;
    if (!out.runs.empty()) {
      StateRun& last = out.runs.back();
      const bool whole_blocks = !int8 || last.numel % policy.block == 0;
      if (last.reduced == r.reduced && whole_blocks) {
        last.numel += r.numel;
        (r.reduced ? out.reduced_numel : out.float32_numel) += r.numel;
        if (int8 && r.reduced) {
          out.blocks = last.block_offset + num_blocks(last.numel, policy.block);
        }
        continue;
      }
    }
    r.store_offset = r.reduced ? out.reduced_numel : out.float32_numel;
    (r.reduced ? out.reduced_numel : out.float32_numel) += r.numel;
    if (int8 && r.reduced) {
      r.block_offset = out.blocks;
      out.blocks += num_blocks(r.numel, policy.block);
    }
    out.runs.push_back(r);
  }
  return out;
}

}  // namespace shardgan
