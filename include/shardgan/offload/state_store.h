#pragma once
/// Per-rank training state kept off the model (ZeRO-Offload's host memory, ZeRO-Infinity's
/// NVMe), streamed chunk by chunk through a bounded ring of buffers. Local: no
/// communication. No torch: elements are raw bytes, each array with its own element size
/// (a float32 master shard 4, a bfloat16 gradient 2, 8-bit Adam codes 1).
///
/// A store holds the same arrays for every unit (e.g. Adam's exp_avg and exp_avg_sq), unit
/// u's arrays having unit_numel[u] elements each. All start at zero.
///   - cpu:  one aligned host allocation per array (pinned with CUDA, see host_memory.h).
///   - disk: one file, `<offload.path>/<stem>.offload`, holding every array of every unit,
///     each region aligned to 4096 bytes; read and written with O_DIRECT (direct_file.h).
/// stream() hands the caller every chunk of the units asked for, in order. On disk, the
/// read of chunk k+1 (and k+2 ...) and the write-back of chunk k-1 run while the caller
/// works on chunk k (ZeRO-Infinity, Rajbhandari et al. 2021, Sec. 6.2: overlap-centric
/// design), in buffer_count buffers of buffer_bytes each, whatever the model size.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "shardgan/offload/offload_config.h"

namespace shardgan {

class DirectFile;

class OffloadStore {
 public:
  /// What stream() does with each chunk.
  enum class Mode {
    kRead,    ///< read it for the callback, do not write it back (checkpoint save)
    kUpdate,  ///< read it, let the callback change it, write it back (optimizer step)
    kWrite,   ///< do not read it; the callback fills it and it is written (checkpoint load)
  };

  /// One chunk: elements [offset, offset + numel) of unit `unit`. data[a] points at array
  /// a's elements (a ring buffer on disk; the host arrays themselves for cpu). scratch[s]
  /// points at `scratch_arrays` staging areas of numel elements each (the caller's copies
  /// of the parameter and gradient chunk, for instance), always in the ring.
  struct Chunk {
    size_t unit = 0;
    int64_t offset = 0;
    int64_t numel = 0;
    std::vector<void*> data;
    std::vector<void*> scratch;
  };

  /// Builds the store and its ring: cfg.buffer_count buffers (one for cpu, which has no
  /// I/O to overlap) of at most cfg.buffer_bytes, each split into one slice of one chunk
  /// per array and per staging area (only the staging slices for cpu, whose arrays stay in
  /// memory; no chunk is longer than the largest unit). `array_bytes[a]` is array a's
  /// element size and `scratch_bytes[s]` staging area s's, each dividing 4096. A chunk's
  /// element count is a multiple of `chunk_multiple` (e.g. an 8-bit state's block, so no
  /// block spans two chunks) and of what makes every slice a whole number of 4096-byte
  /// blocks. Disk: creates and reserves the file in the folder cfg.path, which must exist.
  /// Throws std::invalid_argument for a device of kNone, a bad element size, or a buffer
  /// too small for one such chunk (naming the bytes needed), OffloadError (naming the
  /// path) when the file cannot be created or reserved.
  OffloadStore(OffloadDevice device, const OffloadConfig& cfg, const std::string& stem,
               std::vector<int64_t> unit_numel, std::vector<int64_t> array_bytes, std::vector<int64_t> scratch_bytes,
               int64_t chunk_multiple = 1);
  /// `arrays` arrays and `scratch_arrays` staging areas, all of `elem_bytes`.
  OffloadStore(OffloadDevice device, const OffloadConfig& cfg, const std::string& stem,
               std::vector<int64_t> unit_numel, int arrays, int scratch_arrays, int64_t elem_bytes);
  ~OffloadStore();
  OffloadStore(const OffloadStore&) = delete;
  OffloadStore& operator=(const OffloadStore&) = delete;

  /// Calls fn on every chunk of `units` (in the order given, each unit front to back).
  /// fn must not keep the pointers. Only the arrays whose bit is set in `arrays` are read
  /// or written (the others' data[a] are nullptr): a gather reads the master parameters
  /// alone, not the moments beside them. Of those, only the ones set in `written` are
  /// written back in kUpdate mode (the optimizer step reads the gradient, and does not
  /// write it). Throws OffloadError from the disk (after waiting for whatever is still in
  /// flight) and rethrows fn's exceptions the same way.
  static constexpr uint32_t kAllArrays = ~uint32_t{0};
  void stream(const std::vector<size_t>& units, Mode mode, const std::function<void(const Chunk&)>& fn,
              uint32_t arrays = kAllArrays, uint32_t written = kAllArrays);

  /// cpu tier only: array `a` of unit `unit` itself (unit_numel[unit] elements of
  /// array_bytes(a)), for a
  /// caller that pipelines its own copies across chunks (OffloadedAdam's step). Valid for
  /// the store's lifetime. Throws std::logic_error on the disk tier, std::out_of_range for
  /// a bad index.
  void* host_array(size_t unit, int a) const;
  /// cpu tier only: staging slice `s` of the ring, chunk_numel() elements of
  /// scratch_bytes(s), the memory stream() hands out as Chunk::scratch[s]. Throws as host_array.
  void* staging(int s) const;

  OffloadDevice device() const { return device_; }
  /// Units the store was made for, and the elements of each array of unit `u`.
  size_t unit_count() const { return numel_.size(); }
  int64_t unit_numel(size_t u) const { return numel_.at(u); }
  /// Elements of one array in a full chunk (every slice a multiple of 4096 bytes).
  int64_t chunk_numel() const { return chunk_numel_; }
  /// Element size of array `a`, of staging area `s` (bytes).
  int64_t array_bytes(int a) const { return elem_.at(static_cast<size_t>(a)); }
  int64_t scratch_bytes(int s) const { return elem_.at(static_cast<size_t>(arrays_ + s)); }
  /// Host memory this store holds: the ring, plus the arrays for cpu (bytes).
  int64_t ram_bytes() const;
  /// Bytes of the disk file (0 for cpu).
  int64_t disk_bytes() const;
  /// Bytes of state (every array of every unit, unpadded).
  int64_t state_bytes() const;
  /// Disk: whether the file is opened with O_DIRECT (false after the buffered fallback).
  bool direct() const;
  /// Disk: the file's path ("" for cpu).
  std::string path() const;
  /// Disk: bytes read and written so far.
  int64_t bytes_read() const;
  int64_t bytes_written() const;

 private:
  struct HostArray;
  OffloadDevice device_;
  std::vector<int64_t> numel_;
  int arrays_, scratch_;
  std::vector<int64_t> elem_;        // element bytes: the arrays, then the staging areas
  std::vector<int64_t> slice_off_;   // byte offset of each ring slice in a buffer (from ring_first_)
  int64_t ring_stride_ = 0;          // bytes of one ring buffer
  int64_t buffer_bytes_, buffer_count_;
  int64_t chunk_numel_ = 0;
  int ring_first_ = 0;   // first slice kept in the ring (arrays_ for cpu: only its scratch)
  int ring_slices_ = 0;  // slices per ring buffer
  std::vector<int64_t> region_;          // disk: byte offset of (unit, array) = region_[u*arrays+a]
  std::vector<std::unique_ptr<HostArray>> host_;  // cpu: one per (unit, array); ring buffers
  std::unique_ptr<DirectFile> file_;
  std::unique_ptr<HostArray> ring_;
};

}  // namespace shardgan
