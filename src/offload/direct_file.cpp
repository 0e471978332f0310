#include "shardgan/offload/direct_file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <map>
#include <set>
#include <mutex>

#include <liburing.h>

namespace shardgan {

namespace {

std::string errno_text(int err) { return std::string(std::strerror(err)) + " (errno " + std::to_string(err) + ")"; }

constexpr int kMaxRetries = 64;  // EAGAIN / no-progress retries of one request

// The process-wide fault plan (direct_file.h, IoFaultPlan) and its operation counters.
struct FaultState {
  std::mutex mu;
  bool env_read = false;
  IoFaultPlan plan;
  int64_t completions = 0, submits = 0;
};
FaultState& faults() {
  static FaultState f;
  return f;
}

void load_env_faults() {
  FaultState& f = faults();
  std::lock_guard<std::mutex> lk(f.mu);
  if (f.env_read) return;
  f.env_read = true;
  if (const char* e = std::getenv("SHARDGAN_TEST_IO_FAULTS")) {
    f.plan = parse_io_faults(e);
    f.completions = f.submits = 0;
  }
}

// The fault planned for the next completion ("" for none).
std::string next_completion_fault() {
  FaultState& f = faults();
  std::lock_guard<std::mutex> lk(f.mu);
  const int64_t i = f.completions++;
  auto it = f.plan.completion.find(i);
  if (it == f.plan.completion.end()) return {};
  std::fprintf(stderr, "shardgan: injected I/O fault '%s' at completion %lld (SHARDGAN_TEST_IO_FAULTS)\n",
               it->second.c_str(), static_cast<long long>(i));
  return it->second;
}

// io_uring_submit, or the error planned for this call.
int submit_or_fault(io_uring* ring) {
  std::string kind;
  {
    FaultState& f = faults();
    std::lock_guard<std::mutex> lk(f.mu);
    auto it = f.plan.submit.find(f.submits++);
    if (it != f.plan.submit.end()) kind = it->second;
  }
  if (!kind.empty()) std::fprintf(stderr, "shardgan: injected I/O fault '%s' at a submit (SHARDGAN_TEST_IO_FAULTS)\n", kind.c_str());
  if (kind == "ebusy") return -EBUSY;
  if (kind == "eio") return -EIO;
  return io_uring_submit(ring);
}

// Whether `kind` is a fault of operation `op` ('c': completion, 's': submit).
bool known_fault(char op, const std::string& kind) {
  if (op == 'c') return kind == "short" || kind == "eagain" || kind == "eio" || kind == "enospc" || kind == "einval";
  return op == 's' && (kind == "ebusy" || kind == "eio");
}

}  // namespace

IoFaultPlan parse_io_faults(const std::string& text) {
  IoFaultPlan plan;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find(',', pos);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(pos, end - pos);
    pos = end + 1;
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    const bool ok_shape = eq != std::string::npos && eq >= 2 && (item[0] == 'c' || item[0] == 's');
    int64_t index = -1;
    if (ok_shape) {
      try {
        index = std::stoll(item.substr(1, eq - 1));
      } catch (...) {
      }
    }
    const std::string kind = ok_shape ? item.substr(eq + 1) : "";
    if (index < 0 || !known_fault(item[0], kind)) {
      throw std::invalid_argument("SHARDGAN_TEST_IO_FAULTS: bad item '" + item +
                                  "' (want c<index>=short|eagain|eio|enospc|einval or s<index>=ebusy|eio)");
    }
    (item[0] == 'c' ? plan.completion : plan.submit)[index] = kind;
  }
  return plan;
}

void set_io_faults(const IoFaultPlan& plan) {
  for (auto [op, m] : {std::pair{'c', &plan.completion}, std::pair{'s', &plan.submit}}) {
    for (auto& [i, kind] : *m) {
      if (i < 0 || !known_fault(op, kind)) {
        throw std::invalid_argument(std::string("set_io_faults: bad fault '") + op + std::to_string(i) + "=" + kind + "'");
      }
    }
  }
  FaultState& f = faults();
  std::lock_guard<std::mutex> lk(f.mu);
  f.env_read = true;
  f.plan = plan;
  f.completions = f.submits = 0;
}

struct DirectFile::Request {
  bool write = false;
  int retries = 0;      // EAGAIN / no-progress retries so far
  int64_t offset = 0;   // next byte to transfer
  char* buf = nullptr;  // next buffer byte
  int64_t left = 0;     // bytes still to transfer
  int error = 0;        // errno of a failed request (0: fine)
  int64_t failed_at = 0;
};

struct DirectFile::Ring {
  io_uring ring{};
  bool ready = false;
  uint64_t next_ticket = 1;
  std::map<uint64_t, Request> pending;  // in flight or resubmitted
  std::map<uint64_t, Request> done;     // completed, not yet waited for
  std::set<uint64_t> orphans;           // reported failed, still queued: their completion is dropped
  unsigned in_flight = 0;
  unsigned depth = 0;
};

DirectFile::DirectFile(std::string path, int64_t bytes, int queue_depth)
    : path_(std::move(path)), bytes_(bytes), ring_(std::make_unique<Ring>()) {
  load_env_faults();
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
    io_uring_submit(&ring_->ring);  // entries queued by a failed submit complete too
    while (ring_->in_flight > 0) {
      io_uring_cqe* cqe = nullptr;
      __kernel_timespec ts{30, 0};
      if (io_uring_wait_cqe_timeout(&ring_->ring, &cqe, &ts) < 0) break;
      io_uring_cqe_seen(&ring_->ring, cqe);
      --ring_->in_flight;
    }
    io_uring_queue_exit(&ring_->ring);
  }
  if (fd_ >= 0) {
    // Unlink while the flock is held: closing first would let another run lock the file
    // between the close and the unlink, and then lose it to our unlink.
    ::unlink(path_.c_str());
    ::close(fd_);
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
  while (ring_->in_flight >= ring_->depth) reap_one();
  const int err = enqueue(t, r);
  if (err != 0) {
    ring_->done.erase(t);  // reported here, to the caller, not again to wait_all()
    fail(write ? "io_uring_submit (write)" : "io_uring_submit (read)", err, offset);
  }
  return t;
}

int DirectFile::enqueue(uint64_t ticket, const Request& r) {
  // A failure is reported to the waiter (a resubmission) or, by submit(), to the caller.
  auto report = [&](int err) {
    Request failed = r;
    failed.error = err;
    failed.failed_at = r.offset;
    ring_->done[ticket] = failed;
    return err;
  };
  auto& ring = ring_->ring;
  io_uring_sqe* sqe = io_uring_get_sqe(&ring);
  if (!sqe) {  // the submission queue is full of unsubmitted entries
    submit_or_fault(&ring);
    sqe = io_uring_get_sqe(&ring);
    if (!sqe) return report(EBUSY);
  }
  // One request moves at most 1 GiB; longer ones continue on resubmission.
  const unsigned len = static_cast<unsigned>(std::min<int64_t>(r.left, int64_t{1} << 30));
  if (r.write) io_uring_prep_write(sqe, fd_, r.buf, len, static_cast<uint64_t>(r.offset));
  else io_uring_prep_read(sqe, fd_, r.buf, len, static_cast<uint64_t>(r.offset));
  io_uring_sqe_set_data64(sqe, ticket);
  // Booked before the submit: the entry is in the queue now and completes once any later
  // io_uring_submit sends it, even if this one fails (it used to be booked after, so a
  // failed submit left a completion with no ticket and the unsigned count underflowed).
  ++ring_->in_flight;
  ring_->pending[ticket] = r;
  for (int attempt = 0;; ++attempt) {
    const int e = submit_or_fault(&ring);
    if (e >= 0) return 0;
    const bool transient = e == -EBUSY || e == -EAGAIN || e == -EINTR;
    if (!transient || attempt >= kMaxRetries) {
      // The entry stays queued (and counted) until a later submit or the destructor sends
      // it, but as a no-op: the caller is told the request failed and may free its buffer,
      // which the kernel must then never touch. (A failed io_uring_enter consumed nothing.)
      io_uring_prep_nop(sqe);
      io_uring_sqe_set_data64(sqe, ticket);
      ring_->pending.erase(ticket);
      ring_->orphans.insert(ticket);
      return report(-e);
    }
    if (ring_->in_flight > 1) reap_one();  // make room: completions free kernel resources
  }
}

void DirectFile::reap_one() {
  io_uring_cqe* cqe = nullptr;
  int e;
  do {
    e = io_uring_wait_cqe(&ring_->ring, &cqe);
  } while (e == -EINTR);
  if (e < 0) fail("io_uring_wait_cqe", -e, 0);
  const uint64_t t = io_uring_cqe_get_data64(cqe);
  int res = cqe->res;
  io_uring_cqe_seen(&ring_->ring, cqe);
  if (ring_->in_flight > 0) --ring_->in_flight;
  if (ring_->orphans.erase(t)) return;  // its waiter has its error already
  auto it = ring_->pending.find(t);
  if (it == ring_->pending.end()) return;
  Request r = it->second;
  ring_->pending.erase(it);
  const std::string fault = next_completion_fault();
  if (fault == "short" && res > 512) res -= 512;
  else if (fault == "eagain") res = -EAGAIN;
  else if (fault == "eio") res = -EIO;
  else if (fault == "enospc") res = -ENOSPC;
  else if (fault == "einval") res = -EINVAL;
  auto finish = [&](int err) {
    r.error = err;
    r.failed_at = r.offset;
    ring_->done[t] = r;
  };
  if (res == -EAGAIN || res == -EINTR) {
    if (++r.retries > kMaxRetries) return finish(-res);  // retry the same range, boundedly
  } else if (res == -EINVAL && direct_) {
    // The filesystem took O_DIRECT at open but refuses it on I/O: go buffered and retry.
    const int flags = ::fcntl(fd_, F_GETFL);
    if (flags < 0 || ::fcntl(fd_, F_SETFL, flags & ~O_DIRECT) != 0) return finish(EINVAL);
    direct_ = false;
  } else if (res < 0) {
    return finish(-res);
  } else if (res == 0) {  // nothing moved: past the end of the file
    return finish(r.write ? ENOSPC : EIO);
  } else {
    // O_DIRECT needs aligned offsets: count only whole kAlign blocks of a short transfer
    // and move the partial block again (same bytes, so harmless for reads and writes).
    const int64_t done = res >= r.left || !direct_ ? res : (res / kAlign) * kAlign;
    if (done == 0 && ++r.retries > kMaxRetries) return finish(EIO);
    (r.write ? bytes_written_ : bytes_read_) += done;
    r.offset += done;
    r.buf += done;
    r.left -= done;
  }
  if (r.left == 0) {
    ring_->done[t] = r;
    return;
  }
  // The rest, under the same ticket (a failed enqueue reports the error to its waiter).
  enqueue(t, r);
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
