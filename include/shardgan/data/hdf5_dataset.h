#pragma once
/// Reading an image dataset in BigGAN-PyTorch's HDF5 layout without loading it: rows are
/// read on demand with hyperslab selections (serial HDF5, one open file per process).
///
/// Layout (what BigGAN-PyTorch's make_hdf5.py and `shardgan-data convert` write):
///   /imgs    uint8 [N, C, H, W]   pixel values 0..255
///   /labels  int64 [N]            class of each image, >= 0
///   /        attribute `classes` (optional): the class names, label k = classes[k]
/// Any storage layout (contiguous, chunked, compressed) reads; contiguous or small chunks
/// read fastest for random rows.
#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace shardgan::data {

/// Names of the two datasets of the layout.
inline constexpr const char* kImagesDataset = "imgs";
inline constexpr const char* kLabelsDataset = "labels";
/// A file of pairs (image-to-image translation, pix2pix's A -> B) adds `A` uint8
/// [N, C_A, H, W], the input image of each row, and names `imgs` also `B` (a hard link), so
/// that h5py readers see A and B and BigGAN-layout readers see imgs and labels.
inline constexpr const char* kConditionDataset = "A";
inline constexpr const char* kTargetDataset = "B";

/// How a read of rows went (for tests and benchmarks).
struct ReadStats {
  int64_t runs = 0;        ///< hyperslab reads issued (one per run of consecutive rows)
  int64_t rows_read = 0;   ///< distinct rows read from the file
  int64_t bytes_read = 0;  ///< image bytes requested from HDF5 (rows_read * C * H * W)
};

/// One open dataset file. Thread-safe: several threads may call read() at once (the HDF5
/// library serializes them). Not copyable; close by destroying.
class Hdf5Dataset {
 public:
  /// Opens `path` read-only and validates the layout (and `A`, when present: uint8 of rank
  /// 4 with the images' N, H and W). Scans `labels` once (in pieces of
  /// 64 Ki labels, so memory does not grow with N) for its smallest and largest value.
  /// Throws DataError, naming `path` and the dataset, when the file is missing or not
  /// HDF5, `imgs` or `labels` is missing (the message lists what the file holds), `imgs`
  /// is not uint8 of rank 4 with N >= 1, `labels` is not int64 of rank 1, the two
  /// disagree on N, or a label is negative, or an image holds more than 2^31 bytes
  /// (C * H * W). Before HDF5 opens the file here, a forked child reads it
  /// (h5::probe_isolated, include/shardgan/h5/probe.h): DataError, naming the file, also
  /// when that child finds it unreadable, crashes in libhdf5 or passes its deadline. Call
  /// it where no other thread is inside HDF5 (at start-up).
  explicit Hdf5Dataset(std::string path);
  ~Hdf5Dataset();
  Hdf5Dataset(const Hdf5Dataset&) = delete;
  Hdf5Dataset& operator=(const Hdf5Dataset&) = delete;

  const std::string& path() const { return path_; }
  int64_t size() const { return n_; }  ///< N, images in the file
  int64_t channels() const { return c_; }
  int64_t height() const { return h_; }
  int64_t width() const { return w_; }
  int64_t image_numel() const { return c_ * h_ * w_; }  ///< bytes per stored image
  int64_t min_label() const { return min_label_; }
  /// Channels of `A` in a file of pairs; 0 when the file has no `A`.
  int64_t condition_channels() const { return ca_; }
  int64_t max_label() const { return max_label_; }

  /// The root attribute `classes` (strings, label k = classes[k]), or {} when the file has
  /// none. Throws DataError naming the file if it exists but is not a 1-D string array, or
  /// holds more names, or longer fixed-length names, than the reader's bounds (it says
  /// which).
  std::vector<std::string> class_names() const;

  /// Throws DataError naming the file and `labels` unless every label is < num_classes.
  void check_labels(int64_t num_classes) const;

  /// Images `indices` (int64 [n], any order, repeats allowed, each in [0, N)) as
  /// [n, C, H, W] of `dtype` (a floating type), contiguous, on the CPU, row i from image
  /// indices[i]: the stored byte b becomes b / 127.5 - 1 (so [0, 255] -> [-1, 1]), computed
  /// exactly as load_fashion_mnist computes it. Distinct indices are sorted and each run of
  /// consecutive ones is read with one hyperslab. Labels are int64 [n] (undefined unless
  /// `labels` is true). Throws std::out_of_range for an index outside [0, N), DataError
  /// naming the file and dataset when a read fails.
  void read(const at::Tensor& indices, at::ScalarType dtype, at::Tensor* images, at::Tensor* labels,
            ReadStats* stats = nullptr) const;

  /// A file of pairs: the input images A of `indices` as [n, C_A, H, W] of `dtype`, scaled
  /// as read() scales images. Throws std::logic_error for a file without `A`, and as read().
  at::Tensor read_condition(const at::Tensor& indices, at::ScalarType dtype) const;

  /// The stored bytes of `indices`, uint8 [n, C, H, W] (read() before scaling).
  at::Tensor read_raw(const at::Tensor& indices, ReadStats* stats = nullptr) const;

 private:
  // Reads the stored rows (uint8 images, int64 labels, uint8 A of a file of pairs) of
  // `indices`; any output may be null. Only `imgs` rows count in `stats`.
  void read_rows_raw(const at::Tensor& indices, at::Tensor* images, at::Tensor* labels, ReadStats* stats,
                     at::Tensor* condition = nullptr) const;

  std::string path_;
  int64_t file_ = -1, imgs_ = -1, labels_ = -1, a_ = -1;  // hid_t
  int64_t n_ = 0, c_ = 0, h_ = 0, w_ = 0, ca_ = 0;
  int64_t min_label_ = 0, max_label_ = 0;
};

/// Same scaling as read(): uint8 [..] -> `dtype`, b / 127.5 - 1.
at::Tensor scale_pixels(const at::Tensor& raw, at::ScalarType dtype);

}  // namespace shardgan::data
