// Fashion-MNIST labels and splits, synthetic labels, and greyscale/RGB/class-per-row PNG grids.
#include <zlib.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <stb/stb_image.h>
#include <torch/torch.h>

#include "shardgan/data/images.h"
#include "shardgan/util/proc_status.h"
#include "shardgan/train/image_grid.h"

// The gtest files compile together in batches (tests/CMakeLists.txt): this file's names
// live in a namespace of its own.
namespace SHARDGAN_UNITY_ID {

namespace fs = std::filesystem;
using namespace shardgan;

namespace {

// The dataset folder: $SHARDGAN_FMNIST_DIR, else configs/fmnist-dcgan.yaml's data.path
// (where Debian's dataset-fashion-mnist puts it).
std::string fmnist_dir() {
  const char* env = std::getenv("SHARDGAN_FMNIST_DIR");
  if (env && *env) return env;
  std::ifstream cfg(SHARDGAN_SOURCE_DIR "/configs/fmnist-dcgan.yaml");
  bool in_data = false;
  for (std::string line; std::getline(cfg, line);) {
    if (!line.empty() && line[0] != ' ') in_data = line.rfind("data:", 0) == 0;
    const auto at = line.find("path:");
    if (in_data && at != std::string::npos) {
      std::string v = line.substr(at + 5);
      v = v.substr(0, v.find(" #"));
      v.erase(0, v.find_first_not_of(" \t"));
      v.erase(v.find_last_not_of(" \t\r") + 1);
      if (!v.empty()) return v;
    }
  }
  return "/usr/share/datasets/fashion-mnist";
}

#define REQUIRE_FMNIST()                                                                      \
  do {                                                                                        \
    if (!fs::exists(fmnist_dir() + "/train-labels-idx1-ubyte.gz"))                          \
      GTEST_SKIP() << "Fashion-MNIST not in " << fmnist_dir()                                 \
                   << " (apt-get install dataset-fashion-mnist)";                            \
  } while (0)

// A fresh temporary folder, removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() /
            ("shardgan-test-data-grid-" + std::to_string(::getpid()) + "-" + info->name());
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }
  std::string str() const { return path_.string(); }

 private:
  fs::path path_;
};

std::vector<uint8_t> be32(uint32_t v) {
  return {uint8_t(v >> 24), uint8_t(v >> 16), uint8_t(v >> 8), uint8_t(v)};
}

// Writes `bytes` gzip-compressed to `path` with zlib.
void write_gz(const std::string& path, const std::vector<uint8_t>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  if (!bytes.empty()) {
    ASSERT_EQ(gzwrite(f, bytes.data(), unsigned(bytes.size())), int(bytes.size()));
  }
  ASSERT_EQ(gzclose(f), Z_OK);
}

// An idx1 label file: magic, header count, then `labels`.
std::vector<uint8_t> idx1(uint32_t magic, uint32_t count, const std::vector<uint8_t>& labels) {
  std::vector<uint8_t> b = be32(magic);
  for (uint8_t x : be32(count)) b.push_back(x);
  b.insert(b.end(), labels.begin(), labels.end());
  return b;
}

// Expects load_fashion_mnist_labels(dir, split) to throw DataError whose message contains
// the file name and `what`.
void expect_label_error(const std::string& dir, const std::string& split, const std::string& what) {
  const std::string file = dir + "/" + split + "-labels-idx1-ubyte.gz";
  try {
    load_fashion_mnist_labels(dir, split);
    ADD_FAILURE() << "no DataError for " << file << " (expected '" << what << "')";
  } catch (const DataError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(file), std::string::npos) << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
  }
}

// Images whose pixels are exact: value p / 127.5 - 1 for byte p = (seed + 37 i + 11 c + 5 y + 3 x) % 256.
at::Tensor exact_images(int64_t n, int64_t c, int64_t h, int64_t w, int seed) {
  at::Tensor t = torch::empty({n, c, h, w}, torch::kFloat);
  auto a = t.accessor<float, 4>();
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < c; ++k)
      for (int64_t y = 0; y < h; ++y)
        for (int64_t x = 0; x < w; ++x)
          a[i][k][y][x] = float((seed + 37 * i + 11 * k + 5 * y + 3 * x) % 256) / 127.5f - 1.0f;
  return t;
}

uint8_t byte_of(float v) { return uint8_t(std::lround((std::clamp(v, -1.f, 1.f) + 1.f) * 127.5f)); }

struct Png {
  int w = 0, h = 0, c = 0;
  std::vector<uint8_t> px;
  uint8_t at(int y, int x, int k) const { return px[(size_t(y) * w + x) * c + k]; }
};

Png read_png(const std::string& path) {
  Png p;
  unsigned char* data = stbi_load(path.c_str(), &p.w, &p.h, &p.c, 0);
  if (!data) {
    ADD_FAILURE() << "stbi_load(" << path << "): " << stbi_failure_reason();
    return p;
  }
  p.px.assign(data, data + size_t(p.w) * p.h * p.c);
  stbi_image_free(data);
  return p;
}

// Checks that cell `cell` of a grid with `nrow` columns (2-pixel border) holds `img` [C, H, W].
void expect_cell(const Png& png, int nrow, int cell, const at::Tensor& img) {
  const int c = int(img.size(0)), h = int(img.size(1)), w = int(img.size(2));
  const int oy = 2 + (cell / nrow) * (h + 2), ox = 2 + (cell % nrow) * (w + 2);
  auto a = img.accessor<float, 3>();
  int bad = 0;
  for (int k = 0; k < c; ++k)
    for (int y = 0; y < h; ++y)
      for (int x = 0; x < w; ++x)
        if (png.at(oy + y, ox + x, k) != byte_of(a[k][y][x]) && bad++ < 3)
          ADD_FAILURE() << "cell " << cell << " channel " << k << " (" << y << ", " << x << "): got "
                        << int(png.at(oy + y, ox + x, k)) << ", want " << int(byte_of(a[k][y][x]));
  EXPECT_EQ(bad, 0) << "cell " << cell;
}

void expect_blank_cell(const Png& png, int nrow, int cell, int h, int w) {
  const int oy = 2 + (cell / nrow) * (h + 2), ox = 2 + (cell % nrow) * (w + 2);
  for (int k = 0; k < png.c; ++k)
    for (int y = 0; y < h; ++y)
      for (int x = 0; x < w; ++x) ASSERT_EQ(png.at(oy + y, ox + x, k), 0) << "cell " << cell;
}

// Every pixel of the border rows/columns is black.
void expect_black_border(const Png& png, int nrow, int rows, int h, int w) {
  for (int r = 0; r <= rows; ++r)
    for (int y = r * (h + 2); y < r * (h + 2) + 2; ++y)
      for (int x = 0; x < png.w; ++x)
        for (int k = 0; k < png.c; ++k) ASSERT_EQ(png.at(y, x, k), 0) << "border row " << y;
  for (int col = 0; col <= nrow; ++col)
    for (int x = col * (w + 2); x < col * (w + 2) + 2; ++x)
      for (int y = 0; y < png.h; ++y)
        for (int k = 0; k < png.c; ++k) ASSERT_EQ(png.at(y, x, k), 0) << "border column " << x;
}

}  // namespace

// ---------------------------------------------------------------- Fashion-MNIST

TEST(FashionMnistLabels, TrainHas60000With6000PerClass) {
  REQUIRE_FMNIST();
  at::Tensor y = load_fashion_mnist_labels(fmnist_dir());
  EXPECT_EQ(y.scalar_type(), at::kLong);
  ASSERT_EQ(y.dim(), 1);
  ASSERT_EQ(y.size(0), 60000);
  EXPECT_GE(y.min().item<int64_t>(), 0);
  EXPECT_LE(y.max().item<int64_t>(), 9);
  at::Tensor counts = torch::bincount(y, {}, 10);
  EXPECT_TRUE(torch::equal(counts, torch::full({10}, 6000, torch::kLong))) << counts;
  EXPECT_TRUE(torch::equal(y, load_fashion_mnist_labels(fmnist_dir(), "train")));
}

// The loader scales and pads a chunk at a time (values as the whole-split formula gives them),
// and its peak beyond the result is what the memory pre-flight counts for it
// (fashion_mnist_decode_bytes). The peak is read as VmHWM after resetting it (clear_refs 5);
// without that the test skips. Control fmnist_decode_whole (the whole-split float copy)
// must fail the peak check (ctest: fmnist_decode_peak_control).
TEST(FashionMnistImages, DecodePeakIsTheResultAndTheCountedTransient) {
  REQUIRE_FMNIST();
  const at::Tensor t10k = load_fashion_mnist(fmnist_dir(), at::kFloat, "t10k");
  ASSERT_EQ(t10k.sizes(), (std::vector<int64_t>{10000, 1, 32, 32}));
  // The values: the same bits as scaling the whole split and padding it.
  const at::Tensor inner = t10k.narrow(2, 2, 28).narrow(3, 2, 28);
  EXPECT_TRUE(torch::equal(t10k, torch::constant_pad_nd(inner.contiguous(), {2, 2, 2, 2}, -1.0)));
  EXPECT_TRUE(torch::equal(inner.add(1.0).mul(127.5).round().div(127.5).sub(1.0), inner));
  // The peak while loading the 60000-image split.
  {
    std::ofstream clear("/proc/self/clear_refs");
    clear << "5";
    clear.flush();
    if (!clear) GTEST_SKIP() << "cannot reset VmHWM (/proc/self/clear_refs)";
  }
  const int64_t rss0 = proc_status_bytes("VmRSS"), hwm0 = proc_status_bytes("VmHWM");
  if (rss0 < 0 || hwm0 < 0 || hwm0 > rss0 + (int64_t{8} << 20)) GTEST_SKIP() << "VmHWM was not reset";
  at::Tensor train = load_fashion_mnist(fmnist_dir(), at::kFloat, "train");
  const int64_t result = train.numel() * 4, counted = fashion_mnist_decode_bytes(60000, 4);
  const int64_t peak = proc_status_bytes("VmHWM") - rss0;
  const int64_t slack = int64_t{24} << 20;  // zlib's buffers, the allocator's rounding
  if (std::getenv("SHARDGAN_SANITIZE") != nullptr) {
    // scripts/sanitize.sh: ASan's quarantine keeps freed blocks resident, so VmHWM measures
    // the sanitizer (its control, fmnist_decode_peak_control, is not registered there).
    std::printf("[peak] SHARDGAN_SANITIZE: decode peak %.1f MB, bound not checked\n", peak / 1e6);
    return;
  }
  EXPECT_GE(peak, result - slack) << "the result itself was not resident?";
  EXPECT_LE(peak, result + counted + slack)
      << "loading held " << (peak - result) / 1e6 << " MB beyond its " << result / 1e6
      << " MB result; the pre-flight counts " << counted / 1e6 << " MB";
}

TEST(FashionMnistLabels, T10kHas10000With1000PerClass) {
  REQUIRE_FMNIST();
  at::Tensor y = load_fashion_mnist_labels(fmnist_dir(), "t10k");
  EXPECT_EQ(y.scalar_type(), at::kLong);
  ASSERT_EQ(y.size(0), 10000);
  at::Tensor counts = torch::bincount(y, {}, 10);
  EXPECT_TRUE(torch::equal(counts, torch::full({10}, 1000, torch::kLong))) << counts;
  // The first t10k labels, as published with the dataset: Ankle boot, Pullover, Trouser, Trouser, Shirt.
  EXPECT_TRUE(torch::equal(y.narrow(0, 0, 5), torch::tensor({9, 2, 1, 1, 6}, torch::kLong)))
      << y.narrow(0, 0, 5);
}

TEST(FashionMnistImages, TrainAndT10kSplits) {
  REQUIRE_FMNIST();
  at::Tensor train = load_fashion_mnist(fmnist_dir(), at::kFloat);
  EXPECT_EQ(train.sizes(), (std::vector<int64_t>{60000, 1, 32, 32}));
  EXPECT_TRUE(train.is_contiguous());
  EXPECT_GE(train.min().item<float>(), -1.f);
  EXPECT_LE(train.max().item<float>(), 1.f);
  // The 2-pixel padding is -1.
  EXPECT_EQ(train.narrow(2, 0, 2).max().item<float>(), -1.f);
  EXPECT_EQ(train.narrow(3, 30, 2).max().item<float>(), -1.f);
  at::Tensor test = load_fashion_mnist(fmnist_dir(), at::kFloat, "t10k");
  EXPECT_EQ(test.sizes(), (std::vector<int64_t>{10000, 1, 32, 32}));
  EXPECT_FALSE(torch::equal(test.narrow(0, 0, 100), train.narrow(0, 0, 100)));
  EXPECT_THROW(load_fashion_mnist(fmnist_dir(), at::kFloat, "val"), std::invalid_argument);
  EXPECT_THROW(load_fashion_mnist_labels(fmnist_dir(), "test"), std::invalid_argument);
}

TEST(FashionMnistLabels, MissingFileNamesIt) {
  TempDir dir;
  expect_label_error(dir.str(), "train", "does not exist");
  expect_label_error(dir.str(), "t10k", "does not exist");
  try {
    load_fashion_mnist(dir.str(), at::kFloat, "t10k");
    ADD_FAILURE() << "no DataError";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find(dir / "t10k-images-idx3-ubyte.gz"), std::string::npos) << e.what();
  }
}

TEST(FashionMnistLabels, BadFilesThrowDataErrorNamingFileAndProblem) {
  TempDir dir;
  const std::string file = dir / "train-labels-idx1-ubyte.gz";
  const std::vector<uint8_t> ok = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 3, 3};

  write_gz(file, idx1(2049, 12, ok));  // a valid file, for reference
  at::Tensor y = load_fashion_mnist_labels(dir.str());
  EXPECT_TRUE(torch::equal(y, torch::tensor({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 3, 3}, torch::kLong)));

  write_gz(file, idx1(2051, 12, ok));  // an image file's magic
  expect_label_error(dir.str(), "train", "magic 2051");
  write_gz(file, idx1(2049, 20, ok));  // fewer labels than the count
  expect_label_error(dir.str(), "train", "truncated");
  write_gz(file, idx1(2049, 5, ok));  // more labels than the count
  expect_label_error(dir.str(), "train", "more data than its header says");
  write_gz(file, idx1(2049, 0, {}));  // an empty set
  expect_label_error(dir.str(), "train", "label count 0");
  std::vector<uint8_t> bad = ok;
  bad[7] = 10;
  write_gz(file, idx1(2049, 12, bad));  // a label outside [0, 10)
  expect_label_error(dir.str(), "train", "label 7 is 10");
  write_gz(file, {0x00, 0x00, 0x08});  // shorter than the header
  expect_label_error(dir.str(), "train", "truncated");

  // A gzip stream with corrupted compressed bytes: zlib reports it.
  std::vector<uint8_t> many(4000);
  for (size_t i = 0; i < many.size(); ++i) many[i] = uint8_t((i * 7919) % 10);
  write_gz(file, idx1(2049, 4000, many));
  std::vector<char> gz;
  {
    std::ifstream in(file, std::ios::binary);
    gz.assign(std::istreambuf_iterator<char>(in), {});
  }
  ASSERT_GT(gz.size(), 40u);
  for (size_t i = 12; i < gz.size() - 8; i += 3) gz[i] = char(gz[i] ^ 0x5a);
  {
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out.write(gz.data(), std::streamsize(gz.size()));
  }
  expect_label_error(dir.str(), "train", "corrupt gzip data");
}

TEST(SyntheticLabels, DeterministicAndInRange) {
  at::Tensor a = make_synthetic_labels(1000, 7, 10);
  EXPECT_EQ(a.scalar_type(), at::kLong);
  EXPECT_EQ(a.sizes(), (std::vector<int64_t>{1000}));
  EXPECT_GE(a.min().item<int64_t>(), 0);
  EXPECT_LE(a.max().item<int64_t>(), 9);
  EXPECT_TRUE(torch::equal(a, make_synthetic_labels(1000, 7, 10)));
  EXPECT_FALSE(torch::equal(a, make_synthetic_labels(1000, 8, 10)));
  EXPECT_TRUE(torch::equal(make_synthetic_labels(50, 3), make_synthetic_labels(50, 3, 10)));
  EXPECT_EQ(torch::bincount(a, {}, 10).min().item<int64_t>() > 0, true);  // every class drawn
  EXPECT_EQ(make_synthetic_labels(100, 1, 3).max().item<int64_t>(), 2);
  EXPECT_EQ(make_synthetic_labels(0, 1).numel(), 0);
  EXPECT_THROW(make_synthetic_labels(-1, 1), std::invalid_argument);
  EXPECT_THROW(make_synthetic_labels(10, 1, 0), std::invalid_argument);
}

// ---------------------------------------------------------------- PNG grids

TEST(PngGrid, RgbRoundTrips) {
  TempDir dir;
  const std::string path = dir / "rgb.png";
  // 7 images of 5x6 in 3 columns: 3 rows, the last with one image and two blank cells.
  at::Tensor imgs = exact_images(7, 3, 5, 6, 1);
  write_png_grid(path, imgs, 3);
  Png png = read_png(path);
  EXPECT_EQ(png.w, 3 * (6 + 2) + 2);
  EXPECT_EQ(png.h, 3 * (5 + 2) + 2);
  ASSERT_EQ(png.c, 3);
  for (int i = 0; i < 7; ++i) expect_cell(png, 3, i, imgs[i]);
  expect_blank_cell(png, 3, 7, 5, 6);
  expect_blank_cell(png, 3, 8, 5, 6);
  expect_black_border(png, 3, 3, 5, 6);
  // Channels are R, G, B in that order: a pure red image.
  at::Tensor red = torch::full({1, 3, 2, 2}, -1.f);
  red.select(1, 0).fill_(1.f);
  write_png_grid(path, red, 1);
  Png r = read_png(path);
  ASSERT_EQ(r.c, 3);
  EXPECT_EQ(r.at(2, 2, 0), 255);
  EXPECT_EQ(r.at(2, 2, 1), 0);
  EXPECT_EQ(r.at(2, 2, 2), 0);
}

TEST(PngGrid, GreyscaleRoundTripsFromNonContiguousDouble) {
  TempDir dir;
  const std::string path = dir / "grey.png";
  at::Tensor big = exact_images(4, 1, 10, 12, 5);
  // What the trainer does: a narrowed (non-contiguous) view; also a dtype other than float.
  at::Tensor imgs = big.to(at::kDouble).narrow(2, 1, 8).narrow(3, 2, 7);
  ASSERT_FALSE(imgs.is_contiguous());
  write_png_grid(path, imgs, 2);
  Png png = read_png(path);
  EXPECT_EQ(png.w, 2 * (7 + 2) + 2);
  EXPECT_EQ(png.h, 2 * (8 + 2) + 2);
  ASSERT_EQ(png.c, 1);
  at::Tensor expected = imgs.to(at::kFloat).contiguous();
  for (int i = 0; i < 4; ++i) expect_cell(png, 2, i, expected[i]);
  expect_black_border(png, 2, 2, 8, 7);
  // Out-of-range values clamp.
  write_png_grid(path, torch::tensor({-3.f, 5.f}).reshape({2, 1, 1, 1}), 2);
  Png c = read_png(path);
  EXPECT_EQ(c.at(2, 2, 0), 0);
  EXPECT_EQ(c.at(2, 5, 0), 255);
}

TEST(PngGrid, BadShapesThrowInvalidArgumentNamingTheShape) {
  TempDir dir;
  const std::string path = dir / "bad.png";
  auto expect_shape_error = [&](const at::Tensor& t, const std::string& shape) {
    try {
      write_png_grid(path, t, 2);
      ADD_FAILURE() << "no std::invalid_argument for " << shape;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(shape), std::string::npos) << e.what();
    }
  };
  expect_shape_error(torch::zeros({2, 2, 4, 4}), "[2, 2, 4, 4]");
  expect_shape_error(torch::zeros({2, 4, 4, 4}), "[2, 4, 4, 4]");
  expect_shape_error(torch::zeros({2, 4, 4}), "[2, 4, 4]");
  expect_shape_error(torch::zeros({0, 1, 4, 4}), "[0, 1, 4, 4]");
  EXPECT_THROW(write_png_grid(path, torch::zeros({2, 1, 4, 4}), 0), std::invalid_argument);
  EXPECT_FALSE(fs::exists(path));
  EXPECT_THROW(write_png_grid(dir / "no-such-folder/x.png", torch::zeros({1, 1, 4, 4}), 1),
               std::runtime_error);
}

// ---------------------------------------------------------------- class grids

TEST(ClassGrid, LabelsAreClassMajor) {
  at::Tensor l = class_grid_labels(3, 4);
  EXPECT_EQ(l.scalar_type(), at::kLong);
  EXPECT_TRUE(torch::equal(l, torch::tensor({0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2}, torch::kLong))) << l;
  at::Tensor ten = class_grid_labels(10, 8);
  ASSERT_EQ(ten.size(0), 80);
  for (int64_t i = 0; i < 80; ++i) EXPECT_EQ(ten[i].item<int64_t>(), i / 8) << i;
  EXPECT_TRUE(torch::equal(class_grid_labels(1, 1), torch::zeros({1}, torch::kLong)));
  EXPECT_THROW(class_grid_labels(0, 4), std::invalid_argument);
  EXPECT_THROW(class_grid_labels(3, 0), std::invalid_argument);
  // Feeding class_grid_labels' order back gives the identity.
  EXPECT_TRUE(torch::equal(class_grid_indices(l, 3, 4), torch::arange(12, torch::kLong)));
}

TEST(ClassGrid, IndicesPickFirstSamplesOfEachClass) {
  at::Tensor labels = torch::tensor({2, 0, 2, 1, 0, 2, 2, 0}, torch::kInt);
  at::Tensor idx = class_grid_indices(labels, 4, 2);
  // class 0: 1, 4; class 1: 3, (none); class 2: 0, 2; class 3: (none), (none).
  EXPECT_TRUE(torch::equal(idx, torch::tensor({1, 4, 3, -1, 0, 2, -1, -1}, torch::kLong))) << idx;
  EXPECT_THROW(class_grid_indices(torch::tensor({0, 3}, torch::kLong), 3, 1), std::invalid_argument);
  EXPECT_THROW(class_grid_indices(torch::tensor({-1}, torch::kLong), 3, 1), std::invalid_argument);
  EXPECT_THROW(class_grid_indices(torch::tensor({0.f}), 3, 1), std::invalid_argument);
  EXPECT_THROW(class_grid_indices(torch::zeros({2, 2}, torch::kLong), 3, 1), std::invalid_argument);
}

TEST(ClassGrid, WritesOneClassPerRow) {
  TempDir dir;
  const std::string path = dir / "classes.png";
  for (int64_t c : {1, 3}) {
    // 9 images with shuffled labels; 3 classes x 2 per class; class 1 has only one sample.
    at::Tensor imgs = exact_images(9, c, 4, 5, 3 + int(c));
    at::Tensor labels = torch::tensor({2, 0, 2, 0, 1, 2, 0, 0, 2}, torch::kLong);
    write_class_grid(path, imgs, labels, 3, 2);
    Png png = read_png(path);
    EXPECT_EQ(png.w, 2 * (5 + 2) + 2);
    EXPECT_EQ(png.h, 3 * (4 + 2) + 2);
    ASSERT_EQ(png.c, c);
    expect_cell(png, 2, 0, imgs[1]);  // row 0: class 0's first two
    expect_cell(png, 2, 1, imgs[3]);
    expect_cell(png, 2, 2, imgs[4]);  // row 1: class 1's only one
    expect_blank_cell(png, 2, 3, 4, 5);
    expect_cell(png, 2, 4, imgs[0]);  // row 2: class 2's first two
    expect_cell(png, 2, 5, imgs[2]);
    expect_black_border(png, 2, 3, 4, 5);
  }
  // Images generated from class_grid_labels are written in their own order.
  at::Tensor imgs = exact_images(6, 3, 4, 4, 9);
  write_class_grid(path, imgs, class_grid_labels(3, 2), 3, 2);
  Png a = read_png(path);
  write_png_grid(dir / "plain.png", imgs, 2);
  Png b = read_png(dir / "plain.png");
  EXPECT_EQ(a.px, b.px);
  EXPECT_THROW(write_class_grid(path, imgs, class_grid_labels(2, 2), 3, 2), std::invalid_argument);
  EXPECT_THROW(write_class_grid(path, torch::zeros({6, 2, 4, 4}), class_grid_labels(3, 2), 3, 2),
               std::invalid_argument);
}

TEST(ClassGrid, RealFashionMnistPerClass) {
  REQUIRE_FMNIST();
  TempDir dir;
  at::Tensor imgs = load_fashion_mnist(fmnist_dir(), at::kFloat, "t10k").narrow(0, 0, 500);
  at::Tensor labels = load_fashion_mnist_labels(fmnist_dir(), "t10k").narrow(0, 0, 500);
  at::Tensor idx = class_grid_indices(labels, 10, 4);
  ASSERT_GE(idx.min().item<int64_t>(), 0) << "500 test images hold 4 of every class";
  EXPECT_TRUE(torch::equal(labels.index_select(0, idx), class_grid_labels(10, 4)));
  const std::string path = dir / "fmnist-classes.png";
  write_class_grid(path, imgs, labels, 10, 4);
  Png png = read_png(path);
  EXPECT_EQ(png.w, 4 * 34 + 2);
  EXPECT_EQ(png.h, 10 * 34 + 2);
  EXPECT_EQ(png.c, 1);
}

}  // namespace SHARDGAN_UNITY_ID
