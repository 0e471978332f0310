#pragma once
/// One file of the disk tier, read and written asynchronously with O_DIRECT through
/// io_uring (Debian's liburing), the way DeepSpeed's async I/O library drives NVMe for
/// ZeRO-Infinity (Rajbhandari et al. 2021, Sec. 6.3). Local: no communication. No torch.
#include <cstdint>
#include <map>
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

/// Test hook: I/O faults to inject into every DirectFile of this process, keyed by the
/// 0-based index of the operation (counted process-wide from set_io_faults()): a
/// completion ("c<i>") or an io_uring_submit call ("s<i>"). Tests set it directly or
/// through the environment variable SHARDGAN_TEST_IO_FAULTS, read when the first
/// DirectFile is made, e.g. "c3=short,c5=eagain,c9=eio,s2=ebusy,s4=eio". Kinds:
/// short (the transfer reports 512 bytes fewer than it moved, leaving a misaligned
/// remainder), eagain, eio, enospc, einval (the filesystem refuses O_DIRECT on I/O) at a
/// completion; ebusy (transient) or eio (fatal) at a submit. Never set in production.
struct IoFaultPlan {
  std::map<int64_t, std::string> completion;  ///< completion index -> kind
  std::map<int64_t, std::string> submit;      ///< submit call index -> kind
};
/// Replaces the process-wide plan and restarts the operation counters. Throws
/// std::invalid_argument for an unknown kind.
void set_io_faults(const IoFaultPlan& plan);
/// Parses "c3=short,s2=ebusy" (the environment variable's format); throws
/// std::invalid_argument naming the bad item.
IoFaultPlan parse_io_faults(const std::string& text);

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
  /// Waits for requests in flight (at most 30 s: a request that never completes is left
  /// to the kernel), removes the file, then closes it: the flock is held until the name is
  /// gone, so another run cannot take the file in between. Its contents are scratch: the
  /// checkpoint is the only durable state.
  ~DirectFile();
  DirectFile(const DirectFile&) = delete;
  DirectFile& operator=(const DirectFile&) = delete;

  /// Starts reading `bytes` at byte `offset` into `buf` and returns a ticket for wait().
  /// offset, bytes and buf must be multiples of kAlign (std::invalid_argument otherwise),
  /// and the range inside the file. `buf` must stay valid until the request completes.
  uint64_t submit_read(int64_t offset, void* buf, int64_t bytes);
  /// Starts writing; as submit_read.
  uint64_t submit_write(int64_t offset, const void* buf, int64_t bytes);
  /// Blocks until request `ticket` has completed. Short transfers are resubmitted from the
  /// last kAlign boundary reached (O_DIRECT needs aligned offsets), EAGAIN and EINTR are
  /// retried (up to 64 times without progress), and an EINVAL from a filesystem that
  /// accepted O_DIRECT at open but refuses it on I/O switches the file to buffered I/O and
  /// retries. Throws OffloadError naming the path, the offset and the error (ENOSPC: disk
  /// full); the other requests stay valid.
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
  struct Request;
  uint64_t submit(bool write, int64_t offset, void* buf, int64_t bytes);
  /// Queues request `r` under `ticket` and submits it (retrying transient submit errors);
  /// returns 0, or the errno with which it was reported failed (in the done map).
  int enqueue(uint64_t ticket, const Request& r);
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
