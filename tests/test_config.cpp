// Config parsing: defaults, overrides, and errors that name the file and the key.
#include <gtest/gtest.h>

#include "shardgan/train/config.h"
#include "shardgan/util/threads.h"

using namespace shardgan;

namespace {

std::string error_of(const std::string& yaml, std::vector<std::string> overrides = {}) {
  try {
    parse_config(yaml, "test.yaml", overrides);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(Config, ShippedConfigParses) {
  TrainConfig c = load_config(SHARDGAN_SOURCE_DIR "/configs/fmnist-dcgan.yaml", {});
  EXPECT_EQ(c.g_sharding.stage, 3);
  EXPECT_EQ(c.d_sharding.stage, 3);
  EXPECT_DOUBLE_EQ(c.g_optim.lr, 2e-4);
  EXPECT_DOUBLE_EQ(c.g_optim.beta1, 0.5);
  EXPECT_EQ(c.data_source, "fashion-mnist");
}

TEST(Config, OverridesWin) {
  TrainConfig c = parse_config("train: {steps: 10}\n", "t.yaml",
                               {"train.steps=200", "optim.discriminator.lr=4e-4", "model.dtype=float64"});
  EXPECT_EQ(c.steps, 200);
  EXPECT_DOUBLE_EQ(c.d_optim.lr, 4e-4);
  EXPECT_EQ(c.model_dtype, at::kDouble);
  EXPECT_TRUE(c.tf32);  // run.tf32 defaults to PyTorch's cuDNN default
  EXPECT_FALSE(parse_config("run: {tf32: false}\n", "t.yaml", {}).tf32);
  EXPECT_FALSE(c.deterministic);  // run.deterministic: off unless asked for
  EXPECT_TRUE(parse_config("run: {deterministic: true}\n", "t.yaml", {}).deterministic);
}

TEST(Config, UnknownKeyIsNamed) {
  EXPECT_NE(error_of("train: {stepz: 3}\n").find("unknown config key 'train.stepz'"), std::string::npos);
  EXPECT_NE(error_of("", {"optim.g.lr=1"}).find("'optim.g.lr'"), std::string::npos);
  EXPECT_NE(error_of("train: {stepz: 3}\n").find("test.yaml"), std::string::npos);
}

TEST(Config, BadValuesAreNamed) {
  EXPECT_NE(error_of("train: {steps: abc}\n").find("'train.steps' has value 'abc'"), std::string::npos);
  EXPECT_NE(error_of("sharding: {generator: {stage: 4}}\n").find("sharding.generator.stage"), std::string::npos);
  EXPECT_NE(error_of("model: {dtype: float8}\n").find("model.dtype"), std::string::npos);
  EXPECT_NE(error_of("run: {tf32: maybe}\n").find("run.tf32"), std::string::npos);
  EXPECT_NE(error_of("run: {deterministic: maybe}\n").find("run.deterministic"), std::string::npos);
  EXPECT_NE(error_of("offload: {overlap_copies: maybe}\n").find("offload.overlap_copies"), std::string::npos);
  EXPECT_NE(error_of("offload: {copy_block_bytes: 5000}\n").find("offload.copy_block_bytes"), std::string::npos);
  const std::string seg = error_of("sharding: {discriminator: {checkpoint_segments: true}}\n");
  EXPECT_NE(seg.find("sharding.discriminator.checkpoint_segments"), std::string::npos) << seg;
  EXPECT_NE(seg.find("activation_checkpointing: true"), std::string::npos) << seg;
  EXPECT_TRUE(parse_config("sharding: {generator: {activation_checkpointing: true, checkpoint_segments: true}}\n",
                           "t.yaml", {}).g_sharding.checkpoint_segments);
  // dist.blocking_wait is NCCL's (c10d's TORCH_NCCL_BLOCKING_WAIT): refused on the MPI backend.
  const std::string bw = error_of("dist: {blocking_wait: true}\n");
  EXPECT_NE(bw.find("dist.blocking_wait"), std::string::npos) << bw;
  EXPECT_NE(bw.find("needs dist.backend nccl"), std::string::npos) << bw;
  EXPECT_NE(error_of("dist: {blocking_wait: maybe}\n").find("dist.blocking_wait"), std::string::npos);
  EXPECT_FALSE(parse_config("", "t.yaml", {}).blocking_wait);
  EXPECT_TRUE(parse_config("run: {device: cuda}\ndist: {blocking_wait: true}\n", "t.yaml", {}).blocking_wait);
  EXPECT_NE(error_of("", {"train.steps"}).find("expected key=value"), std::string::npos);
  EXPECT_NE(error_of("train: [1, 2]\n").find("'train'"), std::string::npos);
}

TEST(Config, MissingFileIsNamed) {
  try {
    load_config("/nonexistent/cfg.yaml", {});
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/cfg.yaml"), std::string::npos);
  }
}

}  // namespace

namespace {

// train.threads 0: a rank's share of the cores, capped by the CPUs it may run on (mpirun
// binds 1 or 2 ranks to one core each by default).
TEST(IntraOpThreads, ShareOfTheCoresCappedByTheAffinityMask) {
  using shardgan::default_intra_op_threads;
  EXPECT_EQ(default_intra_op_threads(0, 2, 1, 2), 2);    // unbound, one rank: both cores
  EXPECT_EQ(default_intra_op_threads(0, 2, 1, 1), 1);    // bound to one core: one thread
  EXPECT_EQ(default_intra_op_threads(0, 2, 2, 1), 1);    // two ranks, a core each
  EXPECT_EQ(default_intra_op_threads(0, 64, 2, 1), 1);   // not 32 threads on one bound core
  EXPECT_EQ(default_intra_op_threads(0, 64, 2, 64), 32);
  EXPECT_EQ(default_intra_op_threads(0, 2, 4, 2), 1);    // oversubscribed ranks: at least 1
  EXPECT_EQ(default_intra_op_threads(3, 2, 1, 1), 3);    // train.threads wins
  EXPECT_GE(shardgan::affinity_cpu_count(), 1);
}

}  // namespace
