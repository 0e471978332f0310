#pragma once
/// The generator out of a checkpoint, for sampling and export (shardgan-ckpt sample and
/// export). Runs on any world-size-1 communicator, e.g. LocalCommunicator (no MPI).
#include <memory>
#include <string>

#include <torch/nn/module.h>

#include "shardgan/checkpoint/shard_io.h"
#include "shardgan/sharding/sharded_model.h"
#include "shardgan/train/config.h"

namespace shardgan {

/// Builds the generator that checkpoint `rd`'s stored config describes, at stage 0 on
/// `comm` (world size 1), and fills its parameters (or, with `ema`, the "ema" state; a
/// CheckpointError if there is none) and buffers from the checkpoint. `cfg_out`, if given,
/// receives the parsed config.
std::unique_ptr<ShardedModel> load_generator(ckpt::CheckpointReader& rd, Communicator& comm, bool ema,
                                             TrainConfig* cfg_out = nullptr);

/// A plain torch::nn::Module whose children are `m`'s unit modules, registered under the
/// unit names ("block0", ..., "out"). This is what export writes and what torch::load
/// reads back into: parameters "block0.0.weight", buffers "block0.1.running_mean", ...
std::shared_ptr<torch::nn::Module> plain_module(ShardedModel& m);

/// Writes `m` with torch's serializer (torch::save of plain_module(m)), plus the string
/// "shardgan.config" (the resolved YAML) so that a reader can rebuild the architecture.
void export_model(ShardedModel& m, const std::string& config_yaml, const std::string& path);

/// Reads an export: rebuilds the generator from its stored config at stage 0 on `comm`
/// (world size 1) and torch::load()s the weights into it. Equivalent by hand:
///   auto g = build_generator(cfg.model, comm, {0}, 0);
///   auto root = plain_module(*g);
///   torch::load(root, path);
std::unique_ptr<ShardedModel> load_exported_generator(const std::string& path, Communicator& comm,
                                                      TrainConfig* cfg_out = nullptr);

/// The fixed latent batch the trainer samples from ([n, z_dim, 1, 1], seeded with
/// cfg.seed + 4; n = 64 gives the trainer's grid).
at::Tensor fixed_latents(const TrainConfig& cfg, int64_t n);

}  // namespace shardgan
