// A TorchScript feature network (src/eval/torchscript_network.cpp): pytorch-fid's FID
// Inception-v3 with random weights, exported by scripts/export_inception.py (the pretrained
// weights cannot be downloaded here). ctest torchscript_metrics:
//  - shardgan's features and logits of grey 32x32 and colour 64x64 images equal the Python
//    module's (torch.jit.load, tests/torchscript_ref.py) within 1e-5 relative;
//  - FID, KID, precision/recall and IS on 2,560 samples per side (1024 features, 1008
//    logits) equal an independent float64 numpy computation within 1e-6;
//  - files without a manifest, with changed weights, with a wrong output width or an input
//    size the network cannot take, and images of a size the manifest does not allow, are
//    refused with a message naming the file;
//  - NVIDIA's inception-2015-12-05.pt interface (StyleGAN2-ADA's detector), on a stand-in.
// torchscript_metrics_control skips the input range mapping (SHARDGAN_TEST_CONTROL=
// feature_range): the feature comparison must fail; torchscript_detector_control feeds the
// detector unrounded pixels under the same switch. Skips (77) without the Python packages.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <system_error>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "shardgan/eval/feature_metrics.h"
#include "shardgan/eval/feature_network.h"
#include "shardgan/eval/frechet.h"

// The gtest files compile together in batches (tests/CMakeLists.txt): this file's names
// live in a namespace of its own.
namespace SHARDGAN_UNITY_ID {

using namespace shardgan::eval;
namespace fs = std::filesystem;

namespace {

std::string python_path() {
  const char* env = std::getenv("SHARDGAN_PYTHON");
  return env && *env ? env : SHARDGAN_PYTHON;
}

const std::string kRef = SHARDGAN_SOURCE_DIR "/tests/torchscript_ref.py";
const std::string kNet = SHARDGAN_INCEPTION_FILE;  // exported once per build tree

struct TempDir {
  fs::path path;
  TempDir() {
    char tmpl[] = "/tmp/shardgan_torchscript_XXXXXX";
    if (mkdtemp(tmpl) != nullptr) path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path.empty() && !std::getenv("SHARDGAN_KEEP_TEST_FILES")) fs::remove_all(path, ec);
  }
};

void write_raw(const fs::path& path, const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  std::ofstream f(path, std::ios::binary);
  f.write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.numel() * c.element_size()));
  ASSERT_TRUE(f.good()) << path;
}

at::Tensor read_raw(const fs::path& path, at::IntArrayRef shape) {
  at::Tensor t = torch::empty(shape, torch::kDouble);
  std::ifstream f(path, std::ios::binary);
  f.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(t.numel() * 8));
  EXPECT_TRUE(f.good()) << path;
  return t;
}

int run(const std::string& cmd) { return std::system(cmd.c_str()); }

// Images uniform in [-1, 1], one batch per entry of `shapes`, drawn from `gen`; batch i is
// written as root/<prefix><i>/meta.txt and images.f32 (the reference scripts' input), and
// `dirs` gets each folder after a space.
std::vector<at::Tensor> write_image_dirs(const fs::path& root, const std::string& prefix,
                                         const std::vector<std::vector<int64_t>>& shapes, at::Generator& gen,
                                         std::string& dirs) {
  std::vector<at::Tensor> images;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const auto& shape = shapes[i];
    images.push_back(torch::rand(shape, gen, torch::kFloat) * 2 - 1);
    const fs::path dir = root / (prefix + std::to_string(i));
    fs::create_directories(dir);
    std::ofstream meta(dir / "meta.txt");
    meta << "n " << shape[0] << "\nchannels " << shape[1] << "\nheight " << shape[2] << "\nwidth " << shape[3] << "\n";
    write_raw(dir / "images.f32", images.back());
    dirs += " " + dir.string();
  }
  return images;
}

// Skips unless the Python with torch, torchvision and xxhash exists; exports the network once.
class TorchScriptMetrics : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string py = python_path();
    if (access(py.c_str(), X_OK) != 0) GTEST_SKIP() << "no Python at " << py << " (SHARDGAN_PYTHON)";
    // Whether the packages are installed, not an import of them (importing torch and
    // torchvision took 15 s on a slowed guest, paid again by each control entry); a package
    // that is present but broken fails the comparison instead of skipping it.
    static const bool installed =
        run(py + " -c \"import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in "
                 "('torch', 'torchvision', 'xxhash', 'numpy')))\" 2> /dev/null") == 0;
    if (!installed) {
      GTEST_SKIP() << py << " has no torch, torchvision, xxhash or numpy (scripts/setup-dev.sh installs them)";
    }
    if (!fs::exists(kNet)) {
      fs::create_directories(fs::path(kNet).parent_path());
      const std::string tmp = kNet + ".tmp";
      ASSERT_EQ(run(py + " " SHARDGAN_SOURCE_DIR "/scripts/export_inception.py --random-weights --seed 1 -o " + tmp),
                0);
      fs::rename(tmp, kNet);
    }
  }
};

// Largest |a - b| over the largest |b|.
double relative_difference(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>() / b.abs().max().item<double>();
}

template <class Fn>
void expect_refused(Fn fn, const std::string& file, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "no exception for " << file << "; expected one naming '" << needle << "'";
  } catch (const FeatureNetworkError& e) {
    const std::string msg = e.what();
    std::printf("refused: %s\n", msg.c_str());
    EXPECT_NE(msg.find(file), std::string::npos) << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
  }
}

TEST_F(TorchScriptMetrics, FeaturesMatchPython) {
  auto net = load_feature_network("torchscript", kNet);
  EXPECT_EQ(net->feature_dim(), 2048);
  EXPECT_EQ(net->num_logits(), 1008);
  EXPECT_FALSE(net->comparable_with_papers());
  EXPECT_NE(net->description().find("random weights"), std::string::npos) << net->description();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  const std::vector<std::vector<int64_t>> shapes = {{4, 1, 32, 32}, {4, 3, 64, 64}};
  std::vector<at::Tensor> images;
  const TempDir tmp;
  std::string dirs;
  images = write_image_dirs(tmp.path, "", shapes, gen, dirs);
  ASSERT_EQ(run(python_path() + " " + kRef + " features " + kNet + dirs), 0);
  for (size_t i = 0; i < shapes.size(); ++i) {
    const auto& shape = shapes[i];
    const auto t0 = std::chrono::steady_clock::now();
    const FeatureBatch mine = net->run(images[i], 3);  // batches of 3 and 1
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const fs::path dir = tmp.path / std::to_string(i);
    const at::Tensor f = read_raw(dir / "features_py.f64", {shape[0], 2048});
    const at::Tensor l = read_raw(dir / "logits_py.f64", {shape[0], 1008});
    const double df = relative_difference(mine.features, f), dl = relative_difference(mine.logits, l);
    std::printf("%lldx%lldx%lld images: features %.3g, logits %.3g relative difference (max |feature| %.3g); "
                "%.2f s for %lld images\n",
                (long long)shape[1], (long long)shape[2], (long long)shape[3], df, dl, f.abs().max().item<double>(),
                secs, (long long)shape[0]);
    EXPECT_LE(df, 1e-5) << "MISMATCH features";
    EXPECT_LE(dl, 1e-5) << "MISMATCH logits";
    EXPECT_GT(f.abs().max().item<double>(), 0.0);
  }
}

// Features of width 512 (Inception's 2048 took 2 minutes here, most of it in FID's
// eigendecompositions on both sides, and 1024 about 38 s on a slowed guest; the code paths do
// not depend on the width): a 16-d latent through a fixed projection plus noise (so
// that the neighbourhoods of precision/recall are not all alike), the fakes' latents scaled
// and shifted; logits of Inception's 1008 classes.
TEST_F(TorchScriptMetrics, MetricsMatchFloat64Python) {
  const int64_t n = 2560, d = 512, subsets = 5, m = 1000, classes = 1008, splits = 10, k = 3;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  const at::Tensor proj = torch::randn({16, d}, gen, torch::kDouble);
  const at::Tensor real = torch::randn({n, 16}, gen, torch::kDouble).mm(proj) +
                          0.5 * torch::randn({n, d}, gen, torch::kDouble);
  const at::Tensor fake = (torch::randn({n, 16}, gen, torch::kDouble) * 1.1 + 0.12).mm(proj) +
                          0.5 * torch::randn({n, d}, gen, torch::kDouble);
  const at::Tensor logits = torch::randn({n, classes}, gen, torch::kDouble) * 3.0;
  const KidSubsets idx = draw_kid_subsets(n, n, subsets, m, 7);
  const TempDir tmp;
  write_raw(tmp.path / "real.f64", real);
  write_raw(tmp.path / "fake.f64", fake);
  write_raw(tmp.path / "kid_real.i64", idx.real);
  write_raw(tmp.path / "kid_fake.i64", idx.fake);
  write_raw(tmp.path / "logits.f64", logits);
  {
    std::ofstream meta(tmp.path / "meta.txt");
    meta << "n_real " << n << "\nn_fake " << n << "\nwidth " << d << "\nsubsets " << subsets << "\nsubset_real " << m
         << "\nsubset_fake " << m << "\nk " << k << "\nn_logits " << n << "\nclasses " << classes << "\nsplits "
         << splits << "\n";
  }
  auto t0 = std::chrono::steady_clock::now();
  auto lap = [&t0] {
    const auto now = std::chrono::steady_clock::now();
    const double s = std::chrono::duration<double>(now - t0).count();
    t0 = now;
    return s;
  };
  const double fid = frechet_distance(feature_stats(real), feature_stats(fake));
  const double t_fid = lap();
  const MeanStd kid = kernel_inception_distance(real, fake, idx);
  const double t_kid = lap();
  const PrecisionRecall pr = precision_recall(real, fake, k);
  const double t_pr = lap();
  const MeanStd is = inception_score(logits, splits);
  const double t_is = lap();
  ASSERT_EQ(run(python_path() + " " + kRef + " metrics " + tmp.path.string()), 0);
  std::printf("C++: FID %.2fs, KID %.2fs, P/R %.2fs, IS %.2fs; Python %.2fs\n", t_fid, t_kid, t_pr, t_is, lap());
  std::map<std::string, double> ref;
  {
    std::ifstream f(tmp.path / "ref.txt");
    std::string name;
    double value = 0;
    while (f >> name >> value) ref[name] = value;
  }
  ASSERT_EQ(ref.size(), 8u);
  EXPECT_EQ(ref.at("near_ties"), 0.0) << "a distance within 1e-9 of a radius: the Gram form could decide it";
  const std::map<std::string, double> mine = {{"fid", fid},           {"kid_mean", kid.mean},   {"kid_std", kid.std},
                                              {"precision", pr.precision}, {"recall", pr.recall}, {"is_mean", is.mean},
                                              {"is_std", is.std}};
  for (const auto& [name, value] : mine) {
    const double r = ref.at(name), rel = std::abs(value - r) / std::abs(r);
    std::printf("%-9s C++ %.17g  numpy %.17g  relative difference %.3g\n", name.c_str(), value, r, rel);
    EXPECT_LE(rel, 1e-6) << "MISMATCH " << name;
  }
  EXPECT_GT(pr.precision, 0.05);
  EXPECT_LT(pr.precision, 0.95);
  EXPECT_GT(pr.recall, 0.05);
  EXPECT_LT(pr.recall, 0.95);
}

// NVIDIA's inception-2015-12-05.pt, as StyleGAN2-ADA calls it: a stand-in with its
// TorchScript interface and no manifest (tests/stylegan2_detector_ref.py). shardgan's features
// and the softmax of its logits equal the stand-in's, fed the uint8 pixels StyleGAN2-ADA
// feeds it, within 1e-5 relative; a manifest-less module without that interface is refused.
TEST_F(TorchScriptMetrics, StyleGan2AdaDetector) {
  const TempDir tmp;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(6);
  const std::vector<std::vector<int64_t>> shapes = {{5, 1, 32, 32}, {5, 3, 48, 48}};
  std::vector<at::Tensor> images;
  std::string dirs;
  images = write_image_dirs(tmp.path, "images", shapes, gen, dirs);
  ASSERT_EQ(run(python_path() + " " SHARDGAN_SOURCE_DIR "/tests/stylegan2_detector_ref.py " + tmp.path.string() + dirs),
            0);
  const std::string path = (tmp.path / "detector.pt").string();
  auto net = load_feature_network("torchscript", path);
  EXPECT_EQ(net->feature_dim(), 256);
  EXPECT_EQ(net->num_logits(), 1008);
  EXPECT_FALSE(net->comparable_with_papers());
  EXPECT_EQ(net->input().quantize, "uint8");
  EXPECT_NE(net->description().find("StyleGAN2-ADA"), std::string::npos) << net->description();
  for (size_t i = 0; i < shapes.size(); ++i) {
    const fs::path dir = tmp.path / ("images" + std::to_string(i));
    const int64_t n = shapes[i][0];
    const FeatureBatch mine = net->run(images[i], 2);
    const at::Tensor f = read_raw(dir / "features_py.f64", {n, 256});
    const at::Tensor p = read_raw(dir / "probs_py.f64", {n, 1008});
    const double df = relative_difference(mine.features, f);
    const double dp = relative_difference(torch::softmax(mine.logits, 1), p);
    std::printf("detector, %lldx%lldx%lld images: features %.3g, probabilities %.3g relative difference\n",
                (long long)shapes[i][1], (long long)shapes[i][2], (long long)shapes[i][3], df, dp);
    EXPECT_LE(df, 1e-5) << "MISMATCH features";
    EXPECT_LE(dp, 1e-5) << "MISMATCH probabilities";
    EXPECT_GT(f.abs().max().item<double>(), 0.0);
  }
  // NVIDIA's vgg16.pt interface (StyleGAN2-ADA's precision/recall): features only.
  auto vgg = load_feature_network("torchscript", (tmp.path / "vgg16.pt").string());
  EXPECT_EQ(vgg->feature_dim(), 128);
  EXPECT_EQ(vgg->num_logits(), 0);
  EXPECT_FALSE(vgg->comparable_with_papers());
  EXPECT_NE(vgg->description().find("VGG16"), std::string::npos) << vgg->description();
  for (size_t i = 0; i < shapes.size(); ++i) {
    const fs::path dir = tmp.path / ("images" + std::to_string(i));
    const FeatureBatch mine = vgg->run(images[i], 2);
    const at::Tensor f = read_raw(dir / "features_vgg_py.f64", {shapes[i][0], 128});
    const double df = relative_difference(mine.features, f);
    std::printf("vgg16.pt interface, images %zu: features %.3g relative difference\n", i, df);
    EXPECT_LE(df, 1e-5) << "MISMATCH vgg16.pt features";
    EXPECT_FALSE(mine.logits.defined());
  }
  const std::string plain = (tmp.path / "plain.pt").string();
  expect_refused([&] { load_feature_network("torchscript", plain); }, plain, "detector interface");
}

// torchvision's VGG16 up to fc2 (scripts/export_vgg16.py, random weights, exported once per
// build tree: 0.5 GB), the features of precision/recall in eval.pr_feature_network: shardgan's
// features of grey 32x32 and colour 64x64 images equal the Python module's within 1e-5
// relative, and differ between images. Extended tier (ctest vgg16_export: about a minute).
TEST_F(TorchScriptMetrics, Vgg16ExportMatchesPython) {
  const std::string file = SHARDGAN_VGG16_FILE;
  if (!fs::exists(file)) {
    fs::create_directories(fs::path(file).parent_path());
    ASSERT_EQ(run(python_path() + " " SHARDGAN_SOURCE_DIR "/scripts/export_vgg16.py --random-weights --seed 1 -o " +
                  file + ".tmp"),
              0);
    fs::rename(file + ".tmp", file);
  }
  auto net = load_feature_network("torchscript", file);
  EXPECT_EQ(net->feature_dim(), 4096);
  EXPECT_EQ(net->num_logits(), 0);
  EXPECT_NE(net->description().find("vgg16"), std::string::npos) << net->description();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(8);
  const std::vector<std::vector<int64_t>> shapes = {{3, 1, 32, 32}, {3, 3, 64, 64}};
  std::vector<at::Tensor> images;
  const TempDir tmp;
  std::string dirs;
  images = write_image_dirs(tmp.path, "", shapes, gen, dirs);
  ASSERT_EQ(run(python_path() + " " + kRef + " features " + file + dirs), 0);
  for (size_t i = 0; i < shapes.size(); ++i) {
    const auto& shape = shapes[i];
    const FeatureBatch mine = net->run(images[i], 2);
    const at::Tensor f = read_raw(tmp.path / std::to_string(i) / "features_py.f64", {shape[0], 4096});
    const double df = relative_difference(mine.features, f);
    const double spread = (f[0] - f[1]).abs().max().item<double>() / f.abs().max().item<double>();
    std::printf("vgg16 fc2, %lldx%lldx%lld images: features %.3g relative difference; images 0 and 1 differ by %.3g\n",
                (long long)shape[1], (long long)shape[2], (long long)shape[3], df, spread);
    EXPECT_LE(df, 1e-5) << "MISMATCH features";
    EXPECT_GT(spread, 1e-3) << "the features do not tell images apart";
  }
}

TEST_F(TorchScriptMetrics, RefusesBadFiles) {
  const TempDir tmp;
  const std::string dir = tmp.path.string();
  ASSERT_EQ(run(python_path() + " " + kRef + " variants " + kNet + " " + dir), 0);
  auto load = [](const std::string& p) { return [p] { load_feature_network("torchscript", p); }; };
  expect_refused(load(dir + "/missing.pt"), dir + "/missing.pt", "no such file");
  {
    std::ofstream junk(tmp.path / "junk.pt");
    junk << "not a zip archive";
  }
  expect_refused(load(dir + "/junk.pt"), dir + "/junk.pt", "not a TorchScript archive");
  expect_refused(load(dir + "/no_manifest.pt"), dir + "/no_manifest.pt", "holds no manifest");
  expect_refused(load(dir + "/tampered.pt"), dir + "/tampered.pt", "weights_xxh3");
  expect_refused(load(dir + "/wide.pt"), dir + "/wide.pt", "outputs.features 1000");
  expect_refused(load(dir + "/small.pt"), dir + "/small.pt", "at load, on one zero image");
  auto fixed = load_feature_network("torchscript", dir + "/fixed299.pt");
  expect_refused([&] { fixed->check_images(3, 64, 64); }, dir + "/fixed299.pt", "input size");
  expect_refused([&] { fixed->run(torch::zeros({1, 1, 32, 32})); }, dir + "/fixed299.pt", "input size");
  fixed->check_images(1, 299, 299);  // grey at the contract's size is fine
}

}  // namespace

}  // namespace SHARDGAN_UNITY_ID
