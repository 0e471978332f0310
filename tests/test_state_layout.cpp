// The state layout of reduced-precision Adam states (state_layout.h): which runs of a shard
// keep float32 (small parameters, the float32 globs) and which are reduced, and that a flat
// layout aligned to the block cuts no 8-bit block at any world size.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "shardgan/optim/state_layout.h"

namespace shardgan {
namespace {

// Parameters laid out as FlatParam lays them out with an alignment: offsets rounded up.
std::vector<StateParam> aligned_params(const std::vector<std::pair<std::string, int64_t>>& sizes, int64_t align,
                                       int64_t* total) {
  std::vector<StateParam> out;
  int64_t off = 0;
  for (const auto& [name, n] : sizes) {
    out.push_back({name, off, n});
    off = (off + n + align - 1) / align * align;
  }
  *total = off;
  return out;
}

TEST(StateLayout, Float32IsOneRunAndSmallOrNamedParametersKeepFloat32) {
  int64_t total = 0;
  const auto params = aligned_params({{"g.w", 5000}, {"g.b", 100}, {"g.shared.weight", 8192}, {"g.v", 4096}}, 256, &total);
  StatePolicy f32;
  StateLayout l = make_state_layout(params, total, 0, total, f32);
  ASSERT_EQ(l.runs.size(), 1u);
  EXPECT_EQ(l.runs[0].numel, total);
  EXPECT_FALSE(l.runs[0].reduced);
  EXPECT_EQ(l.state_bytes(StateDtype::kFloat32), 4 * total);

  StatePolicy q;
  q.dtype = StateDtype::kInt8;
  q.float32 = {"*.shared.*"};
  l = make_state_layout(params, total, 0, total, q);
  // g.w (5120 with padding) int8; g.b (256) float32; g.shared.weight float32 (glob), so the
  // two float32 extents merge; g.v int8 (exactly min_numel).
  ASSERT_EQ(l.runs.size(), 3u);
  EXPECT_TRUE(l.runs[0].reduced);
  EXPECT_EQ(l.runs[0].numel, 5120);
  EXPECT_FALSE(l.runs[1].reduced);
  EXPECT_EQ(l.runs[1].numel, 256 + 8192);
  EXPECT_TRUE(l.runs[2].reduced);
  EXPECT_EQ(l.runs[2].store_offset, 5120);
  EXPECT_EQ(l.runs[2].block_offset, 20);
  EXPECT_EQ(l.reduced_numel, 5120 + 4096);
  EXPECT_EQ(l.float32_numel, 256 + 8192);
  EXPECT_EQ(l.blocks, 20 + 16);
  EXPECT_EQ(l.state_bytes(StateDtype::kInt8), (5120 + 4096) + 36 * 4 + (256 + 8192) * 4);
  EXPECT_THROW(make_state_layout({{"a", 0, 10}, {"b", 5, 10}}, 20, 0, 20, q), std::invalid_argument);
  EXPECT_THROW(parse_state_dtype("int4"), std::invalid_argument);
  q.block = 0;
  EXPECT_THROW(make_state_layout(params, total, 0, total, q), std::invalid_argument);
}

TEST(StateLayout, AlignedShardsCutNoBlockAtAnyWorldSize) {
  // With offsets aligned to the block and the padded size a multiple of N * block, the
  // 8-bit blocks of every rank's shard, in flat coordinates, are exactly world size 1's.
  const int64_t B = 256;
  StatePolicy q;
  q.dtype = StateDtype::kInt8;
  q.min_numel = 1000;
  auto blocks_of = [&](int world) {
    int64_t total = 0;
    const auto params = aligned_params({{"a", 70000}, {"b", 999}, {"c", 4097}, {"d", 12345}}, B, &total);
    const int64_t padded = (total + world * B - 1) / (world * B) * (world * B);
    const int64_t shard = padded / world;
    std::vector<std::pair<int64_t, int64_t>> out;
    for (int r = 0; r < world; ++r) {
      const StateLayout l = make_state_layout(params, padded, r * shard, shard, q);
      int64_t covered = 0;
      for (const StateRun& run : l.runs) {
        EXPECT_EQ(run.begin, covered);
        covered += run.numel;
        if (!run.reduced) continue;
        for (int64_t b = 0; b < run.numel; b += B) {
          out.emplace_back(r * shard + run.begin + b, std::min(B, run.numel - b));
        }
      }
      EXPECT_EQ(covered, shard);
    }
    // The tail padding of larger world sizes is its own (all-zero) blocks: drop what lies
    // past world size 1's padded end.
    const int64_t end1 = (total + B - 1) / B * B;
    out.erase(std::remove_if(out.begin(), out.end(), [&](auto& b) { return b.first >= end1; }), out.end());
    return out;
  };
  const auto one = blocks_of(1);
  EXPECT_FALSE(one.empty());
  for (int world : {2, 3, 4}) EXPECT_EQ(blocks_of(world), one) << "world size " << world;
}

}  // namespace
}  // namespace shardgan
