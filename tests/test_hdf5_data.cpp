// data.source hdf5: the reader (against load_fashion_mnist, bit for bit), the converters
// (idx files and an ImageFolder of PNGs with known pixels), every validation error (on
// every rank: each rank builds and opens its own files), the prefetcher (order, bound,
// exceptions, shutdown) and the loader's schedule. Every comparison is exact: the reader
// and load_fashion_mnist apply the same elementwise operations to the same bytes, and the
// converter copies bytes (or resizes a constant image, which stb reproduces exactly).
//
// Deliberate breaks tried (each made this test fail, then reverted):
//  - hdf5_dataset.cpp read_sorted_rows, an off-by-one in the run coalescing (rows with a gap
//    of one joined into a run: `u[j] <= u[j - 1] + 2`): ReadsRowsInTheRequestedOrder and
//    Hdf5Loader.FollowsTheSchedule fail (wrong rows; FashionMnistRoundTrip, all rows in one
//    run, does not notice).
//  - prefetcher.cpp loop, waiting for `queue_.size() < capacity_ + 1`: Prefetcher.
//    HoldsAtMostCapacity fails (4 produced for capacity 3, then 5).
#include <mpi.h>
#include <stb/stb_image_write.h>  // the implementation: Debian's libstb, or libshardgan with SHARDGAN_STB_DIR

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <thread>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "shardgan/h5/h5.h"
#include "shardgan/data/convert.h"
#include "shardgan/data/hdf5_dataset.h"
#include "shardgan/data/hdf5_loader.h"
#include "shardgan/data/prefetcher.h"
#include "shardgan/data/images.h"

// The gtest files compile together in batches (tests/CMakeLists.txt): this file's names
// live in a namespace of its own.
namespace SHARDGAN_UNITY_ID {

namespace fs = std::filesystem;
using namespace shardgan;
using data::Hdf5Dataset;

namespace {

// Fashion-MNIST's folder: $SHARDGAN_FMNIST_DIR (the CMake option of that name), else Debian's.
const std::string kFmnist = [] {
  const char* env = std::getenv("SHARDGAN_FMNIST_DIR");
  return std::string(env && *env ? env : "/usr/share/datasets/fashion-mnist");
}();

int rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world() {
  int w = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &w);
  return w;
}

// A folder of this process's own (every rank converts and reads its own files).
class TempDir {
 public:
  TempDir() {
    path_ = (fs::temp_directory_path() / ("shardgan-hdf5-" + std::to_string(::getpid()) + "-" +
                                          std::to_string(counter_++))).string();
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }
  const std::string& str() const { return path_; }

 private:
  static inline int counter_ = 0;
  std::string path_;
};

// The converted t10k split (10000 images), made once per process.
const std::string& t10k_h5() {
  static TempDir dir;
  static const std::string path = [] {
    const std::string p = dir / "t10k.h5";
    data::convert_fashion_mnist(kFmnist, "t10k", p);
    return p;
  }();
  return path;
}

// Expects `f` to throw DataError whose message contains every string of `parts`.
template <class F>
void expect_data_error(F f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no DataError thrown (rank " << rank() << ")";
  } catch (const DataError& e) {
    const std::string msg = e.what();
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  }
}

at::Tensor arange(std::initializer_list<int64_t> v) { return torch::tensor(std::vector<int64_t>(v), torch::kLong); }

}  // namespace

TEST(Hdf5Data, FashionMnistRoundTrip) {
  Hdf5Dataset ds(t10k_h5());
  ASSERT_EQ(ds.size(), 10000);
  EXPECT_EQ(ds.channels(), 1);
  EXPECT_EQ(ds.height(), 32);
  EXPECT_EQ(ds.width(), 32);
  EXPECT_EQ(ds.min_label(), 0);
  EXPECT_EQ(ds.max_label(), 9);
  EXPECT_EQ(ds.class_names(), data::kFashionMnistClassNames);
  const at::Tensor all = torch::arange(ds.size(), torch::kLong);
  for (auto dtype : {at::kFloat, at::kDouble}) {
    at::Tensor x, y;
    data::ReadStats st;
    ds.read(all, dtype, &x, &y, &st);
    EXPECT_EQ(st.runs, 1);  // every row: one run
    EXPECT_EQ(st.bytes_read, 10000 * 1024);
    EXPECT_TRUE(torch::equal(x, load_fashion_mnist(kFmnist, dtype, "t10k"))) << "dtype " << dtype;
    EXPECT_TRUE(torch::equal(y, load_fashion_mnist_labels(kFmnist, "t10k")));
  }
  // The padding is exactly -1 (0 bytes), the 28x28 centre the idx bytes.
  const at::Tensor raw = ds.read_raw(arange({0}));
  EXPECT_EQ(raw.slice(2, 0, 2).max().item<int>(), 0);
  EXPECT_EQ(raw.slice(3, 30, 32).max().item<int>(), 0);
}

TEST(Hdf5Data, ReadsRowsInTheRequestedOrder) {
  Hdf5Dataset ds(t10k_h5());
  const at::Tensor ref = load_fashion_mnist(kFmnist, at::kFloat, "t10k");
  const at::Tensor ref_y = load_fashion_mnist_labels(kFmnist, "t10k");
  // Sorted distinct rows {3, 5, 6, 7, 10, 11, 9999}: runs {3}, {5..7}, {10, 11}, {9999}.
  const at::Tensor idx = arange({10, 5, 3, 7, 6, 11, 5, 9999, 3});
  at::Tensor x, y;
  data::ReadStats st;
  ds.read(idx, at::kFloat, &x, &y, &st);
  EXPECT_EQ(st.runs, 4);
  EXPECT_EQ(st.rows_read, 7);  // repeats are read once
  EXPECT_TRUE(torch::equal(x, ref.index_select(0, idx)));
  EXPECT_TRUE(torch::equal(y, ref_y.index_select(0, idx)));
  // A random sample, as the sampler draws them.
  auto gen = at::detail::createCPUGenerator(7);
  const at::Tensor r = at::randperm(10000, gen, torch::TensorOptions().dtype(at::kLong)).narrow(0, 0, 257);
  ds.read(r, at::kFloat, &x, &y);
  EXPECT_TRUE(torch::equal(x, ref.index_select(0, r)));
  EXPECT_TRUE(torch::equal(y, ref_y.index_select(0, r)));
  EXPECT_THROW(ds.read(arange({10000}), at::kFloat, &x, nullptr), std::out_of_range);
  EXPECT_THROW(ds.read(arange({-1}), at::kFloat, &x, nullptr), std::out_of_range);
}

TEST(Hdf5Data, LayoutsReadAlike) {
  // Contiguous, chunks of 1 and of 100 images (not dividing N): the same values.
  TempDir d;
  const at::Tensor idx = arange({0, 99, 100, 101, 777, 9998, 9999, 42});
  at::Tensor want;
  Hdf5Dataset(t10k_h5()).read(idx, at::kFloat, &want, nullptr);
  for (int64_t chunk : {0, 1, 100}) {
    const std::string p = d / ("c" + std::to_string(chunk) + ".h5");
    data::convert_fashion_mnist(kFmnist, "t10k", p, chunk);
    at::Tensor x;
    Hdf5Dataset(p).read(idx, at::kFloat, &x, nullptr);
    EXPECT_TRUE(torch::equal(x, want)) << "chunk " << chunk;
  }
}

TEST(Hdf5Data, ImageFolderConversion) {
  TempDir d;
  const std::string root = d / "folder";
  fs::create_directories(root + "/b_cls");
  fs::create_directories(root + "/a_cls/sub");
  fs::create_directories(root + "/c_empty_is_not_here");
  fs::remove(root + "/c_empty_is_not_here");
  // a_cls/img1.png: 4x4 RGB, pixel (y, x) channel c = 16 * (4 y + x) + 5 c.
  std::vector<uint8_t> known(4 * 4 * 3);
  for (int y = 0; y < 4; ++y)
    for (int x = 0; x < 4; ++x)
      for (int c = 0; c < 3; ++c) known[(y * 4 + x) * 3 + c] = static_cast<uint8_t>(16 * (4 * y + x) + 5 * c);
  ASSERT_TRUE(stbi_write_png((root + "/a_cls/img1.png").c_str(), 4, 4, 3, known.data(), 4 * 3));
  // a_cls/sub/flat.PNG: 8x8 constant (200, 100, 50): resized to 4x4 it stays constant.
  std::vector<uint8_t> flat(8 * 8 * 3);
  for (int i = 0; i < 64; ++i) {
    flat[i * 3] = 200;
    flat[i * 3 + 1] = 100;
    flat[i * 3 + 2] = 50;
  }
  ASSERT_TRUE(stbi_write_png((root + "/a_cls/sub/flat.PNG").c_str(), 8, 8, 3, flat.data(), 8 * 3));
  // b_cls/wide.png: 6 wide, 4 high; the centre crop keeps columns 1..4 (offset round(2 / 2) = 1).
  std::vector<uint8_t> wide(6 * 4 * 3);
  for (int y = 0; y < 4; ++y)
    for (int x = 0; x < 6; ++x)
      for (int c = 0; c < 3; ++c) wide[(y * 6 + x) * 3 + c] = static_cast<uint8_t>(x == 0 || x == 5 ? 255 : 10 * x + y + c);
  ASSERT_TRUE(stbi_write_png((root + "/b_cls/wide.png").c_str(), 6, 4, 3, wide.data(), 6 * 3));
  std::ofstream(root + "/b_cls/notes.txt") << "not an image\n";

  const std::string out = d / "folder.h5";
  const data::ConvertResult r = data::convert_image_folder(root, out, 4, 3);
  EXPECT_EQ(r.images, 3);
  EXPECT_EQ(r.skipped_files, 1);
  EXPECT_EQ(r.classes, (std::vector<std::string>{"a_cls", "b_cls"}));
  EXPECT_FALSE(fs::exists(out + ".tmp"));
  Hdf5Dataset ds(out);
  EXPECT_EQ(ds.class_names(), r.classes);
  const at::Tensor raw = ds.read_raw(arange({0, 1, 2}));  // [3, 3, 4, 4]
  at::Tensor x, y;
  ds.read(arange({0, 1, 2}), at::kFloat, &x, &y);
  // torchvision's order: class a (img1.png in a_cls/, then sub/flat.PNG), then class b.
  EXPECT_TRUE(torch::equal(y, arange({0, 0, 1})));
  auto px = [&](int64_t i, int64_t c, int64_t yy, int64_t xx) { return raw[i][c][yy][xx].item<int>(); };
  for (int yy = 0; yy < 4; ++yy) {
    for (int xx = 0; xx < 4; ++xx) {
      for (int c = 0; c < 3; ++c) {
        EXPECT_EQ(px(0, c, yy, xx), known[(yy * 4 + xx) * 3 + c]) << "img1 " << c << "," << yy << "," << xx;
        EXPECT_EQ(px(1, c, yy, xx), flat[c]) << "flat resized " << c << "," << yy << "," << xx;
        EXPECT_EQ(px(2, c, yy, xx), wide[(yy * 6 + xx + 1) * 3 + c]) << "wide cropped " << c << "," << yy << "," << xx;
      }
    }
  }
  EXPECT_TRUE(torch::equal(x, raw.to(at::kFloat).div_(127.5).sub_(1.0)));

  // Grey: stb's luma (77 r + 150 g + 29 b) >> 8.
  const std::string grey = d / "grey.h5";
  data::convert_image_folder(root, grey, 4, 1);
  const at::Tensor g = Hdf5Dataset(grey).read_raw(arange({0}));
  ASSERT_EQ(g.size(1), 1);
  for (int i = 0; i < 16; ++i) {
    const int want = (77 * known[i * 3] + 150 * known[i * 3 + 1] + 29 * known[i * 3 + 2]) >> 8;
    EXPECT_EQ(g[0][0][i / 4][i % 4].item<int>(), want) << i;
  }

  // Errors: an undecodable image, an empty class, no class folders.
  std::ofstream(root + "/b_cls/broken.png") << "this is not a PNG";
  expect_data_error([&] { data::convert_image_folder(root, d / "bad.h5", 4, 3); },
                    {root + "/b_cls/broken.png", "cannot decode"});
  EXPECT_FALSE(fs::exists(d / "bad.h5"));
  EXPECT_FALSE(fs::exists(d / "bad.h5.tmp"));  // the writer removed its temporary file
  fs::remove(root + "/b_cls/broken.png");
  fs::create_directories(root + "/c_empty");
  expect_data_error([&] { data::convert_image_folder(root, d / "bad.h5", 4, 3); }, {"c_empty", "holds no image"});
  fs::create_directories(d / "none");
  expect_data_error([&] { data::convert_image_folder(d / "none", d / "bad.h5", 4, 3); }, {"no class folders"});
  EXPECT_THROW(data::convert_image_folder(root, d / "bad.h5", 4, 2), std::invalid_argument);
}

TEST(Hdf5Data, ErrorsNameTheFileAndDatasetOnEveryRank) {
  TempDir d;
  const std::vector<uint8_t> px(2 * 16, 7);
  const std::vector<int64_t> lab{0, 1};
  auto make = [&](const std::string& name, auto&& fill) {
    const std::string p = d / name;
    h5::File f = h5::File::create(p);
    fill(f);
    f.close();
    return p;
  };
  expect_data_error([&] { Hdf5Dataset(d / "missing.h5"); }, {d / "missing.h5", "no such file"});
  const std::string text = d / "text.h5";
  std::ofstream(text) << "hello";
  expect_data_error([&] { Hdf5Dataset{text}; }, {text, "not an HDF5 file"});
  const std::string wrong_name = make("wrong_name.h5", [&](h5::File& f) {
    f.write("images", h5::DType::kU8, {2, 1, 4, 4}, px.data());
    f.write("labels", h5::DType::kI64, {2}, lab.data());
  });
  expect_data_error([&] { Hdf5Dataset{wrong_name}; }, {wrong_name, "no dataset 'imgs'", "'images'"});
  const std::string no_labels = make("no_labels.h5", [&](h5::File& f) {
    f.write("imgs", h5::DType::kU8, {2, 1, 4, 4}, px.data());
  });
  expect_data_error([&] { Hdf5Dataset{no_labels}; }, {no_labels, "no dataset 'labels'"});
  const std::string f32 = make("f32.h5", [&](h5::File& f) {
    const std::vector<float> v(32, 0.5f);
    f.write("imgs", h5::DType::kF32, {2, 1, 4, 4}, v.data());
    f.write("labels", h5::DType::kI64, {2}, lab.data());
  });
  expect_data_error([&] { Hdf5Dataset{f32}; }, {f32, "dataset 'imgs' has dtype float32, expected uint8"});
  const std::string u8_labels = make("u8_labels.h5", [&](h5::File& f) {
    const std::vector<uint8_t> l{0, 1};
    f.write("imgs", h5::DType::kU8, {2, 1, 4, 4}, px.data());
    f.write("labels", h5::DType::kU8, {2}, l.data());
  });
  expect_data_error([&] { Hdf5Dataset{u8_labels}; }, {u8_labels, "dataset 'labels' has dtype uint8, expected int64"});
  const std::string rank3 = make("rank3.h5", [&](h5::File& f) {
    f.write("imgs", h5::DType::kU8, {2, 4, 4}, px.data());
    f.write("labels", h5::DType::kI64, {2}, lab.data());
  });
  expect_data_error([&] { Hdf5Dataset{rank3}; }, {rank3, "dataset 'imgs' has rank 3", "[2, 4, 4]", "expected rank 4"});
  const std::string labels2d = make("labels2d.h5", [&](h5::File& f) {
    f.write("imgs", h5::DType::kU8, {2, 1, 4, 4}, px.data());
    f.write("labels", h5::DType::kI64, {2, 1}, lab.data());
  });
  expect_data_error([&] { Hdf5Dataset{labels2d}; }, {labels2d, "dataset 'labels' has rank 2"});
  const std::string count = make("count.h5", [&](h5::File& f) {
    f.write("imgs", h5::DType::kU8, {2, 1, 4, 4}, px.data());
    f.write("labels", h5::DType::kI64, {1}, lab.data());
  });
  expect_data_error([&] { Hdf5Dataset{count}; }, {count, "dataset 'labels' holds 1 labels but 'imgs' holds 2"});
  const std::string negative = make("negative.h5", [&](h5::File& f) {
    const std::vector<int64_t> l{0, -3};
    f.write("imgs", h5::DType::kU8, {2, 1, 4, 4}, px.data());
    f.write("labels", h5::DType::kI64, {2}, l.data());
  });
  expect_data_error([&] { Hdf5Dataset{negative}; }, {negative, "dataset 'labels': label 1 is -3"});
  const std::string big = make("big_label.h5", [&](h5::File& f) {
    const std::vector<int64_t> l{0, 12};
    f.write("imgs", h5::DType::kU8, {2, 1, 4, 4}, px.data());
    f.write("labels", h5::DType::kI64, {2}, l.data());
  });
  Hdf5Dataset ok(big);  // labels are checked against the model's classes, not at open
  EXPECT_NO_THROW(ok.check_labels(13));
  expect_data_error([&] { ok.check_labels(10); }, {big, "dataset 'labels' has labels up to 12, outside [0, 10)"});
}

TEST(Prefetcher, DeliversInOrder) {
  data::Prefetcher p([](int64_t s) { return std::vector<at::Tensor>{torch::full({1}, s, torch::kLong)}; }, 5, 3);
  for (int64_t s = 5; s < 40; ++s) {
    auto item = p.next();
    EXPECT_EQ(item.seq, s);
    EXPECT_EQ(item.tensors.at(0).item<int64_t>(), s);
  }
}

TEST(Prefetcher, HoldsAtMostCapacity) {
  std::atomic<int64_t> produced{0};
  data::Prefetcher p([&](int64_t s) { ++produced; return std::vector<at::Tensor>{}; }, 0, 3);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(produced.load(), 3);  // filled the queue, then waits
  p.next();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(produced.load(), 4);
}

TEST(Prefetcher, RethrowsOnTheConsumer) {
  data::Prefetcher p([](int64_t s) -> std::vector<at::Tensor> {
    if (s == 3) throw DataError("disk went away at 3");
    return {torch::full({1}, s, torch::kLong)};
  }, 0, 8);
  for (int64_t s = 0; s < 3; ++s) EXPECT_EQ(p.next().seq, s);  // the items before the failure
  for (int k = 0; k < 2; ++k) {
    try {
      p.next();
      ADD_FAILURE() << "no exception";
    } catch (const DataError& e) {
      EXPECT_STREQ(e.what(), "disk went away at 3");
    }
  }
}

TEST(Prefetcher, ShutsDownCleanly) {
  const auto t0 = std::chrono::steady_clock::now();
  {  // blocked on a full queue
    data::Prefetcher p([](int64_t) { return std::vector<at::Tensor>{}; }, 0, 2);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  {  // in the middle of a slow item
    data::Prefetcher p([](int64_t) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      return std::vector<at::Tensor>{};
    }, 0, 2);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  {  // after an exception nobody took
    data::Prefetcher p([](int64_t) -> std::vector<at::Tensor> { throw std::runtime_error("x"); }, 0, 2);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 5.0);  // joins within the item in progress (0.2 s), not stuck
  EXPECT_THROW(data::Prefetcher([](int64_t) { return std::vector<at::Tensor>{}; }, 0, 0), std::invalid_argument);
}

TEST(Hdf5Loader, FollowsTheSchedule) {
  // This rank's part of 2 micro-batches per global batch of 48, over an epoch boundary
  // (10000 / 48 = 208 batches), equal to the in-RAM path's index_select.
  Hdf5Dataset ds(t10k_h5());
  const int64_t k = 2, global = 48 * world();
  DistributedSampler sampler(ds.size(), global, rank(), world(), 99, k);
  const at::Tensor ref = load_fashion_mnist(kFmnist, at::kFloat, "t10k");
  const at::Tensor ref_y = load_fashion_mnist_labels(kFmnist, "t10k");
  data::Hdf5Loader loader(ds, sampler, k, at::kFloat, 4, true);
  auto expect_batch = [&](int64_t e, int64_t b, int64_t m) {
    const auto t = loader.get(e, b, m);
    const at::Tensor idx = sampler.indices(e, b, m);
    EXPECT_TRUE(torch::equal(t.at(0), ref.index_select(0, idx))) << e << "/" << b << "/" << m;
    EXPECT_TRUE(torch::equal(t.at(1), ref_y.index_select(0, idx))) << e << "/" << b << "/" << m;
  };
  const int64_t bpe = sampler.batches_per_epoch();
  ASSERT_EQ(bpe, 10000 / global);
  for (int64_t b = bpe - 3; b < bpe; ++b) {  // jumps ahead once, then in order
    for (int64_t m = 0; m < k; ++m) expect_batch(0, b, m);
  }
  EXPECT_EQ(loader.restarts(), 1);
  for (int64_t b = 0; b < 3; ++b) {
    for (int64_t m = 0; m < k; ++m) expect_batch(1, b, m);  // the next epoch: a new permutation
  }
  expect_batch(1, 2, 1);  // asked again: read synchronously, still right
  expect_batch(1, 2, 0);
  EXPECT_EQ(loader.sync_reads(), 2);
  expect_batch(1, 3, 0);  // and the queue goes on
  expect_batch(1, 3, 1);
  EXPECT_EQ(loader.restarts(), 1);
  loader.restart(0, 7);  // as after a resume
  expect_batch(0, 7, 0);
  expect_batch(0, 7, 1);
  expect_batch(0, 8, 0);
  EXPECT_EQ(loader.restarts(), 2);
  EXPECT_EQ(loader.sync_reads(), 2);
}

TEST(Hdf5Loader, UnconditionalHasNoLabels) {
  Hdf5Dataset ds(t10k_h5());
  DistributedSampler sampler(ds.size(), 16 * world(), rank(), world(), 5, 1);
  data::Hdf5Loader loader(ds, sampler, 1, at::kDouble, 1, false);
  const auto t = loader.get(0, 0, 0);
  EXPECT_EQ(t.at(0).scalar_type(), at::kDouble);
  EXPECT_EQ(t.at(0).sizes(), (std::vector<int64_t>{16, 1, 32, 32}));
  EXPECT_FALSE(t.at(1).defined());
}

}  // namespace SHARDGAN_UNITY_ID
