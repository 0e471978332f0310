#pragma once
#include <memory>
#include <string>
#include <vector>

#include <mpi.h>

#include "shardgan/comm/communicator.h"

namespace shardgan {

/// Builds the communicator for `backend` ("mpi" or "nccl") over `comm` (collective over
/// `comm`: NCCL's bootstrap broadcasts its unique id). NCCL runs on CUDA device
/// `device_index` (-1: this rank's local rank on its node). Throws std::invalid_argument
/// for an unknown backend, or for "nccl" in a build without CUDA and NCCL. `blocking_wait`
/// (NCCL only): NcclCommunicator's host-side waits instead of device-side ones.
std::unique_ptr<Communicator> make_communicator(const std::string& backend, MPI_Comm comm,
                                                double timeout_s, int device_index = -1,
                                                bool blocking_wait = false);

/// Collective over `comm`. Starts the MPI progress thread (MpiCommunicator::
/// enable_progress_thread) polling every `interval_us` microseconds. Throws
/// std::invalid_argument naming dist.progress_thread when `comm` is not an MPI
/// communicator, CollectiveError when MPI lacks MPI_THREAD_MULTIPLE.
void enable_progress_thread(Communicator& comm, double interval_us);

/// The version of the NCCL library this build links ("2.30.7"), or "not compiled in".
/// Not a collective; needs no GPU.
std::string nccl_version();

/// Rank of this process among the ranks on its node (MPI_Comm_split_type), and their count.
std::pair<int, int> local_rank_and_size(MPI_Comm comm);

/// Collective over `comm` (MPI_Comm_split_type shared, then an all-gather over the node):
/// the ranks in `comm` of the processes on this rank's node, ascending. The split
/// placement's pre-flight counts G's and D's ranks on a node from it, whatever the
/// launcher's mapping (by slot, round robin). Like local_rank_and_size it runs once at
/// start-up, before the communicators with timeouts exist.
std::vector<int> node_world_ranks(MPI_Comm comm);

}  // namespace shardgan
