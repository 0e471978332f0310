// MPI errors that speak (ctest mpi_errors): every communicator MpiCommunicator wraps has
// MPI_ERRORS_RETURN, so an MPI error is a CollectiveError naming the call, the communicator,
// the rank, the peer and MPI's error string, instead of MPI_ERRORS_ARE_FATAL ending the job
// inside MPI. A receive shorter than its message (MPI_ERR_TRUNCATE) is the case here.
// Control mpi_errors_control (SHARDGAN_TEST_CONTROL=mpi_errors_fatal): the communicator
// keeps MPI's default handler, and the truncated receive must abort the job.
#include <mpi.h>

#include <string>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "shardgan/comm/mpi_communicator.h"
#include "shardgan/util/test_control.h"

// The gtest files compile together in batches (tests/CMakeLists.txt): this file's names
// live in a namespace of its own.
namespace SHARDGAN_UNITY_ID {

using namespace shardgan;

namespace {

TEST(MpiErrors, TruncatedReceiveNamesTheCallThePeerAndTheError) {
  MpiCommunicator world(MPI_COMM_WORLD, 20.0);
  if (world.world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  if (test_control("mpi_errors_fatal")) MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
  // Rank 0 sends 8 floats to rank 1, which posts a receive of 4.
  if (world.rank() == 0) {
    at::Tensor out = torch::arange(8, torch::kFloat);
    world.send_recv_async({{1, out}}, {})->wait();
  } else if (world.rank() == 1) {
    at::Tensor in = torch::zeros({4}, torch::kFloat);
    try {
      world.send_recv_async({}, {{0, in}})->wait();
      ADD_FAILURE() << "a receive of 16 bytes took a 32-byte message without an error";
    } catch (const CollectiveError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("send_recv on rank 1"), std::string::npos) << m;
      EXPECT_NE(m.find("failed on rank 1 of the world communicator (2 ranks"), std::string::npos) << m;
      EXPECT_NE(m.find("peer rank 0"), std::string::npos) << m;
      EXPECT_NE(m.find("TRUNCATE"), std::string::npos) << m;
    }
  }
  world.barrier();  // the communicator still works for the ranks that go on
}

TEST(MpiErrors, SplitCommunicatorsAreNamedInErrors) {
  MpiCommunicator world(MPI_COMM_WORLD, 20.0);
  auto sub = world.split(world.rank() % 2, world.rank());
  auto* mpi = dynamic_cast<MpiCommunicator*>(sub.get());
  ASSERT_NE(mpi, nullptr);
  EXPECT_EQ(mpi->name(), "world split " + std::to_string(world.rank() % 2));
  try {
    mpi->check(MPI_ERR_COUNT, "MPI_Isend", 3);
    ADD_FAILURE() << "check(MPI_ERR_COUNT) did not throw";
  } catch (const CollectiveError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("MPI_Isend failed on rank " + std::to_string(mpi->rank()) + " of the world split"), std::string::npos)
        << m;
    EXPECT_NE(m.find("peer rank 3"), std::string::npos) << m;
  }
  EXPECT_NO_THROW(mpi->check(MPI_SUCCESS, "MPI_Isend"));
}

}  // namespace

}  // namespace SHARDGAN_UNITY_ID
