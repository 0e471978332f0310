// Rank 1 never joins rank 0's all_reduce. Rank 0 must time out, name the collective, and
// end the job on every rank through MPI_Abort. Usage: comm_hang <timeout_s>
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include <torch/torch.h>

#include "shardgan/comm/mpi_communicator.h"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  const double timeout_s = argc > 1 ? std::atof(argv[1]) : 2.0;
  shardgan::MpiCommunicator comm(MPI_COMM_WORLD, timeout_s);
  try {
    if (comm.rank() != 1) {
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
