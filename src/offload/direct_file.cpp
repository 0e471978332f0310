#include "shardgan/offload/direct_file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>

#include <liburing.h>

namespace shardgan {

namespace {

struct Request {
  bool write = false;
  int64_t offset = 0;   // next byte to transfer
  char* buf = nullptr;  // next buffer byte
  int64_t left = 0;     // bytes still to transfer
  int error = 0;        // errno of a failed request (0: fine)
  int64_t failed_at = 0;
};

std::string errno_text(int err) { return std::string(std::strerror(err)) + " (errno " + std::to_string(err) + ")"; }

}  // namespace

struct DirectFile::Ring {
  io_uring ring{};
  bool ready = false;
  uint64_t next_ticket = 1;
  std::map<uint64_t, Request> pending;  // in flight or resubmitted
  std::map<uint64_t, Request> done;     // completed, not yet waited for
  unsigned in_flight = 0;
  unsigned depth = 0;
};

DirectFile::DirectFile(std::string path, int64_t bytes, int queue_depth)
    : path_(std::move(path)), bytes_(bytes), ring_(std::make_unique<Ring>()) {
  if (bytes < 0 || bytes % kAlign != 0) {
    throw std::invalid_argument("offload file '" + path_ + "': size " + std::to_string(bytes) +
                                " is not a multiple of " + std::to_string(kAlign));
  }
  if (queue_depth < 1 || queue_depth > 4096) {
    throw std::invalid_argument("offload file '" + path_ + "': queue depth must be 1 to 4096");
  }
  // No O_TRUNC here: a live run's file must not be emptied before its lock is seen.
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0600);
  if (fd_ < 0 && errno == EINVAL) {
    direct_ = false;
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  }
  if (fd_ < 0) {
    const int e = errno;
    throw OffloadError("offload file '" + path_ + "': cannot create it: " + errno_text(e) +
                       ". Set offload.path to a writable folder on a local disk");
  }
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int e = errno;
    ::close(fd_);
    throw OffloadError("offload file '" + path_ + "' is locked by another process (" + errno_text(e) +
                       "): another run uses the same offload.path; give this run its own");
  }
  // A file left by a killed run is emptied (never read as state), then reserved anew.
  if (::ftruncate(fd_, 0) != 0) {
    const int e = errno;
    ::close(fd_);
    throw OffloadError("offload file '" + path_ + "': cannot truncate it: " + errno_text(e));
  }
  if (bytes_ > 0) {
    const int e = ::posix_fallocate(fd_, 0, bytes_);
    if (e != 0) {
      ::close(fd_);
      ::unlink(path_.c_str());
      throw OffloadError("offload file '" + path_ + "': cannot reserve " + std::to_string(bytes_) +
                         " bytes: " + errno_text(e) +
                         (e == ENOSPC ? ". The disk is too small: free space, or point offload.path at a larger disk"
                                      : ". Point offload.path at a local disk"));
    }
  }
  const int e = io_uring_queue_init(static_cast<unsigned>(queue_depth), &ring_->ring, 0);
  if (e < 0) {
    ::close(fd_);
    ::unlink(path_.c_str());
    throw OffloadError("offload file '" + path_ + "': io_uring_queue_init failed: " + errno_text(-e) +
                       ". The kernel or a seccomp policy refuses io_uring (Linux >= 5.6 needed)");
  }
  ring_->ready = true;
  ring_->depth = static_cast<unsigned>(queue_depth);
}

DirectFile::~DirectFile() {
  if (ring_ && ring_->ready) {
    while (ring_->in_flight > 0) {
      io_uring_cqe* cqe = nullptr;
      if (io_uring_wait_cqe(&ring_->ring, &cqe) < 0) break;
      io_uring_cqe_seen(&ring_->ring, cqe);
      --ring_->in_flight;
    }
    io_uring_queue_exit(&ring_->ring);
  }
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(path_.c_str());
  }
}

void DirectFile::fail(const std::string& what, int err, int64_t offset) const {
  throw OffloadError("offload file '" + path_ + "': " + what + " at byte " + std::to_string(offset) + " failed: " +
                     errno_text(err) +
                     (err == ENOSPC ? ". The disk is full: free space or move offload.path" : ""));
}

uint64_t DirectFile::submit_read(int64_t offset, void* buf, int64_t bytes) {
  return submit(false, offset, buf, bytes);
}

uint64_t DirectFile::submit_write(int64_t offset, const void* buf, int64_t bytes) {
  return submit(true, offset, const_cast<void*>(buf), bytes);
}

uint64_t DirectFile::submit(bool write, int64_t offset, void* buf, int64_t bytes) {
  if (offset % kAlign || bytes % kAlign || reinterpret_cast<uintptr_t>(buf) % kAlign || bytes <= 0 ||
      offset < 0 || offset + bytes > bytes_) {
    throw std::invalid_argument("offload file '" + path_ + "': request of " + std::to_string(bytes) +
                                " bytes at " + std::to_string(offset) + " is misaligned or outside the file (" +
                                std::to_string(bytes_) + " bytes)");
  }
  const uint64_t t = ring_->next_ticket++;
  Request r;
  r.write = write;
  r.offset = offset;
  r.buf = static_cast<char*>(buf);
  r.left = bytes;
  auto& ring = ring_->ring;
  while (ring_->in_flight >= ring_->depth) reap_one();
  io_uring_sqe* sqe = io_uring_get_sqe(&ring);
  if (!sqe) {  // the submission queue is full of unsubmitted entries
    io_uring_submit(&ring);
    sqe = io_uring_get_sqe(&ring);
    if (!sqe) fail("io_uring_get_sqe", EBUSY, offset);
  }
  // One request moves at most 1 GiB; longer ones continue on resubmission.
  const unsigned len = static_cast<unsigned>(std::min<int64_t>(r.left, int64_t{1} << 30));
  if (write) io_uring_prep_write(sqe, fd_, r.buf, len, static_cast<uint64_t>(r.offset));
  else io_uring_prep_read(sqe, fd_, r.buf, len, static_cast<uint64_t>(r.offset));
  io_uring_sqe_set_data64(sqe, t);
  const int e = io_uring_submit(&ring);
  if (e < 0) fail(write ? "io_uring_submit (write)" : "io_uring_submit (read)", -e, offset);
  ++ring_->in_flight;
  ring_->pending.emplace(t, r);
  return t;
}

void DirectFile::reap_one() {
  io_uring_cqe* cqe = nullptr;
  int e;
  do {
    e = io_uring_wait_cqe(&ring_->ring, &cqe);
  } while (e == -EINTR);
  if (e < 0) fail("io_uring_wait_cqe", -e, 0);
  const uint64_t t = io_uring_cqe_get_data64(cqe);
  const int res = cqe->res;
  io_uring_cqe_seen(&ring_->ring, cqe);
  --ring_->in_flight;
  auto it = ring_->pending.find(t);
  if (it == ring_->pending.end()) return;
  Request r = it->second;
  ring_->pending.erase(it);
  if (res == -EAGAIN || res == -EINTR) {
    // Retry the same range.
  } else if (res < 0) {
    r.error = -res;
    r.failed_at = r.offset;
    ring_->done.emplace(t, r);
    return;
  } else if (res == 0) {  // nothing moved: past the end of the file
    r.error = r.write ? ENOSPC : EIO;
    r.failed_at = r.offset;
    ring_->done.emplace(t, r);
    return;
  } else {
    (r.write ? bytes_written_ : bytes_read_) += res;
    r.offset += res;
    r.buf += res;
    r.left -= res;
  }
  if (r.left == 0) {
    ring_->done.emplace(t, r);
    return;
  }
  // A short transfer: submit the rest under the same ticket.
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_->ring);
  if (!sqe) {
    io_uring_submit(&ring_->ring);
    sqe = io_uring_get_sqe(&ring_->ring);
    if (!sqe) fail("io_uring_get_sqe", EBUSY, r.offset);
  }
  const unsigned len = static_cast<unsigned>(std::min<int64_t>(r.left, int64_t{1} << 30));
  if (r.write) io_uring_prep_write(sqe, fd_, r.buf, len, static_cast<uint64_t>(r.offset));
  else io_uring_prep_read(sqe, fd_, r.buf, len, static_cast<uint64_t>(r.offset));
  io_uring_sqe_set_data64(sqe, t);
  const int s = io_uring_submit(&ring_->ring);
  if (s < 0) fail("io_uring_submit", -s, r.offset);
  ++ring_->in_flight;
  ring_->pending.emplace(t, r);
}

void DirectFile::wait(uint64_t ticket) {
  for (;;) {
    auto it = ring_->done.find(ticket);
    if (it != ring_->done.end()) {
      const Request r = it->second;
      ring_->done.erase(it);
      if (r.error) fail(r.write ? "write" : "read", r.error, r.failed_at);
      return;
    }
    if (!ring_->pending.count(ticket)) {
      throw std::logic_error("offload file '" + path_ + "': wait for unknown request " + std::to_string(ticket));
    }
    reap_one();
  }
}

void DirectFile::wait_all() {
  while (!ring_->pending.empty()) reap_one();
  while (!ring_->done.empty()) wait(ring_->done.begin()->first);
}

}  // namespace shardgan
