// gtest main for tests that run under mpirun: initializes MPI, one torch thread per rank.
#include <mpi.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  torch::set_num_threads(1);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {  // one report is enough; failures on any rank still fail the run
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int rc = RUN_ALL_TESTS();
  int worst = 0;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0 && worst != 0 && rc == 0) std::fprintf(stderr, "a test failed on another rank\n");
  MPI_Finalize();
  return worst;
}
