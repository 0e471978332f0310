#pragma once
/// The trainer's data: the real images' source (Fashion-MNIST, synthetic, a paired A|B
/// folder, an HDF5 file with its read-ahead loader, or tensors the caller gives), the
/// sampler that cuts each global batch into micro-batches and ranks, and the latent
/// sampler's generator. Every rank draws the whole global batch of latents and keeps its
/// slices, so the latents do not depend on the world size.
#include <cstdint>
#include <memory>
#include <mutex>

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include "shardgan/sharding/sharded_unit.h"

namespace shardgan {

namespace data {
class Hdf5Dataset;
class Hdf5Loader;
}  // namespace data
class DistributedSampler;
class ModelFamily;
struct TrainConfig;
struct TrainCounters;

class DataPipeline {
 public:
  /// `data_rank` of `data_size`: this rank's slice of each micro-batch (the world's rank,
  /// or under split placement its group's). `reads_data`: whether this rank reads real
  /// images (split placement: D's ranks, and G's too for paired data). `images` [N, C, H,
  /// W] and `labels` [N] (or the A images of pairs), when given, replace the configured
  /// source. Throws ConfigError naming data.path or the model key when the data does not
  /// fit the model (shape, classes, condition channels). Local; `cfg` and `family` must
  /// outlive the pipeline. `log`: this rank logs what it read (the world's rank 0).
  DataPipeline(const TrainConfig& cfg, const ModelFamily& family, int data_rank, int data_size, bool reads_data,
               bool log, at::Tensor images = {}, at::Tensor labels = {});
  /// Stops the read-ahead thread before the file it reads is closed.
  ~DataPipeline();

  /// G's inputs for one whole global batch, {z [B, ...] in the model dtype, y int64 [B] or
  /// undefined}, the same on every rank. Local.
  TensorList draw_latents();
  /// Standard normals of shape `sizes` in `dtype` from the latents' generator (the same on
  /// every rank; checkpointed with it). Local.
  at::Tensor draw_normal(at::IntArrayRef sizes, at::ScalarType dtype);
  /// This rank's part of micro-batch `micro` of a tensor whose dim 0 is split like a
  /// global batch (train.micro_batches equal micro-batches, each in equal shares over the
  /// data ranks): the global batch, or a part of it such as the path-length batch. Local.
  at::Tensor local_micro(const at::Tensor& global, int64_t micro) const;
  /// This rank's part of micro-batch `micro` of the next real global batch: {x, y} (or
  /// {B, A} for pairs). micro 0 moves to the next global batch and advances `counters`'
  /// epoch and batch_in_epoch. Local.
  TensorList real_micro(int64_t micro, TrainCounters& counters);

  /// Where the data stands: the real batch the current D step reads and the latent
  /// generator's state (a preemption's step start, given back when the step is abandoned).
  struct Position {
    int64_t batch_epoch = 0, batch_index = 0;
    at::Tensor noise_state;
  };
  Position position() const;
  void restore(const Position& p);
  at::Tensor noise_state() const;
  void set_noise_state(const at::Tensor& s);
  /// A resume: the read-ahead (HDF5 loader) starts again at that epoch and batch.
  void restart(int64_t epoch, int64_t batch_in_epoch);
  /// For a fork snapshot: holds the loader's reads (no HDF5 lock copied mid-read); empty
  /// lock without a loader.
  std::unique_lock<std::mutex> pause_reads();
  /// Global batches per epoch (0 when this rank reads no data).
  int64_t batches_per_epoch() const;

 private:
  void load_images(at::Tensor images, at::Tensor labels);
  const TrainConfig& cfg_;
  const ModelFamily& family_;
  int data_rank_, data_size_;
  bool log_;
  at::Tensor images_, labels_;
  std::unique_ptr<DistributedSampler> sampler_;
  std::unique_ptr<data::Hdf5Dataset> dataset_;  // data.source hdf5: the open file
  std::unique_ptr<data::Hdf5Loader> loader_;    // its read-ahead thread (destroyed first)
  at::Generator noise_gen_;
  int64_t batch_epoch_ = 0, batch_index_ = 0;  // the real batch the current D step reads
};

}  // namespace shardgan
