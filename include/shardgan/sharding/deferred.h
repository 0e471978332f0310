#pragma once
/// Deferred, sharded initialization (FSDP's deferred init / DeepSpeed's zero.Init, for a
/// model written as a list of units): a model is described by unit specs, and each unit is
/// built, initialized, flattened and sharded before the next one is built, so that no rank
/// ever holds the whole model. Peak memory while building is one unit's parameters plus
/// the shards kept so far.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "shardgan/sharding/sharded_model.h"

namespace shardgan {

/// What a unit spec builds: the unit's module (parameters on the CPU, float32) and the
/// function that runs it.
struct BuiltUnit {
  std::shared_ptr<torch::nn::Module> module;
  ShardedUnit::Forward forward;
};

/// One unit of a model, built on demand.
struct UnitSpec {
  std::string name;  ///< unit name, unique within the model ("block0", "shared", ...)
  /// Builds the module. With `initialize`, parameters get the family's initialization,
  /// drawn from torch's global generator, which build_sharded_model seeds for this unit
  /// alone; without it they are left as constructed (for counting only).
  std::function<BuiltUnit(bool initialize)> make;
};

/// A whole model: its units in registration order and the program that runs them.
struct ModelSpec {
  std::string name;                  ///< "generator" or "discriminator"
  std::vector<UnitSpec> units;
  /// Runs the units on the model's inputs; empty means "chain the units' first outputs".
  ShardedModel::Program program;
  /// Globs (fnmatch) of "<unit>.<param>" names whose gradients are sparse, such as class
  /// embeddings (a batch touches a few rows). Optimizers that store reduced-precision
  /// states keep these in float32 unless optim.<model>.state_float32 names others
  /// (bitsandbytes' advice for embeddings, Dettmers et al. 2022, Sec. 2.3).
  std::vector<std::string> sparse_params;
};

/// Local (no collectives; must be called identically on every rank). Builds each unit of
/// `spec` in turn: seeds torch's global generator with unit_seed(seed, unit name), calls
/// make(true) (on the host, so the initial values are the same on every device), moves the
/// module to `device` and casts it to `dtype` (float32 or float64), and adds it to the model,
/// which flattens it and keeps only this rank's shard at stage 3 before the next unit is
/// built. The initial values depend on `seed` and the unit's name only, never on the world
/// size or stage. Throws std::invalid_argument for a duplicate unit name or a parameter
/// that belongs to two units (naming it).
std::unique_ptr<ShardedModel> build_sharded_model(const ModelSpec& spec, Communicator& comm,
                                                  ShardingConfig cfg, uint64_t seed,
                                                  at::ScalarType dtype,
                                                  c10::Device device = c10::Device(c10::kCPU));

/// build_sharded_model into a model that exists already (with no units): after each unit
/// is added, `after_unit` (if set) gets it, before the next unit is built. Parameter
/// offload uses it to move each unit's master shard to disk before the next one exists,
/// so that no rank ever holds all its master shards (OffloadedAdam::adopt_unit).
void populate_sharded_model(ShardedModel& model, const ModelSpec& spec, uint64_t seed, at::ScalarType dtype,
                            c10::Device device, const std::function<void(ShardedUnit&)>& after_unit);

/// Local. The shard elements S of each unit of `spec` on `world_size` ranks at `stage`
/// with flat alignment `align`, as FlatParam lays them out (make_flat_layout), from
/// unit_params.
std::vector<int64_t> unit_shard_numels(const ModelSpec& spec, int world_size, int stage, int64_t align = 1);

/// One unit's parameters, in FlatParam's order (named_parameters()).
struct UnitParams {
  std::vector<std::string> names;  ///< names within the unit's module
  std::vector<int64_t> numels;
};
/// Local. Each unit's parameters, found by building each unit uninitialized and dropping
/// it at once (peak memory: one unit). For the pre-flights and the offload stores' sizes.
std::vector<UnitParams> unit_params(const ModelSpec& spec);

/// Local. Parameter elements of each unit of `spec`, in order, found by building each unit
/// uninitialized and dropping it at once (peak memory: one unit). For the memory pre-flight.
std::vector<int64_t> unit_numels(const ModelSpec& spec);

/// The seed of unit `unit_name` of a model built with `seed` (a 64-bit mix of both).
uint64_t unit_seed(uint64_t seed, const std::string& unit_name);

}  // namespace shardgan
