#include "shardgan/sharding/deferred.h"

#include <stdexcept>

#include <torch/torch.h>

#include "shardgan/sharding/flat_layout.h"

namespace shardgan {

uint64_t unit_seed(uint64_t seed, const std::string& unit_name) {
  // FNV-1a over the name, then a splitmix64 finaliser mixed with the seed.
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : unit_name) h = (h ^ c) * 1099511628211ull;
  uint64_t z = seed + 0x9e3779b97f4a7c15ull * (h | 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return (z ^ (z >> 31)) & 0x7fffffffffffffffull;  // torch::manual_seed takes it as is
}

std::unique_ptr<ShardedModel> build_sharded_model(const ModelSpec& spec, Communicator& comm,
                                                  ShardingConfig cfg, uint64_t seed,
                                                  at::ScalarType dtype, c10::Device device) {
  if (dtype != at::kFloat && dtype != at::kDouble) {
    throw std::invalid_argument("model '" + spec.name + "': the master dtype must be float32 or float64");
  }
  auto model = std::make_unique<ShardedModel>(spec.name, comm, cfg);
  populate_sharded_model(*model, spec, seed, dtype, device, {});
  return model;
}

void populate_sharded_model(ShardedModel& model, const ModelSpec& spec, uint64_t seed, at::ScalarType dtype,
                            c10::Device device, const std::function<void(ShardedUnit&)>& after_unit) {
  if (dtype != at::kFloat && dtype != at::kDouble) {
    throw std::invalid_argument("model '" + spec.name + "': the master dtype must be float32 or float64");
  }
  for (const UnitSpec& u : spec.units) {
    torch::manual_seed(unit_seed(seed, u.name));
    BuiltUnit b = u.make(/*initialize=*/true);
    if (!b.module || !b.forward) {
      throw std::invalid_argument("model '" + spec.name + "': unit '" + u.name + "' built no module or forward");
    }
    b.module->to(device, dtype);
    ShardedUnit& added = model.add_unit(u.name, std::move(b.module), std::move(b.forward));
    if (after_unit) after_unit(added);
  }
  if (spec.program) model.set_program(spec.program);
}

std::vector<int64_t> unit_shard_numels(const ModelSpec& spec, int world_size, int stage, int64_t align) {
  std::vector<int64_t> out;
  for (const UnitParams& u : unit_params(spec)) {
    out.push_back(make_flat_layout(u.numels, align, world_size, stage).shard_numel);
  }
  return out;
}

std::vector<UnitParams> unit_params(const ModelSpec& spec) {
  std::vector<UnitParams> out;
  torch::NoGradGuard no_grad;
  for (const UnitSpec& u : spec.units) {
    BuiltUnit b = u.make(/*initialize=*/false);
    UnitParams up;
    for (const auto& kv : b.module->named_parameters(/*recurse=*/true)) {
      up.names.push_back(kv.key());
      up.numels.push_back(kv.value().numel());
    }
    out.push_back(std::move(up));
  }
  return out;
}

std::vector<int64_t> unit_numels(const ModelSpec& spec) {
  std::vector<int64_t> out;
  for (const UnitParams& u : unit_params(spec)) {
    int64_t n = 0;
    for (int64_t k : u.numels) n += k;
    out.push_back(n);
  }
  return out;
}

}  // namespace shardgan
