// DCGAN at model.image_size 32 to 256 (src/models/dcgan/dcgan.cpp). ctest dcgan_resolution:
//  - at 64 the parameter counts are those of PyTorch's DCGAN example at nz 100, ngf = ndf =
//    64, nc 3 (G 3,576,704, D 2,765,568), and at every size they equal a plain-PyTorch copy
//    re-typed from the paper (tests/dcgan_reference.py; that part skips without the Python);
//  - G makes [B, C, S, S] images and D takes them to [B, 1], on 1 rank at stage 0 and on the
//    units' names (block0..block{L-1}, out), the 32-pixel layout unchanged;
//  - model.image_size outside 32, 64, 128, 256 is a config error naming the key.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "shardgan/comm/local_communicator.h"
#include "shardgan/models/dcgan.h"
#include "shardgan/util/config_reader.h"
#include "test_util.h"

// The gtest files compile together in batches (tests/CMakeLists.txt): this file's names
// live in a namespace of its own.
namespace SHARDGAN_UNITY_ID {

using namespace shardgan;

namespace {

struct Counts {
  int64_t g = 0, d = 0;
};

Counts ours(int64_t size, int64_t z, int64_t gw, int64_t dw, int64_t ch, bool check_shapes) {
  DcganConfig cfg;
  cfg.image_size = size;
  cfg.z_dim = z;
  cfg.g_width = gw;
  cfg.d_width = dw;
  cfg.channels = ch;
  LocalCommunicator comm;
  auto g = build_generator(cfg, comm, test_util::sharding(0), 1);
  auto d = build_discriminator(cfg, comm, test_util::sharding(0), 2);
  if (check_shapes) {
    torch::NoGradGuard no_grad;
    const at::Tensor img = g->forward(torch::randn({2, z, 1, 1}));
    EXPECT_EQ(img.sizes(), (std::vector<int64_t>{2, ch, size, size}));
    EXPECT_EQ(d->forward(img).sizes(), (std::vector<int64_t>{2, 1}));
    int64_t L = 0;
    while ((int64_t{4} << L) < size) ++L;
    EXPECT_EQ(static_cast<int64_t>(g->units().size()), L + 1);
    EXPECT_EQ(g->units().back()->name(), "out");
    EXPECT_EQ(g->units().front()->name(), "block0");
  }
  return {g->numel(), d->numel()};
}

std::string python_path() {
  const char* env = std::getenv("SHARDGAN_PYTHON");
  return env && *env ? env : SHARDGAN_PYTHON;
}

}  // namespace

TEST(DcganResolution, PaperLayoutAt64) {
  const Counts c = ours(64, 100, 64, 64, 3, true);
  EXPECT_EQ(c.g, 3576704);
  EXPECT_EQ(c.d, 2765568);
}

TEST(DcganResolution, ShapesAtEverySize) {
  for (int64_t size : {32, 64, 128, 256}) ours(size, 16, 4, 4, size == 128 ? 3 : 1, true);
}

TEST(DcganResolution, CountsMatchPlainPyTorch) {
  const std::string py = python_path();
  if (access(py.c_str(), X_OK) != 0) GTEST_SKIP() << "no Python at " << py;
  struct Case {
    int64_t size, z, gw, dw, ch;
  };
  const std::vector<Case> cases = {{32, 64, 32, 32, 1}, {64, 100, 64, 64, 3}, {128, 32, 16, 24, 3}, {256, 16, 8, 8, 1}};
  std::string cmd = py + " " SHARDGAN_SOURCE_DIR "/tests/dcgan_reference.py";
  for (const Case& k : cases) {
    for (int64_t v : {k.size, k.z, k.gw, k.dw, k.ch}) cmd += " " + std::to_string(v);
  }
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr) << cmd;
  std::vector<std::pair<long long, long long>> theirs;
  long long g = -1, d = -1;
  while (std::fscanf(p, " g %lld d %lld", &g, &d) == 2) theirs.emplace_back(g, d);
  ASSERT_EQ(pclose(p), 0) << cmd;
  ASSERT_EQ(theirs.size(), cases.size()) << cmd;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& k = cases[i];
    const Counts c = ours(k.size, k.z, k.gw, k.dw, k.ch, false);
    std::printf("%lld px: G %lld (PyTorch %lld), D %lld (PyTorch %lld)\n", (long long)k.size, (long long)c.g,
                theirs[i].first, (long long)c.d, theirs[i].second);
    EXPECT_EQ(c.g, theirs[i].first) << k.size;
    EXPECT_EQ(c.d, theirs[i].second) << k.size;
  }
}

TEST(DcganResolution, RefusesOtherSizes) {
  for (const char* bad : {"16", "48", "512"}) {
    ConfigReader r({{"model.image_size", bad}}, "test.yaml");
    try {
      make_dcgan_family(r);
      ADD_FAILURE() << "model.image_size " << bad << " accepted";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("model.image_size"), std::string::npos) << e.what();
    }
  }
}

}  // namespace SHARDGAN_UNITY_ID
