#pragma once
/// One file of the disk tier, read and written asynchronously with O_DIRECT through
/// io_uring (Debian's liburing), the way DeepSpeed's async I/O library drives NVMe for
/// ZeRO-Infinity (Rajbhandari et al. 2021, Sec. 6.3). Local: no communication. No torch.
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

namespace shardgan {

/// An offload file could not be created, reserved, read or written. The message names the
/// path, the byte offset where it applies, the system error and what to do.
class OffloadError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class DirectFile {
 public:
  /// Alignment (bytes) of every offset, length and buffer address passed to submit_*.
  static constexpr int64_t kAlign = 4096;

  /// Creates `path` (replacing a file of that name: a leftover of a killed run is never
  /// read), takes an exclusive flock on it (another live process using it is an error),
  /// and reserves `bytes` with posix_fallocate, so that a disk too small fails here, at
  /// start, and never in the middle of a step. Opens with O_DIRECT; a filesystem that
  /// refuses it (EINVAL: ramfs, some network filesystems) gets buffered I/O instead and
  /// direct() is false (the caller logs a warning). `queue_depth`: io_uring entries, 1-4096.
  /// Throws OffloadError naming the path for every failure.
  DirectFile(std::string path, int64_t bytes, int queue_depth);
  /// Waits for requests in flight, closes and removes the file (its contents are scratch:
  /// the checkpoint is the only durable state).
  ~DirectFile();
  DirectFile(const DirectFile&) = delete;
  DirectFile& operator=(const DirectFile&) = delete;

  /// Starts reading `bytes` at byte `offset` into `buf` and returns a ticket for wait().
  /// offset, bytes and buf must be multiples of kAlign (std::invalid_argument otherwise),
  /// and the range inside the file. `buf` must stay valid until the request completes.
  uint64_t submit_read(int64_t offset, void* buf, int64_t bytes);
  /// Starts writing; as submit_read.
  uint64_t submit_write(int64_t offset, const void* buf, int64_t bytes);
  /// Blocks until request `ticket` has completed (short transfers are resubmitted).
  /// Throws OffloadError naming the path, the offset and the error (ENOSPC: disk full).
  void wait(uint64_t ticket);
  /// Waits for every request in flight; throws as wait() for the first failure.
  void wait_all();

  bool direct() const { return direct_; }
  const std::string& path() const { return path_; }
  int64_t size_bytes() const { return bytes_; }
  /// Bytes read and written since construction.
  int64_t bytes_read() const { return bytes_read_; }
  int64_t bytes_written() const { return bytes_written_; }

 private:
  struct Ring;
  uint64_t submit(bool write, int64_t offset, void* buf, int64_t bytes);
  void reap_one();
  [[noreturn]] void fail(const std::string& what, int err, int64_t offset) const;

  std::string path_;
  int64_t bytes_ = 0;
  int fd_ = -1;
  bool direct_ = true;
  int64_t bytes_read_ = 0, bytes_written_ = 0;
  std::unique_ptr<Ring> ring_;
};

}  // namespace shardgan
