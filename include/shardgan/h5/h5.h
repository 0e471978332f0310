#pragma once
/// A small RAII layer over the HDF5 C API (serial; one file per rank). Every C call is
/// checked; a failure throws H5Error with the file, the object path and HDF5's own
/// error stack. Torch-free: data moves as raw buffers with an explicit DType.
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace shardgan::h5 {

class H5Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Element types stored on disk (little-endian IEEE / two's complement).
enum class DType { kF32, kF64, kI64, kU8 };
int64_t dtype_bytes(DType t);
const char* dtype_name(DType t);

class File {
 public:
  /// Creates (truncating) `path` for writing. Throws H5Error naming the path.
  static File create(const std::string& path);
  /// Opens `path` read-only. Throws H5Error naming the path if missing or not HDF5.
  static File open_read(const std::string& path);
  /// Opens an existing `path` for reading and writing (tools and tests).
  static File open_rw(const std::string& path);

  File(File&& o) noexcept;
  File& operator=(File&& o) noexcept;
  File(const File&) = delete;
  ~File();

  /// Writes a contiguous dataset at `path` ("a/b/c"; groups are created as needed).
  /// `shape` in elements; `data` holds product(shape) elements of `dt`.
  void write(const std::string& path, DType dt, const std::vector<int64_t>& shape,
             const void* data);
  /// Reads dataset `path` into `out`, which must hold `numel` elements of `dt`. Throws
  /// H5Error if the dataset is missing or its element count or type class differs.
  void read(const std::string& path, DType dt, void* out, int64_t numel) const;
  /// Reads elements [start, start + count) of the 1-D dataset `path` (a hyperslab read:
  /// only those bytes are read). Throws H5Error if the range is out of bounds.
  void read_range(const std::string& path, DType dt, int64_t start, int64_t count,
                  void* out) const;
  /// One range of a 1-D dataset for read_ranges: elements [start, start + count) into `out`.
  struct Range {
    int64_t start = 0, count = 0;
    void* out = nullptr;
  };
  /// Reads several ranges of the 1-D dataset `path` in order, opening it once. `done(i)`,
  /// if given, is called as soon as range i is in memory (before range i + 1 is read), so
  /// that a caller can work on it while the next one is read. Throws H5Error (naming the
  /// range) if a range is out of bounds or a read fails.
  void read_ranges(const std::string& path, DType dt, const std::vector<Range>& ranges,
                   const std::function<void(size_t)>& done = {}) const;
  /// Tells the OS that the file will be read sequentially (POSIX_FADV_SEQUENTIAL on
  /// HDF5's own descriptor: a larger readahead window). A hint: does nothing for a file
  /// driver without a POSIX descriptor.
  void advise_sequential() const;
  /// Shape of dataset `path` (elements per dimension).
  std::vector<int64_t> shape(const std::string& path) const;
  /// Stored element type of dataset `path`; throws H5Error for a type DType cannot name.
  DType dtype(const std::string& path) const;
  /// Byte offset of a contiguous dataset's data in the file (tests corrupt it there).
  int64_t data_offset(const std::string& path) const;

  /// Writes `text` as a scalar fixed-length UTF-8 string dataset (no size limit, unlike an
  /// attribute's 64 KiB), and reads it back.
  void write_string(const std::string& path, const std::string& text);
  std::string read_string(const std::string& path) const;

  /// One piece of a virtual dataset: elements [src_start, src_start + numel) of the 1-D
  /// dataset `src_dataset` (src_numel elements long) in file `src_file` (relative names resolve against the directory
  /// of the file holding the virtual dataset) fill the box at `start` of extent `count`.
  struct VirtualPiece {
    std::string src_file, src_dataset;
    int64_t src_numel = 0;  // the source dataset's length
    int64_t src_start = 0;
    std::vector<int64_t> start, count;  // box in the virtual dataset; product(count) elements
  };
  /// Creates a virtual dataset (HDF5 VDS) of `shape` and `dt` made of `pieces`; unmapped
  /// elements read as 0.
  void write_virtual(const std::string& path, DType dt, const std::vector<int64_t>& shape,
                     const std::vector<VirtualPiece>& pieces);
  bool exists(const std::string& path) const;

  /// Attributes on the object at `obj` ("/" for the root), overwritten if present.
  void set_attr(const std::string& obj, const std::string& name, int64_t v);
  void set_attr(const std::string& obj, const std::string& name, double v);
  void set_attr(const std::string& obj, const std::string& name, const std::string& v);
  int64_t attr_int(const std::string& obj, const std::string& name) const;
  double attr_double(const std::string& obj, const std::string& name) const;
  std::string attr_string(const std::string& obj, const std::string& name) const;

  /// Flushes HDF5's buffers to the OS (pair with an fsync of the file for durability).
  void flush();
  /// Closes the file now (the destructor does it too, without throwing).
  void close();
  const std::string& path() const { return path_; }

 private:
  File(int64_t id, std::string path) : id_(id), path_(std::move(path)) {}
  int64_t id_ = -1;
  std::string path_;
};

/// fsyncs a file or directory so that a rename after it is durable. Throws
/// std::runtime_error naming the path and errno's text.
/// Test hook: SHARDGAN_TEST_FSYNC_FAULTS="i,j,..." makes this process's i-th, j-th, ...
/// call (0-based, counted from the first call) fail as fsync does on a failed write-back
/// (EIO), with a line on stderr naming the call (the chaos campaign's fsync fault).
void fsync_path(const std::string& path);

}  // namespace shardgan::h5
