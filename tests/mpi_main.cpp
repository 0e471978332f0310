// gtest main for tests that run under mpirun: initializes MPI, one torch thread per rank.
// The gtest files form one executable, shardgan_tests; called through a link named after one
// of them (build/tests/test_config -> shardgan_tests), it runs that file's cases only.
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <string>

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

// Called as tests/<file> (a link to shardgan_tests), only the cases written in <file>.cpp
// run: every other case joins the negative part of --gtest_filter, so a filter given on
// the command line still applies within the file.
void select_file_by_program_name(const char* argv0) {
  std::string stem = argv0;
  stem = stem.substr(stem.find_last_of('/') + 1);
  if (stem == "shardgan_tests") return;
  const auto& unit = *::testing::UnitTest::GetInstance();
  std::string others;
  int mine = 0;
  for (int s = 0; s < unit.total_test_suite_count(); ++s) {
    const auto& suite = *unit.GetTestSuite(s);
    for (int t = 0; t < suite.total_test_count(); ++t) {
      const auto& info = *suite.GetTestInfo(t);
      std::string file = info.file();
      file = file.substr(file.find_last_of('/') + 1);
      if (file == stem + ".cpp") {
        ++mine;
        continue;
      }
      others += (others.empty() ? "" : ":") + std::string(suite.name()) + "." + info.name();
    }
  }
  if (mine == 0) {
    std::fprintf(stderr, "shardgan_tests: no test case is written in %s.cpp (called as %s)\n", stem.c_str(),
                 argv0);
    std::exit(2);
  }
  std::string filter = GTEST_FLAG_GET(filter);
  if (others.empty()) return;
  filter += (filter.find('-') == std::string::npos ? "-" : ":") + others;
  GTEST_FLAG_SET(filter, filter);
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;  // MPI_THREAD_MULTIPLE, as shardgan-train asks for (progress thread tests)
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  ::testing::InitGoogleTest(&argc, argv);
  select_file_by_program_name(argv[0]);
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
