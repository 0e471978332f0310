#pragma once
/// Writing BigGAN-PyTorch's HDF5 layout (see hdf5_dataset.h): `shardgan-data convert`.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace shardgan::data {

/// Default images per HDF5 chunk of `imgs`: 0, a contiguous dataset. Random rows read
/// ~55x faster from a contiguous uncompressed dataset than from chunks of 16 or 256
/// images (bench_loader, docs/data.md: 36000 vs 650 images/s per rank from the page cache).
inline constexpr int64_t kDefaultChunkImages = 0;

/// Streams N images and labels into a new file. The file is written as `path` + ".tmp"
/// and renamed to `path` by commit() after an fsync, so that `path` is never a partial
/// file; the destructor removes the temporary file of an uncommitted writer. Throws
/// DataError naming the file (and dataset) when a write fails.
class Hdf5Writer {
 public:
  /// `n` images of [c, h, w] uint8, uncompressed; chunk_images = 0: both datasets
  /// contiguous; else `imgs` is chunked by `chunk_images` images (clamped to [1, n]) and
  /// `labels` by 64 Ki labels. With `a_channels` > 0 the file holds pairs (hdf5_dataset.h):
  /// also `A` uint8 [n, a_channels, h, w] (chunked as `imgs`), and `B`, a hard link to `imgs`.
  Hdf5Writer(std::string path, int64_t n, int64_t c, int64_t h, int64_t w, int64_t chunk_images = kDefaultChunkImages,
             int64_t a_channels = 0);
  ~Hdf5Writer();
  Hdf5Writer(const Hdf5Writer&) = delete;
  Hdf5Writer& operator=(const Hdf5Writer&) = delete;

  /// Appends `count` images (count * c * h * w bytes, [count, c, h, w] row-major) and
  /// their labels (count int64, each >= 0), and for a file of pairs their input images
  /// `a` ([count, a_channels, h, w]; required then, ignored otherwise). Throws
  /// std::invalid_argument past N images, for a negative label, or a missing `a`.
  void append(const uint8_t* images, const int64_t* labels, int64_t count, const uint8_t* a = nullptr);
  /// Stores the class names as the root attribute `classes` (variable-length UTF-8 strings).
  void set_classes(const std::vector<std::string>& names);
  /// Throws std::logic_error unless exactly N images were appended; then flushes, fsyncs,
  /// closes and renames the file into place.
  void commit();
  int64_t written() const { return written_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string path_, tmp_;
  int64_t n_, row_bytes_, a_row_bytes_, written_ = 0;
  bool committed_ = false;
};

/// What a conversion wrote.
struct ConvertResult {
  int64_t images = 0, channels = 0, height = 0, width = 0;
  std::vector<std::string> classes;  ///< label k = classes[k]
  int64_t skipped_files = 0;         ///< ImageFolder: files without an image extension
};

/// Fashion-MNIST's idx files `dir`/<split>-{images-idx3,labels-idx1}-ubyte.gz -> `out`:
/// [N, 1, 32, 32], the 28x28 images centred and padded with 0 bytes, so that
/// Hdf5Dataset::read gives exactly load_fashion_mnist's values (the conversion checks it).
/// With `edge_pairs`, a file of pairs: each image is B, and A is its Sobel edge map
/// (sobel_edges, edges.h) as bytes 0 / 255, which read back as exactly sobel_edges' -1 / 1.
/// Throws DataError as load_fashion_mnist does, or naming `out`.
ConvertResult convert_fashion_mnist(const std::string& dir, const std::string& split, const std::string& out,
                                    int64_t chunk_images = kDefaultChunkImages, bool edge_pairs = false);

/// The pix2pix folder layout -> a file of pairs: every image file directly in `dir` (sorted
/// by name; .png, .jpg, .jpeg, .bmp, .pgm, .ppm, .tga) holds A and B side by side, A the
/// left half and B the right half (the authors' AtoB direction), as facades, edges2shoes and
/// maps ship. Each half is decoded into `channels` with stb_image and resized to size x size
/// with stb_image_resize (a copy when already that size); labels are 0. Throws DataError
/// naming the folder or file when there is no image, a file cannot be decoded or its width
/// is odd; std::invalid_argument for a bad size or channel count.
ConvertResult convert_paired_folder(const std::string& dir, const std::string& out, int64_t size, int64_t channels,
                                    int64_t chunk_images = kDefaultChunkImages);

/// torchvision's ImageFolder -> `out`: classes are the sorted names of the subfolders of
/// `dir` (label = index), images every .png/.jpg/.jpeg/.bmp/.pgm/.ppm/.tga file under each
/// (recursively, sorted by path), decoded with stb_image into `channels` (1: grey, 3: RGB;
/// stb converts, alpha dropped), centre-cropped to a square on the long edge and resized
/// to size x size with stb_image_resize (a copy when already that size). Throws
/// DataError naming the folder or file when there are no class folders, a class holds no
/// image, or a file cannot be decoded; std::invalid_argument for size < 1 or another
/// channel count.
ConvertResult convert_image_folder(const std::string& dir, const std::string& out, int64_t size, int64_t channels,
                                   int64_t chunk_images = kDefaultChunkImages);

/// The Fashion-MNIST class names, label k = kFashionMnistClassNames[k].
extern const std::vector<std::string> kFashionMnistClassNames;

}  // namespace shardgan::data
