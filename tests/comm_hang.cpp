// Rank 1 never joins rank 0's all_reduce. Rank 0 must time out, name the collective, and
// end the job on every rank through MPI_Abort. Usage: comm_hang <timeout_s>
// With a second argument "inflight": rank 0 never joins, and rank 1 fails (throws) while
// its own reduce-scatter is in flight; the job must end at once, not after timeout_s.
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>

#include <torch/torch.h>

#include "shardgan/comm/mpi_communicator.h"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  const double timeout_s = argc > 1 ? std::atof(argv[1]) : 2.0;
  shardgan::MpiCommunicator comm(MPI_COMM_WORLD, timeout_s);
  const bool inflight = argc > 2 && std::string(argv[2]) == "inflight";
  try {
    if (inflight) {
      if (comm.rank() == 1) {
        at::Tensor full = torch::ones({1000}), shard = torch::empty({500});
        auto work = comm.reduce_scatter_async(shard, full, shardgan::ReduceOp::kSum);
        throw std::runtime_error("injected failure with a reduce-scatter in flight");
      }
      std::this_thread::sleep_for(std::chrono::seconds(120));  // never joins
    } else if (comm.rank() != 1) {
      at::Tensor t = torch::ones({1000});
      comm.all_reduce(t, shardgan::ReduceOp::kSum);
    } else {
      std::this_thread::sleep_for(std::chrono::seconds(120));  // never joins
    }
    comm.barrier();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "comm_hang: error on rank %d: %s\n", comm.rank(), e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 3);
  }
  MPI_Finalize();
  return 0;
}
