#pragma once
/// Automatic wrapping: which children of a Sequential become sharding units (FSDP's
/// ModuleWrapPolicy and size_based_auto_wrap_policy, for a chain of modules).
#include <cstdint>
#include <string>
#include <vector>

#include <torch/nn/modules/container/sequential.h>

namespace shardgan {

class ShardedModel;

struct WrapPolicy {
  /// A child whose module name() contains one of these strings (e.g. "Conv2d",
  /// "ConvTranspose2d", "Linear") starts a new unit, as FSDP's ModuleWrapPolicy wraps each
  /// module of the listed classes. Empty: no type rule.
  std::vector<std::string> unit_types;
  /// A unit is closed once it holds at least this many parameter elements (FSDP's
  /// size_based_auto_wrap_policy min_num_params). 0: no size rule. With neither rule the
  /// whole Sequential is one unit.
  int64_t min_num_params = 0;
};

/// Splits the children of `seq` into consecutive groups by `policy` and adds each group, in
/// order, as a unit of `model` named "u<first child>-<last child>" (parameters keep their
/// child index: "u0-2.0.weight"). Call identically on every rank. Returns the units added.
size_t wrap_sequential(ShardedModel& model, torch::nn::Sequential seq, const WrapPolicy& policy);

}  // namespace shardgan
