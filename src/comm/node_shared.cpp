#include "shardgan/comm/node_shared.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <functional>
#include <random>
#include <stdexcept>

#include <ATen/ATen.h>

#include "shardgan/comm/communicator.h"
#include "shardgan/comm/factory.h"
#include "shardgan/comm/mpi_communicator.h"
#include "shardgan/util/poll.h"

namespace shardgan {

namespace {
constexpr int kMaxRanks = 64;
constexpr int kMaxSlots = 16;
constexpr int64_t kPage = 4096;
int64_t round_up(int64_t b) { return (b + kPage - 1) / kPage * kPage; }
std::string os_error(const std::string& what) { return what + ": " + std::strerror(errno); }
}  // namespace

// The control area. A fresh shared-memory object reads as zeros, which is each lock-free
// atomic's zero value: nothing published or released yet.
struct NodeSharedPool::Control {
  std::atomic<int64_t> published[kMaxSlots][kMaxRanks];
  std::atomic<int64_t> released[kMaxSlots][kMaxRanks];
};

bool ranks_share_node(Communicator& comm) {
  // MPI's own notion of "can share memory" (MPI_COMM_TYPE_SHARED), as the launcher's local
  // rank comes from: every rank sees its node's rank count, so all agree.
  auto* mpi = dynamic_cast<MpiCommunicator*>(&comm);
  if (!mpi) return false;
  return local_rank_and_size(mpi->comm()).second == comm.world_size();
}

NodeSharedPool::NodeSharedPool(Communicator& comm, int slots, int64_t slot_bytes, std::string name)
    : slots_(slots), slot_bytes_(round_up(slot_bytes)), rank_(comm.rank()), world_(comm.world_size()),
      name_(std::move(name)) {
  static_assert(std::atomic<int64_t>::is_always_lock_free, "shared atomics must be lock-free");
  if (world_ > kMaxRanks) {
    throw std::invalid_argument("node-shared gather of '" + name_ + "': " + std::to_string(world_) +
                                " ranks share one node; at most 64 are supported (set node_shared_gather: false)");
  }
  if (slots_ < 1 || slots_ > kMaxSlots || slot_bytes <= 0) {
    throw std::invalid_argument("node-shared gather of '" + name_ + "': needs 1-16 slots of > 0 bytes");
  }
  const int64_t ctl_bytes = round_up(static_cast<int64_t>(sizeof(Control)));
  map_bytes_ = ctl_bytes + slots_ * slot_bytes_;
  // Rank 0 creates the object under a fresh name and broadcasts it (pid, sequence, random)
  // with its status, so that every rank fails together rather than waiting for it.
  static std::atomic<int64_t> seq{0};
  at::Tensor id = at::zeros({4}, at::kLong);
  std::string err;
  int fd = -1;
  auto shm_name = [&](const at::Tensor& t) {
    auto a = t.accessor<int64_t, 1>();
    return "/shardgan-" + std::to_string(a[1]) + "-" + std::to_string(a[2]) + "-" + std::to_string(a[3]);
  };
  if (rank_ == 0) {
    id[1] = static_cast<int64_t>(::getpid());
    id[2] = seq.fetch_add(1);
    id[3] = static_cast<int64_t>(std::random_device{}() & 0x7fffffff);
    fd = ::shm_open(shm_name(id).c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) {
      err = os_error("shm_open");
    } else if (::ftruncate(fd, map_bytes_) != 0) {
      err = os_error("ftruncate");
    }
    id[0] = err.empty() ? 1 : 0;
  }
  comm.broadcast(id, 0);
  if (id[0].item<int64_t>() != 1 && err.empty()) err = "rank 0 could not create it";
  if (rank_ != 0 && err.empty()) {
    fd = ::shm_open(shm_name(id).c_str(), O_RDWR, 0600);
    if (fd < 0) err = os_error("shm_open");
  }
  if (err.empty()) {
    map_ = ::mmap(nullptr, static_cast<size_t>(map_bytes_), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map_ == MAP_FAILED) {
      map_ = nullptr;
      err = os_error("mmap");
    }
  }
  if (fd >= 0) ::close(fd);
  // Everyone has opened it (or failed): the name is no longer needed.
  at::Tensor failed = at::full({1}, err.empty() ? 0 : 1, at::kLong);
  comm.all_reduce(failed, ReduceOp::kSum);
  if (rank_ == 0 && id[0].item<int64_t>() == 1) ::shm_unlink(shm_name(id).c_str());
  if (failed.item<int64_t>() != 0) {
    if (map_) ::munmap(map_, static_cast<size_t>(map_bytes_));
    map_ = nullptr;
    throw std::runtime_error("node-shared gather of '" + name_ + "' (" + std::to_string(map_bytes_) +
                             " bytes in /dev/shm) failed on " + std::to_string(failed.item<int64_t>()) +
                             " rank(s)" + (err.empty() ? "" : "; rank " + std::to_string(rank_) + ": " + err) +
                             ". Make /dev/shm larger, or set sharding.<model>.node_shared_gather: false");
  }
  ctl_ = static_cast<Control*>(map_);
  data_ = static_cast<char*>(map_) + ctl_bytes;
}

NodeSharedPool::~NodeSharedPool() {
  if (map_) ::munmap(map_, static_cast<size_t>(map_bytes_));
}

void* NodeSharedPool::data(int slot) const { return data_ + static_cast<int64_t>(slot) * slot_bytes_; }

bool NodeSharedPool::held_here(int64_t seq) const {
  return ctl_->released[slot_of(seq)][rank_].load(std::memory_order_acquire) < seq - slots_;
}

void NodeSharedPool::publish(int64_t seq) { ctl_->published[slot_of(seq)][rank_].store(seq, std::memory_order_release); }

void NodeSharedPool::release(int64_t seq) { ctl_->released[slot_of(seq)][rank_].store(seq, std::memory_order_release); }

void NodeSharedPool::wait_free(int64_t seq, double timeout_s, const std::function<void()>& progress) const {
  wait_until("released", seq, seq - slots_, true, timeout_s, progress);
}

void NodeSharedPool::wait_published(int64_t seq, double timeout_s, const std::function<void()>& progress) const {
  wait_until("published", seq, seq, false, timeout_s, progress);
}

void NodeSharedPool::wait_until(const char* what, int64_t seq, int64_t want, bool released, double timeout_s,
                                const std::function<void()>& progress) const {
  const int s = slot_of(seq);
  auto& row = released ? ctl_->released[s] : ctl_->published[s];
  auto ready = [&] {
    for (int r = 0; r < world_; ++r) {
      if (row[r].load(std::memory_order_acquire) < want) return false;
    }
    return true;
  };
  // Spins, yields, then naps of at most 20 us (util/poll.h); the MPI progress engine runs
  // in between, for the rank's other requests in flight.
  if (poll_until(deadline_after(timeout_s), ready, progress)) return;
  std::string missing;
  for (int r = 0; r < world_; ++r) {
    if (row[r].load(std::memory_order_acquire) < want) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
  }
  throw CollectiveTimeout("node-shared gather of '" + name_ + "' on rank " + std::to_string(rank_) + ": rank(s) " +
                          missing + " have not " + what + " gather " + std::to_string(want) + " (slot " +
                          std::to_string(s) + ") within " + std::to_string(timeout_s) +
                          " s (dist.timeout_s); a rank died or the ranks run different steps");
}

}  // namespace shardgan
