// Config parsing: defaults, overrides, and errors that name the file and the key.
#include <sstream>

#include <gtest/gtest.h>

#include "shardgan/train/config.h"
#include "shardgan/util/progress.h"
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

// An unknown key's error suggests the nearest known key (edit distance), or the keys with
// the same last name when the section is wrong, and points at docs/config.md instead of
// listing all 100-odd keys.
TEST(Config, UnknownKeySuggestsTheNearestKey) {
  const std::string typo = error_of("train: {stepz: 3}\n");
  EXPECT_NE(typo.find("Did you mean 'train.steps'?"), std::string::npos) << typo;
  EXPECT_NE(typo.find("docs/config.md"), std::string::npos) << typo;
  EXPECT_EQ(typo.find("train.global_batch"), std::string::npos) << "lists every key: " << typo;
  const std::string section = error_of("", {"optim.g.lr=1"});
  EXPECT_NE(section.find("'optim.generator.lr'"), std::string::npos) << section;
  EXPECT_NE(section.find("'optim.discriminator.lr'"), std::string::npos) << section;
  const std::string far = error_of("", {"completely.unrelated=1"});
  EXPECT_EQ(far.find("Did you mean"), std::string::npos) << far;
  EXPECT_EQ(edit_distance("train.stepz", "train.steps"), 1u);
  EXPECT_EQ(edit_distance("", "abc"), 3u);
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
}

// --print-config's YAML reads back to the same config, defaults, overrides, lists and
// strings that need quoting included.
TEST(Config, ResolvedNestedYamlReadsBack) {
  for (const char* arch : {"dcgan", "biggan"}) {
    const TrainConfig a = parse_config("train: {steps: 10}\n", "t.yaml",
                                       {std::string("model.arch=") + arch, "optim.generator.lr=1.5e-4",
                                        "run.dir=runs/with space", "offload.path="});
    EXPECT_NE(a.resolved_nested_yaml.find("train:\n"), std::string::npos) << a.resolved_nested_yaml;
    const TrainConfig b = parse_config(a.resolved_nested_yaml, "resolved.yaml", {});
    EXPECT_EQ(a.resolved_yaml, b.resolved_yaml) << a.resolved_nested_yaml;
    EXPECT_EQ(b.run_dir, "runs/with space");
    EXPECT_EQ(b.g_optim.offload.path, "");
    EXPECT_EQ(b.g_optim.lr, 1.5e-4);
  }
}

// The config reference names every key the reader accepts, each with a meaning.
TEST(Config, ReferenceListsEveryKeyWithAMeaning) {
  const std::string md = config_reference_markdown();
  for (const char* arch : {"dcgan", "biggan"}) {
    const TrainConfig c = parse_config("", "t.yaml", {std::string("model.arch=") + arch});
    std::istringstream lines(c.resolved_yaml);
    for (std::string line; std::getline(lines, line);) {
      const std::string key = line.substr(0, line.find(':'));
      EXPECT_NE(md.find("| `" + key + "` |"), std::string::npos) << key;
    }
  }
  EXPECT_EQ(md.find(" |  |\n"), std::string::npos) << "a key without a meaning";
  EXPECT_NE(md.find("| `model.g_ch_mult` | list of integers"), std::string::npos);
  EXPECT_NE(md.find("(biggan)"), std::string::npos);
  EXPECT_NE(md.find("dcgan: `64`; biggan: `120`"), std::string::npos) << "model.z_dim's per-family default";
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
  // eval.truncation: 0 or >= 0.05, and only for a family with Gaussian latents.
  EXPECT_NE(error_of("eval: {truncation: -1}\n").find("eval.truncation"), std::string::npos);
  EXPECT_NE(error_of("eval: {truncation: 0.01}\n").find("eval.truncation"), std::string::npos);
  const std::string tr = error_of("model: {arch: pix2pix}\neval: {truncation: 1.0}\n");
  EXPECT_NE(tr.find("eval.truncation"), std::string::npos) << tr;
  EXPECT_NE(tr.find("pix2pix"), std::string::npos) << tr;
  EXPECT_EQ(parse_config("model: {arch: biggan}\neval: {truncation: 1.5}\n", "t.yaml", {}).eval_truncation, 1.5);
  // train.aux_class_weight (AC-GAN) needs a D with a class head, and the head needs the weight.
  const std::string aux = error_of("train: {aux_class_weight: 1.0}\n");  // DCGAN: no head
  EXPECT_NE(aux.find("train.aux_class_weight"), std::string::npos) << aux;
  EXPECT_NE(aux.find("model.d_class_head"), std::string::npos) << aux;
  const std::string head = error_of("model: {arch: biggan, d_class_head: true}\n");
  EXPECT_NE(head.find("model.d_class_head"), std::string::npos) << head;
  EXPECT_NE(head.find("train.aux_class_weight"), std::string::npos) << head;
  EXPECT_NE(error_of("model: {arch: biggan, d_class_head: true}\ntrain: {aux_class_weight: -1}\n")
                .find("train.aux_class_weight"), std::string::npos);
  EXPECT_EQ(parse_config("model: {arch: biggan, d_class_head: true}\ntrain: {aux_class_weight: 0.5}\n", "t.yaml", {})
                .aux_class_weight, 0.5);
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
// A rank bound to fewer CPUs than its share of the node warns once, naming the fix.
TEST(IntraOpThreads, BindingWarningNamesTheFix) {
  using shardgan::core_binding_warning;
  const std::string w = core_binding_warning(0, 2, 1, 1);  // mpirun -np 1: bound to one of 2 cores
  EXPECT_NE(w.find("--bind-to none"), std::string::npos) << w;
  EXPECT_NE(w.find("--map-by slot:PE=2"), std::string::npos) << w;
  EXPECT_NE(w.find("rank 0"), std::string::npos) << w;
  EXPECT_EQ(core_binding_warning(0, 2, 1, 2), "");   // unbound: its share
  EXPECT_EQ(core_binding_warning(1, 2, 2, 1), "");   // two ranks, a core each: their share
  EXPECT_EQ(core_binding_warning(3, 2, 4, 1), "");   // oversubscribed: share 0, nothing to fix
  EXPECT_NE(core_binding_warning(1, 64, 2, 1), "");  // 32 cores each, bound to one
}

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

// The progress line's images per second: significant digits for slow runs (a 1e9 step of 4
// images in 45 s printed "0 img/s"), whole numbers for fast ones.
TEST(Progress, RatesKeepSignificantDigits) {
  EXPECT_EQ(shardgan::format_rate(4 / 45.0), "0.0889");
  EXPECT_EQ(shardgan::format_rate(12.345), "12.3");
  EXPECT_EQ(shardgan::format_rate(4521.4), "4521");
  EXPECT_EQ(shardgan::format_rate(0), "0");
}
