#pragma once
/// The generator out of a checkpoint, for sampling and export (shardgan-ckpt sample and
/// export), for any model family: the checkpoint's stored config names the family. Runs on
/// any world-size-1 communicator, e.g. LocalCommunicator (no MPI).
#include <memory>
#include <string>

#include <torch/nn/module.h>

#include "shardgan/checkpoint/shard_io.h"
#include "shardgan/models/family.h"
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
/// unit names (e.g. DCGAN's "block0", ..., "out"). This is what export writes and what torch::load
/// reads back into: parameters "block0.0.weight", buffers "block0.1.running_mean", ...
std::shared_ptr<torch::nn::Module> plain_module(ShardedModel& m);

/// Writes `m` with torch's serializer (torch::save of plain_module(m)), plus the string
/// "shardgan.config" (the resolved YAML) so that a reader can rebuild the architecture.
void export_model(ShardedModel& m, const std::string& config_yaml, const std::string& path);

/// Reads an export: rebuilds the generator from its stored config at stage 0 on `comm`
/// (world size 1) and torch::load()s the weights into it. Equivalent by hand:
///   auto g = build_sharded_model(cfg.family->generator(comm), comm, {0}, 0, cfg.model_dtype);
///   auto root = plain_module(*g);
///   torch::load(root, path);
std::unique_ptr<ShardedModel> load_exported_generator(const std::string& path, Communicator& comm,
                                                      TrainConfig* cfg_out = nullptr);

/// The first `n` latents of the fixed batch the trainer samples from (the family's
/// sample_latents from a generator seeded with cfg.seed + 4), in the model dtype; with
/// `truncation` > 0 the same draw truncated (ModelFamily::sample_truncated_latents, which
/// throws std::invalid_argument for a family without Gaussian latents).
at::Tensor fixed_latents(const TrainConfig& cfg, int64_t n, double truncation = 0);

/// The trainer's fixed sample batch {z, y}: for an unconditional family 64 latents (an 8x8
/// grid, y undefined); for a conditional one 8 per class with y = 0,..,0,1,..,1,... so that
/// grid row k shows class k; for an image-conditioned one {z, A, B}: 32 pairs, shown by
/// sample_grid as 4 triples A | G(A) | B per row: held-out pairs (held_out_images and
/// their edge maps) for data.source fashion-mnist and synthetic, the first pairs of the
/// training data for hdf5 and paired, which have no test split. `nrow` (if given) receives
/// the images per grid row (8, or 12). `truncation` as for fixed_latents.
TensorList fixed_sample_inputs(const TrainConfig& cfg, int* nrow = nullptr, double truncation = 0);

/// Local. The images of a grid of G's `out` for `inputs` (fixed_sample_inputs): `out` itself,
/// or with a third input B, the triples A | G(A) | B interleaved ([3N, C, H, W] float32; A
/// repeated to C channels).
at::Tensor sample_grid(const TensorList& inputs, const at::Tensor& out);

/// Local. `n` synthetic images (make_synthetic_images with `seed`) at the family's image
/// shape (bilinear resize and channel repeat of the 32x32 single-channel originals; stated
/// as such wherever a benchmark uses them), in the model dtype.
at::Tensor synthetic_images(const TrainConfig& cfg, int64_t n, uint64_t seed);

/// Local. The first `n` images (at most 10000) of the held-out set: Fashion-MNIST's t10k
/// split (from data.path for data.source fashion-mnist, from eval.reference for hdf5 and
/// paired, which hold no test split), else synthetic_images with seed cfg.seed + 21, which the
/// training set (seed + 17) does not share. [n, C, H, W] in the model dtype.
at::Tensor held_out_images(const TrainConfig& cfg, int64_t n);

}  // namespace shardgan
