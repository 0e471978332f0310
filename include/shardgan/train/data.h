#pragma once
/// Training images and the distributed sampler.
#include <cstdint>
#include <stdexcept>
#include <string>

#include <ATen/core/Tensor.h>

namespace shardgan {

/// A missing or malformed dataset file; the message names the file and what to do.
class DataError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Reads Fashion-MNIST's train-images-idx3-ubyte.gz from `dir` (Debian's
/// dataset-fashion-mnist installs it in /usr/share/datasets/fashion-mnist) with zlib.
/// Returns [60000, 1, 32, 32] in `dtype`, scaled from [0, 255] to [-1, 1], the 28x28
/// images centred and padded with -1. Throws DataError naming the file.
at::Tensor load_fashion_mnist(const std::string& dir, at::ScalarType dtype);

/// `n` deterministic synthetic images [n, 1, 32, 32] in [-1, 1] (for tests): smooth random
/// blobs drawn from a generator seeded with `seed`.
at::Tensor make_synthetic_images(int64_t n, uint64_t seed, at::ScalarType dtype);

/// Gives each rank a disjoint, contiguous slice of every global batch of each epoch's
/// seeded permutation (like torch's DistributedSampler, but batch-major, so that N ranks
/// with B/N samples see exactly the global batch one rank with B samples sees).
class DistributedSampler {
 public:
  /// Each global batch splits into `micro_batches` micro-batches (gradient accumulation),
  /// each split evenly over the ranks. Throws std::invalid_argument unless global_batch
  /// divides by micro_batches * world_size and the dataset holds one global batch.
  DistributedSampler(int64_t dataset_size, int64_t global_batch, int rank, int world_size,
                     uint64_t seed, int64_t micro_batches = 1);

  /// Indices (int64, [global_batch / micro_batches / world_size]) of this rank's part of
  /// micro-batch `micro` of batch `batch` in epoch `epoch`. Local and deterministic.
  at::Tensor indices(int64_t epoch, int64_t batch, int64_t micro = 0) const;

  int64_t batches_per_epoch() const { return dataset_size_ / global_batch_; }
  /// Samples per rank per micro-batch.
  int64_t local_batch() const { return global_batch_ / micro_batches_ / world_size_; }

 private:
  int64_t dataset_size_, global_batch_, micro_batches_;
  int rank_, world_size_;
  uint64_t seed_;
};

}  // namespace shardgan
