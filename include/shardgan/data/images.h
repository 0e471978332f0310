#pragma once
/// Training images, class labels and the distributed sampler.
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>

#include <ATen/core/Tensor.h>

namespace shardgan {

/// A missing or malformed dataset file; the message names the file and what is wrong.
class DataError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Number of classes in Fashion-MNIST (T-shirt/top, Trouser, Pullover, Dress, Coat, Sandal,
/// Shirt, Sneaker, Bag, Ankle boot; label k is the k-th of these).
inline constexpr int64_t kFashionMnistClasses = 10;

/// Reads Fashion-MNIST's `<split>-images-idx3-ubyte.gz` from `dir` (Debian's
/// dataset-fashion-mnist installs it in /usr/share/datasets/fashion-mnist) with zlib.
/// `split` is "train" (60000 images) or "t10k" (10000 images).
/// Returns [N, 1, 32, 32] in `dtype`, contiguous, scaled from [0, 255] to [-1, 1], the 28x28
/// images centred and padded with -1.
/// Throws std::invalid_argument for another `split`, and DataError naming the file when it
/// is missing, cannot be decompressed, has another idx magic than 2051 (idx3, unsigned
/// bytes), images other than 28x28, or fewer or more bytes than its header says.
at::Tensor load_fashion_mnist(const std::string& dir, at::ScalarType dtype,
                              const std::string& split = "train");

/// Images load_fashion_mnist scales and pads at a time (its transient beyond the result).
constexpr int64_t kFashionMnistDecodeChunk = 4096;
/// Bytes load_fashion_mnist holds beyond its result while it decodes `n` 28x28 images into
/// a dtype of `dtype_bytes` bytes: the uint8 file, and one chunk of kFashionMnistDecodeChunk
/// images as uint8, converted and scaled. What the memory pre-flight counts for it. Pure.
constexpr int64_t fashion_mnist_decode_bytes(int64_t n, int64_t dtype_bytes) {
  const int64_t chunk = n < kFashionMnistDecodeChunk ? n : kFashionMnistDecodeChunk;
  return n * 28 * 28 + chunk * 28 * 28 * (1 + dtype_bytes);
}

/// Reads Fashion-MNIST's `<split>-labels-idx1-ubyte.gz` from `dir` with zlib.
/// `split` is "train" (60000 labels, 6000 per class) or "t10k" (10000, 1000 per class).
/// Returns int64 [N], values in [0, 10); label i belongs to image i of load_fashion_mnist
/// with the same `dir` and `split`.
/// Throws std::invalid_argument for another `split`, and DataError naming the file when it
/// is missing, cannot be decompressed, has another idx magic than 2049 (idx1, unsigned
/// bytes), fewer or more labels than its header's count, or a label >= 10.
at::Tensor load_fashion_mnist_labels(const std::string& dir, const std::string& split = "train");

/// `n` deterministic synthetic images [n, 1, 32, 32] in [-1, 1] (for tests): smooth random
/// blobs drawn from a generator seeded with `seed`.
at::Tensor make_synthetic_images(int64_t n, uint64_t seed, at::ScalarType dtype);

/// `n` deterministic synthetic labels, int64 [n], uniform in [0, num_classes), drawn from a
/// generator seeded with `seed` (the same `n`, `seed` and `num_classes` give the same labels).
/// Throws std::invalid_argument if n < 0 or num_classes < 1.
at::Tensor make_synthetic_labels(int64_t n, uint64_t seed,
                                 int64_t num_classes = kFashionMnistClasses);

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
  /// Thread-safe (the HDF5 loader's thread and the trainer both call it); the epoch's
  /// permutation is kept, so a call costs a copy of the slice, not a new randperm.
  at::Tensor indices(int64_t epoch, int64_t batch, int64_t micro = 0) const;

  int64_t batches_per_epoch() const { return dataset_size_ / global_batch_; }
  /// Samples per rank per micro-batch.
  int64_t local_batch() const { return global_batch_ / micro_batches_ / world_size_; }

 private:
  int64_t dataset_size_, global_batch_, micro_batches_;
  int rank_, world_size_;
  uint64_t seed_;
  mutable std::mutex mutex_;           // guards the cached permutation
  mutable int64_t cached_epoch_ = -1;  // the epoch of cached_perm_
  mutable at::Tensor cached_perm_;     // int64 [dataset_size]
};

}  // namespace shardgan
