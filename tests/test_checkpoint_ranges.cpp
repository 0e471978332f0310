// Verified range reads that span several 8 MiB read pieces, with unaligned first and last
// checksum blocks (the pipelined read path): every range must come back exactly.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>

#include "shardgan/checkpoint/checkpoint.h"
#include "shardgan/checkpoint/offline.h"
#include "shardgan/checkpoint/shard_io.h"
#include "shardgan/comm/mpi_communicator.h"
#include "shardgan/optim/sharded_adam.h"
#include "shardgan/sharding/sharded_model.h"

// The gtest files compile together in batches (tests/CMakeLists.txt): this file's names
// live in a namespace of its own.
namespace SHARDGAN_UNITY_ID {

using namespace shardgan;
namespace fs = std::filesystem;

namespace {

TEST(CheckpointRanges, MultiPieceUnalignedReadsAreExact) {
  MpiCommunicator self(MPI_COMM_SELF, 60.0);
  torch::manual_seed(1);
  auto lin = torch::nn::Linear(1024, 3000);  // 3.08M float32 elements: 12 MiB, 12 blocks
  ShardingConfig cfg;
  cfg.stage = 0;
  ShardedModel model("m", self, cfg);
  model.add_unit("lin", lin.ptr(), [lin](const at::Tensor& x) mutable { return lin->forward(x); });
  ShardedAdam opt(model, AdamConfig{});
  const std::string run = (fs::temp_directory_path() / ("shardgan-ranges-" + std::to_string(::getpid()))).string();
  TrainCounters counters;
  counters.noise_rng_state = torch::zeros({8}, torch::kUInt8);
  const std::string dir = save_checkpoint(run, counters, {{&model, &opt}}, "test", self, 1);

  ckpt::CheckpointReader reader(dir);
  const at::Tensor want = model.units()[0]->shard();
  const int64_t n = want.numel();
  const float* w = want.data_ptr<float>();
  const int64_t block = (1 << 20) / 4, piece = 8 * block;
  std::vector<std::pair<int64_t, int64_t>> ranges = {
      {0, n}, {1, n - 2}, {block - 1, piece + 3}, {piece - 5, 15}, {n - 7, 7}, {0, 1}};
  std::mt19937_64 rng(5);
  for (int i = 0; i < 40; ++i) {
    const int64_t a = static_cast<int64_t>(rng() % n);
    ranges.push_back({a, 1 + static_cast<int64_t>(rng() % (n - a))});
  }
  for (auto [start, count] : ranges) {
    std::vector<float> got(count + 2, -7.0f);  // sentinels catch writes past the end
    reader.read_verified(0, "m/units/lin/param_shard", start, count, got.data() + 1);
    EXPECT_EQ(got.front(), -7.0f);
    EXPECT_EQ(got.back(), -7.0f);
    EXPECT_EQ(std::memcmp(got.data() + 1, w + start, count * sizeof(float)), 0)
        << "range [" << start << ", " << start + count << ")";
  }
  fs::remove_all(run);
}

// Directory names past step 99,999,999 grow a digit (step-100000000); --resume and the
// keep-last pruning order them by step, not by string (where "step-1000..." < "step-9999...").
TEST(CheckpointNames, StepsPastEightDigitsOrderByStep) {
  MpiCommunicator self(MPI_COMM_SELF, 60.0);
  auto lin = torch::nn::Linear(4, 3);
  ShardingConfig cfg;
  cfg.stage = 0;
  ShardedModel model("m", self, cfg);
  model.add_unit("lin", lin.ptr(), [lin](const at::Tensor& x) mutable { return lin->forward(x); });
  const std::string run = (fs::temp_directory_path() / ("shardgan-names-" + std::to_string(::getpid()))).string();
  TrainCounters counters;
  counters.noise_rng_state = torch::zeros({8}, torch::kUInt8);
  for (int64_t step : {99'999'998, 99'999'999, 100'000'000, 100'000'001}) {
    counters.step = step;
    save_checkpoint(run, counters, {{&model, nullptr}}, "test", self, /*keep_last=*/2);
  }
  wait_for_checkpoint_cleanup();
  std::vector<std::string> left;
  for (auto& e : fs::directory_iterator(run + "/checkpoints")) left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"latest", "step-100000000", "step-100000001"}));
  EXPECT_EQ(resolve_checkpoint_dir(run), run + "/checkpoints/step-100000001");
  TrainCounters back;
  load_checkpoint(resolve_checkpoint_dir(run), back, {{&model, nullptr}}, self);
  EXPECT_EQ(back.step, 100'000'001);
  fs::remove_all(run);
}

// `shardgan-ckpt diff` must not drop a NaN (std::max(a, NaN) keeps a): a NaN or an
// infinity on one side is an infinite difference, which any --rtol rejects; NaN against NaN
// is noted, and --rtol rejects that too.
TEST(CheckpointDiff, NonFiniteValuesAreDifferences) {
  auto run = [](std::vector<double> a, std::vector<double> b) {
    ckpt::TensorDiff d;
    ckpt::compare_values(a, b, d);
    return d;
  };
  const double nan = std::nan(""), inf = INFINITY;
  EXPECT_EQ(run({1, nan, 3}, {1, 2, 3}).max_abs, inf);
  EXPECT_EQ(run({1, 2, 3}, {1, nan, 3}).max_rel, inf);
  EXPECT_EQ(run({nan, 2}, {1, 2}).note, "non-finite values differ");
  EXPECT_EQ(run({inf, 2}, {1, 2}).max_abs, inf);
  EXPECT_EQ(run({inf, 2}, {-inf, 2}).max_abs, inf);
  const ckpt::TensorDiff same_nan = run({nan, inf, 2}, {nan, inf, 2});
  EXPECT_EQ(same_nan.max_abs, 0);  // the same bits: no difference in the numbers,
  EXPECT_EQ(same_nan.note, "non-finite values on both sides");  // but a note that --rtol rejects
  const ckpt::TensorDiff d = run({1, 2, 4}, {1, 2, 3});
  EXPECT_EQ(d.max_abs, 1);
  EXPECT_DOUBLE_EQ(d.max_rel, 1.0 / 3);
  EXPECT_EQ(d.note, "");
}

}  // namespace

}  // namespace SHARDGAN_UNITY_ID
