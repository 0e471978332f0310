#include "shardgan/comm/factory.h"

#include <algorithm>

#include <stdexcept>
#include <string>

#include "shardgan/comm/mpi_communicator.h"
#ifdef SHARDGAN_HAVE_NCCL
#include <nccl.h>

#include "shardgan/comm/nccl_communicator.h"
#endif

namespace shardgan {
namespace {

// The world communicator returns MPI errors once an MpiCommunicator wraps it (MPI_ERRORS_RETURN).
void check_mpi(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw CollectiveError(std::string(call) + " failed (the ranks of this node): " + std::string(msg, len));
}

}  // namespace

std::pair<int, int> local_rank_and_size(MPI_Comm comm) {
  MPI_Comm node;
  check_mpi(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node), "MPI_Comm_split_type");
  int r = 0, n = 1;
  MPI_Comm_rank(node, &r);
  MPI_Comm_size(node, &n);
  MPI_Comm_free(&node);
  return {r, n};
}

std::vector<int> node_world_ranks(MPI_Comm comm) {
  MPI_Comm node;
  check_mpi(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node), "MPI_Comm_split_type");
  int me = 0, n = 1;
  MPI_Comm_rank(comm, &me);
  MPI_Comm_size(node, &n);
  std::vector<int> ranks(static_cast<size_t>(n));
  const int rc = MPI_Allgather(&me, 1, MPI_INT, ranks.data(), 1, MPI_INT, node);
  MPI_Comm_free(&node);
  check_mpi(rc, "MPI_Allgather (world ranks of this node)");
  std::sort(ranks.begin(), ranks.end());
  return ranks;
}

std::string nccl_version() {
#ifdef SHARDGAN_HAVE_NCCL
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "unknown";
  // NCCL >= 2.9 encodes major * 10000 + minor * 100 + patch.
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
#else
  return "not compiled in";
#endif
}

void enable_progress_thread(Communicator& comm, double interval_us) {
  auto* mpi = dynamic_cast<MpiCommunicator*>(&comm);
  if (!mpi) {
    throw std::invalid_argument("dist.progress_thread: the " + comm.backend() +
                                " communicator has no MPI progress to drive (set it to false)");
  }
  mpi->enable_progress_thread(interval_us);
}

std::unique_ptr<Communicator> make_communicator(const std::string& backend, MPI_Comm comm,
                                                double timeout_s, int device_index, bool blocking_wait) {
  if (backend == "mpi") {
    auto c = std::make_unique<MpiCommunicator>(comm, timeout_s);
    c->learn_hosts();
    return c;
  }
  if (backend == "nccl") {
#ifdef SHARDGAN_HAVE_NCCL
    return std::make_unique<NcclCommunicator>(
        comm, device_index >= 0 ? device_index : local_rank_and_size(comm).first, timeout_s, blocking_wait);
#else
    (void)blocking_wait;
    throw std::invalid_argument(
        "dist.backend 'nccl': this build has no NCCL backend (CUDA and NCCL were not found "
        "at configure time). Use dist.backend=mpi or rebuild with CUDA and NCCL");
#endif
  }
  throw std::invalid_argument("dist.backend '" + backend + "': expected mpi or nccl");
}

}  // namespace shardgan
