// Verified range reads that span several 8 MiB read pieces, with unaligned first and last
// checksum blocks (the pipelined read path): every range must come back exactly.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <random>

#include "shardgan/checkpoint/checkpoint.h"
#include "shardgan/checkpoint/shard_io.h"
#include "shardgan/comm/mpi_communicator.h"
#include "shardgan/optim/sharded_adam.h"
#include "shardgan/sharding/sharded_model.h"

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

}  // namespace
