// gtest main for tests that run under mpirun: initializes MPI, one torch thread per rank.
#include <mpi.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace {

// Prints a failed assertion of a rank other than 0, prefixed with the rank.
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?",
                 r.line_number(), r.summary());
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;  // MPI_THREAD_MULTIPLE, as shardgan-train asks for (progress thread tests)
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  ::testing::InitGoogleTest(&argc, argv);
  torch::set_num_threads(1);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {  // rank 0 prints the report; the others print only their failures
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter(rank));
  }
  // The worst result and whether any rank skipped a case, in one all-reduce. A skipped case
  // (GTEST_SKIP: no dataset, no root, no O_DIRECT) makes the whole entry report as skipped
  // to ctest (SKIP_RETURN_CODE 77), not as passed; a failure still wins.
  const int rc = RUN_ALL_TESTS();
  int mine[2] = {rc, ::testing::UnitTest::GetInstance()->skipped_test_count() > 0 ? 1 : 0}, all[2] = {0, 0};
  MPI_Allreduce(mine, all, 2, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  const int worst = all[0], any_skipped = all[1];
  if (rank == 0 && worst != 0 && rc == 0) std::fprintf(stderr, "a test failed on another rank\n");
  MPI_Finalize();
  if (worst == 0 && any_skipped) {
    if (rank == 0) std::fprintf(stderr, "shardgan: a test case skipped (reason above); exit code 77\n");
    return 77;
  }
  return worst;
}
