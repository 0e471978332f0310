// Config parsing: defaults, overrides, and errors that name the file and the key; keys set
// that have no effect; pix2pix's evaluation set.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "shardgan/data/convert.h"
#include "shardgan/train/config.h"
#include "shardgan/train/evaluation.h"
#include "shardgan/util/progress.h"
#include "shardgan/util/threads.h"

// The gtest files compile together in batches (tests/CMakeLists.txt): this file's names
// live in a namespace of its own.
namespace SHARDGAN_UNITY_ID {

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

// yaml-cpp prints invalid UTF-8 as U+FFFD, so such a config would not read back: it is
// refused, naming the line. Valid UTF-8 (a path with accents) reads back unchanged.
TEST(Config, InvalidUtf8IsRefusedAndUtf8ReadsBack) {
  EXPECT_NE(error_of("run:\n  dir: runs/x\xb6y\n").find("test.yaml: line 2 is not valid UTF-8"), std::string::npos)
      << error_of("run:\n  dir: runs/x\xb6y\n");
  EXPECT_NE(error_of("run: {dir: \xed\xa0\x80}\n").find("line 1 is not valid UTF-8"), std::string::npos);  // a surrogate
  EXPECT_NE(error_of("run: {dir: a\xe2\x82}\n").find("not valid UTF-8"), std::string::npos);  // cut short
  EXPECT_NE(error_of("", {"run.dir=\xff"}).find("--set 'run.dir="), std::string::npos);
  const TrainConfig a = parse_config("run: {dir: \"runs/donn\xc3\xa9es \xe2\x82\xac \xf0\x9f\x98\x80\"}\n", "t.yaml", {});
  EXPECT_EQ(a.run_dir, "runs/donn\xc3\xa9es \xe2\x82\xac \xf0\x9f\x98\x80");
  EXPECT_EQ(parse_config(a.resolved_nested_yaml, "resolved.yaml", {}).resolved_yaml, a.resolved_yaml);
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

// Keys that do nothing: a key set (file or --set) to a non-default value that the resolved
// config ignores warns once, naming the key and why; a key left at its default, or set to it
// (as --print-config's output spells out every default), warns about nothing.
size_t warnings_naming(const TrainConfig& c, const std::string& key) {
  return static_cast<size_t>(std::count_if(c.warnings.begin(), c.warnings.end(), [&](const std::string& w) {
    return w.find("key '" + key + "'") != std::string::npos;
  }));
}

std::string warning_naming(const TrainConfig& c, const std::string& key) {
  for (const std::string& w : c.warnings) {
    if (w.find("key '" + key + "'") != std::string::npos) return w;
  }
  return "";
}

TEST(ConfigWarnings, SharedDForwardUnderTheAlternatingUpdate) {
  const std::string key = "train.shared_d_forward";
  EXPECT_EQ(warnings_naming(parse_config("", "t.yaml", {}), key), 0u);  // the default
  const TrainConfig c = parse_config("train: {shared_d_forward: false}\n", "t.yaml", {});
  EXPECT_EQ(warnings_naming(c, key), 1u);
  const std::string w = warning_naming(c, key);
  EXPECT_NE(w.find("t.yaml"), std::string::npos) << w;
  EXPECT_NE(w.find("train.update alternating"), std::string::npos) << w;
  EXPECT_EQ(warnings_naming(parse_config("", "t.yaml", {"train.shared_d_forward=false"}), key), 1u);  // --set
  EXPECT_EQ(warnings_naming(parse_config("train: {shared_d_forward: true}\n", "t.yaml", {}), key), 0u);
  EXPECT_EQ(warnings_naming(parse_config("train: {update: simultaneous, shared_d_forward: false}\n", "t.yaml", {}),
                            key), 0u);
}

TEST(ConfigWarnings, PlacementKeysUnderSharedPlacement) {
  for (const char* key : {"placement.generator_ranks", "placement.defer_figures"}) {
    const std::string set = std::string(key) + (std::string(key) == "placement.generator_ranks" ? "=2" : "=false");
    EXPECT_EQ(warnings_naming(parse_config("", "t.yaml", {}), key), 0u) << key;
    const TrainConfig c = parse_config("", "t.yaml", {set});
    EXPECT_EQ(warnings_naming(c, key), 1u) << key;
    EXPECT_NE(warning_naming(c, key).find("train.placement shared"), std::string::npos) << warning_naming(c, key);
    EXPECT_EQ(warnings_naming(parse_config("", "t.yaml", {set, "train.placement=split"}), key), 0u) << key;
  }
  EXPECT_EQ(warnings_naming(parse_config("placement: {generator_ranks: 0.5}\n", "t.yaml", {}),
                            "placement.generator_ranks"), 0u);  // its default
}

TEST(ConfigWarnings, SnapshotWithoutAsyncCheckpoints) {
  const std::string key = "checkpoint.snapshot";
  EXPECT_EQ(warnings_naming(parse_config("", "t.yaml", {}), key), 0u);
  const TrainConfig c = parse_config("checkpoint: {snapshot: copy}\n", "t.yaml", {});
  EXPECT_EQ(warnings_naming(c, key), 1u);
  EXPECT_NE(warning_naming(c, key).find("checkpoint.async false"), std::string::npos) << warning_naming(c, key);
  EXPECT_EQ(warnings_naming(parse_config("checkpoint: {async: true, snapshot: copy}\n", "t.yaml", {}), key), 0u);
  // The shipped config spells out snapshot: fork (the default) with async: false.
  EXPECT_TRUE(load_config(SHARDGAN_SOURCE_DIR "/configs/fmnist-dcgan.yaml", {}).warnings.empty());
}

TEST(ConfigWarnings, QuantizationBlockWithoutQuantization) {
  const std::string g = "sharding.generator.quantization_block", d = "sharding.discriminator.quantization_block";
  EXPECT_EQ(warnings_naming(parse_config("", "t.yaml", {}), g), 0u);
  const TrainConfig c = parse_config("sharding: {generator: {quantization_block: 128}}\n", "t.yaml", {});
  EXPECT_EQ(warnings_naming(c, g), 1u);
  EXPECT_EQ(warnings_naming(c, d), 0u);
  EXPECT_NE(warning_naming(c, g).find("sharding.generator.quantized_weights"), std::string::npos);
  for (const char* q : {"sharding.generator.quantized_weights=int8", "sharding.generator.quantized_gradients=int4"}) {
    EXPECT_EQ(warnings_naming(parse_config("", "t.yaml", {g + "=128", q}), g), 0u) << q;
  }
  EXPECT_EQ(warnings_naming(parse_config("", "t.yaml", {d + "=64"}), d), 1u);
}

TEST(Config, StateDtypeKeys) {
  // int8 states align the model's flat parameter to their block; the globs read as a list.
  const TrainConfig c = parse_config(
      "optim:\n  generator: {state_dtype: int8, state_block: 128, state_float32: [\"shared.*\", \"*.bias\"]}\n"
      "  discriminator: {state_dtype: bfloat16}\n",
      "t.yaml", {});
  EXPECT_EQ(c.g_optim.state.dtype, StateDtype::kInt8);
  EXPECT_EQ(c.g_sharding.flat_align, 128);
  EXPECT_EQ(c.g_optim.state.float32, (std::vector<std::string>{"shared.*", "*.bias"}));
  EXPECT_EQ(c.d_optim.state.dtype, StateDtype::kBFloat16);
  EXPECT_EQ(c.d_sharding.flat_align, 1);  // only 8-bit blocks need the alignment
  EXPECT_EQ(c.d_optim.state.float32, std::vector<std::string>{"family"});  // the family's embeddings
  OptimizerConfig r = c.d_optim;
  r.state.float32.push_back("out.linear.*");
  resolve_state_float32(r, {"out.embed.*"});
  EXPECT_EQ(r.state.float32, (std::vector<std::string>{"out.embed.*", "out.linear.*"}));
  EXPECT_NE(error_of("optim: {generator: {state_dtype: int4}}\n").find("optim.generator.state_dtype"), std::string::npos);
  EXPECT_NE(error_of("optim: {generator: {type: sgd, state_dtype: int8}}\n").find("adam or adamw"), std::string::npos);
  // Offloaded reduced states are accepted; float64 shards and a bfloat16 gradient dtype
  // without gradient offload are refused, naming the key.
  const TrainConfig off = parse_config(
      "optim: {generator: {state_dtype: int8}}\n"
      "offload: {generator: {optimizer: disk, param: disk, gradient: disk, gradient_dtype: bfloat16}}\n"
      "sharding: {generator: {stage: 3}}\n", "t.yaml", {});
  EXPECT_EQ(off.g_optim.offload.gradient_dtype, OffloadGradDtype::kBFloat16);
  EXPECT_EQ(off.g_optim.state.dtype, StateDtype::kInt8);
  EXPECT_NE(error_of("model: {dtype: float64}\noptim: {generator: {state_dtype: int8}}\n").find("optim.generator.state_dtype"),
            std::string::npos);
  EXPECT_NE(error_of("offload: {generator: {optimizer: cpu, gradient_dtype: bfloat16}}\n")
                .find("offload.generator.gradient_dtype"),
            std::string::npos);
  EXPECT_NE(error_of("offload: {generator: {gradient_dtype: float16}}\n").find("offload.generator.gradient_dtype"),
            std::string::npos);
  EXPECT_NE(error_of("optim: {generator: {state_block: 0}}\n").find("state_block"), std::string::npos);
  // Keys that do nothing with float32 states warn.
  EXPECT_EQ(warnings_naming(parse_config("optim: {generator: {state_block: 128}}\n", "t.yaml", {}),
                            "optim.generator.state_block"),
            1u);
}

// One warning per key, whatever else is set; every family's defaults and --print-config's
// output of a config with ignored keys warn about nothing new.
TEST(ConfigWarnings, OncePerKeyAndNeverForDefaults) {
  const TrainConfig c = parse_config(
      "train: {shared_d_forward: false}\nplacement: {generator_ranks: 3, defer_figures: false}\n"
      "checkpoint: {snapshot: copy}\nsharding: {generator: {quantization_block: 64}, discriminator: "
      "{quantization_block: 64}}\n", "t.yaml", {});
  EXPECT_EQ(c.warnings.size(), 6u);
  for (const std::string& w : c.warnings) EXPECT_EQ(std::count(c.warnings.begin(), c.warnings.end(), w), 1) << w;
  const TrainConfig back = parse_config(c.resolved_nested_yaml, "resolved.yaml", {});
  EXPECT_EQ(back.warnings.size(), 6u);  // still set, still ignored
  for (const char* arch : {"dcgan", "biggan", "pix2pix"}) {
    const TrainConfig d = parse_config("", "t.yaml", {std::string("model.arch=") + arch});
    EXPECT_TRUE(d.warnings.empty()) << arch << ": " << d.warnings.front();
    EXPECT_TRUE(parse_config(d.resolved_nested_yaml, "resolved.yaml", {}).warnings.empty()) << arch;
  }
}

// sharding.<model>.node_shared_gather would silently bypass qwZ's int8 weights and hpZ's
// secondary copy: refused at config time, naming both keys.
TEST(Config, NodeSharedGatherRefusedWithQwzOrHpz) {
  const std::string qw = error_of("sharding: {generator: {node_shared_gather: true, quantized_weights: int8}}\n");
  EXPECT_NE(qw.find("sharding.generator.node_shared_gather"), std::string::npos) << qw;
  EXPECT_NE(qw.find("sharding.generator.quantized_weights"), std::string::npos) << qw;
  for (const char* k : {"2", "auto"}) {
    const std::string hpz = error_of(std::string("sharding: {discriminator: {node_shared_gather: true, "
                                                 "hpz_partition_size: ") + k + "}}\n");
    EXPECT_NE(hpz.find("sharding.discriminator.node_shared_gather"), std::string::npos) << hpz;
    EXPECT_NE(hpz.find("sharding.discriminator.hpz_partition_size"), std::string::npos) << hpz;
  }
  // Each alone, and the gather of one model beside the other's qwZ, are taken.
  EXPECT_TRUE(parse_config("sharding: {generator: {node_shared_gather: true}}\n", "t", {}).g_sharding.node_shared_gather);
  EXPECT_EQ(parse_config("sharding: {generator: {quantized_weights: int8}}\n", "t", {}).g_sharding.quantized_weights_bits, 8);
  EXPECT_EQ(parse_config("sharding: {generator: {hpz_partition_size: 2}}\n", "t", {}).g_sharding.hpz_partition_size, 2);
  EXPECT_EQ(error_of("sharding: {generator: {node_shared_gather: true}, discriminator: {quantized_weights: int8}}\n"),
            "");
}

// placement.generator_ranks is a double in the file: a count is range-checked there, and
// bounded by the world size before split_generator_ranks converts it to int.
TEST(Config, GeneratorRanksBounded) {
  for (const char* v : {"1e12", "4294967297", "1048577"}) {
    const std::string e = error_of("", {std::string("placement.generator_ranks=") + v});
    EXPECT_NE(e.find("placement.generator_ranks"), std::string::npos) << v << ": " << e;
    EXPECT_NE(e.find("1048576"), std::string::npos) << v << ": " << e;
  }
  TrainConfig c = parse_config("", "t", {"train.placement=split", "placement.generator_ranks=1048576"});
  EXPECT_EQ(split_generator_ranks(c, 4), 4);  // the caller refuses K = N
  c.generator_ranks = 1e300;                  // past int, as no config can give it
  EXPECT_EQ(split_generator_ranks(c, 8), 8);
  c.generator_ranks = 3;
  EXPECT_EQ(split_generator_ranks(c, 4), 3);
  c.generator_ranks = 0.25;
  EXPECT_EQ(split_generator_ranks(c, 8), 2);
  c.generator_ranks = 0.99;
  EXPECT_EQ(split_generator_ranks(c, 4), 3);  // the fraction keeps a rank for D
}

// pix2pix's evaluation scores the edge maps of Fashion-MNIST's t10k images: on a paired folder,
// or on an HDF5 file that is not Fashion-MNIST's edge pairs, that is another task, named by a
// warning; the record carries eval_set.
TEST(Pix2pixEvalSet, ScoredSetIsNamedAndAMismatchWarns) {
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("shardgan-evalset-" + std::to_string(getpid()))).string();
  std::filesystem::create_directories(dir);
  auto pairs_file = [&](const std::string& name, bool fmnist_classes) {
    const std::string path = dir + "/" + name;
    std::vector<uint8_t> img(2 * 32 * 32, 7), a(2 * 32 * 32, 0);
    std::vector<int64_t> labels{0, 1};
    data::Hdf5Writer w(path, 2, 1, 32, 32, 0, 1);
    w.append(img.data(), labels.data(), 2, a.data());
    if (fmnist_classes) w.set_classes(data::kFashionMnistClassNames);
    w.commit();
    return path;
  };
  const std::string fmnist = pairs_file("fmnist-pairs.h5", true), other = pairs_file("other-pairs.h5", false);
  const std::vector<std::string> p2p{"model.arch=pix2pix"};
  auto cfg = [&](std::vector<std::string> more) {
    more.insert(more.begin(), p2p.begin(), p2p.end());
    return parse_config("", "t.yaml", more);
  };
  EXPECT_EQ(image_eval_set(cfg({})), "fashion-mnist-edges");
  EXPECT_EQ(image_eval_mismatch(cfg({})), "");
  EXPECT_EQ(image_eval_set(cfg({"data.source=synthetic"})), "synthetic-edges");
  EXPECT_EQ(image_eval_mismatch(cfg({"data.source=synthetic"})), "");
  EXPECT_EQ(image_eval_mismatch(cfg({"data.source=hdf5", "data.path=" + fmnist})), "");
  const std::string h5 = image_eval_mismatch(cfg({"data.source=hdf5", "data.path=" + other}));
  EXPECT_NE(h5.find(other), std::string::npos) << h5;
  EXPECT_NE(h5.find("eval_set: fashion-mnist-edges"), std::string::npos) << h5;
  const std::string folder = image_eval_mismatch(cfg({"data.source=paired", "data.path=/some/ab"}));
  EXPECT_NE(folder.find("data.source paired"), std::string::npos) << folder;
  EXPECT_EQ(image_eval_set(cfg({"data.source=paired", "data.path=/some/ab"})), "fashion-mnist-edges");
  EXPECT_EQ(image_eval_set(parse_config("", "t.yaml", {})), "");  // DCGAN: no pairs
  EXPECT_EQ(image_eval_mismatch(parse_config("", "t.yaml", {"data.source=hdf5", "data.path=" + other})), "");
  // The record's tag, once, without a suffix; none for a family without pairs.
  EvalResult r;
  r.eval_set = "fashion-mnist-edges";
  nlohmann::json j;
  put_scores(j, r);
  put_scores(j, r, "_ema");
  EXPECT_EQ(j.value("eval_set", ""), "fashion-mnist-edges");
  EXPECT_FALSE(j.contains("eval_set_ema"));
  nlohmann::json plain;
  put_scores(plain, EvalResult{});
  EXPECT_FALSE(plain.contains("eval_set"));
  std::filesystem::remove_all(dir);
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

}  // namespace SHARDGAN_UNITY_ID
