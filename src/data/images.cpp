#include "shardgan/data/images.h"

#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "shardgan/util/test_control.h"

namespace shardgan {
namespace {

// Counts above this are a corrupt header rather than a dataset (Fashion-MNIST holds 70000).
constexpr int64_t kMaxItems = int64_t{1} << 24;

void check_split(const std::string& split) {
  if (split != "train" && split != "t10k") {
    throw std::invalid_argument("Fashion-MNIST split '" + split +
                                "' does not exist: use \"train\" (60000 images) or \"t10k\" (10000)");
  }
}

// A gzip-compressed idx file read with zlib; every error names the file.
class IdxReader {
 public:
  explicit IdxReader(std::string path) : path_(std::move(path)), f_(nullptr, gzclose) {
    if (!std::filesystem::exists(path_)) {
      throw DataError("Fashion-MNIST not found: '" + path_ +
                      "' does not exist. Install Debian's dataset-fashion-mnist (scripts/setup.sh "
                      "does) or set data.path to the folder that holds the idx .gz files");
    }
    f_.reset(gzopen(path_.c_str(), "rb"));
    if (!f_) throw DataError("cannot open '" + path_ + "': check that it is readable");
  }

  const std::string& path() const { return path_; }

  // Reads exactly `bytes` bytes into `dst`; `what` names them in the error.
  void read_exact(uint8_t* dst, int64_t bytes, const std::string& what) {
    int64_t got = 0;
    while (got < bytes) {
      const int r = gzread(f_.get(), dst + got,
                           static_cast<unsigned>(std::min<int64_t>(bytes - got, 1 << 30)));
      if (r < 0) throw DataError(path_ + ": corrupt gzip data (" + zlib_error() + ") while reading " + what);
      if (r == 0) {
        throw DataError(path_ + ": truncated: " + what + " needs " + std::to_string(bytes) +
                        " bytes but the file ends after " + std::to_string(got));
      }
      got += r;
    }
  }

  // Reads the magic number and throws DataError naming the file unless it is `want`.
  void expect_magic(uint32_t want, const std::string& kind) {
    const uint32_t magic = read_be32("magic");
    if (magic != want) {
      throw DataError(path_ + ": not an " + kind + " file (magic " + std::to_string(magic) +
                      ", expected " + std::to_string(want) + ")");
    }
  }

  uint32_t read_be32(const std::string& what) {
    unsigned char b[4];
    read_exact(b, 4, "the idx header (" + what + ")");
    return (uint32_t(b[0]) << 24) | (uint32_t(b[1]) << 16) | (uint32_t(b[2]) << 8) | b[3];
  }

  // Checks that nothing follows the data, and that the gzip trailer (CRC, length) is valid.
  void expect_end(const std::string& header_says) {
    unsigned char extra[64];
    const int r = gzread(f_.get(), extra, sizeof(extra));
    if (r < 0) throw DataError(path_ + ": corrupt gzip data (" + zlib_error() + ") at the end of the file");
    if (r > 0) {
      throw DataError(path_ + ": more data than its header says (" + header_says +
                      "): the count in the header is wrong or the file is corrupt");
    }
  }

 private:
  std::string zlib_error() {
    int errnum = 0;
    const char* msg = gzerror(f_.get(), &errnum);
    return msg && *msg ? msg : "zlib error " + std::to_string(errnum);
  }

  std::string path_;
  std::unique_ptr<gzFile_s, int (*)(gzFile)> f_;
};

}  // namespace

at::Tensor load_fashion_mnist(const std::string& dir, at::ScalarType dtype, const std::string& split) {
  check_split(split);
  IdxReader f(dir + "/" + split + "-images-idx3-ubyte.gz");
  const std::string& path = f.path();
  f.expect_magic(2051, "idx3 image");
  const int64_t n = f.read_be32("count"), h = f.read_be32("rows"), w = f.read_be32("columns");
  if (n < 1 || n > kMaxItems) {
    throw DataError(path + ": implausible image count " + std::to_string(n) + " in the header");
  }
  if (h != 28 || w != 28) {
    throw DataError(path + ": expected 28x28 images, the header says " + std::to_string(h) + "x" +
                    std::to_string(w));
  }
  at::Tensor raw = torch::empty({n, 1, h, w}, torch::kUInt8);
  f.read_exact(raw.data_ptr<uint8_t>(), raw.numel(), std::to_string(n) + " images");
  f.expect_end(std::to_string(n) + " images");
  if (test_control("fmnist_decode_whole")) {  // test-only: the whole-split float copy it replaced
    at::Tensor whole = raw.to(dtype).div_(127.5).sub_(1.0);
    return torch::constant_pad_nd(whole, {2, 2, 2, 2}, -1.0).contiguous();
  }
  // Scaled to [-1, 1] and padded to 32x32 with -1 straight into the result, a chunk of images
  // at a time: the transient beyond the result is the uint8 file and one chunk
  // (fashion_mnist_decode_bytes), not a second float copy of the whole split.
  at::Tensor img = torch::full({n, 1, h + 4, w + 4}, -1.0, torch::TensorOptions().dtype(dtype));
  for (int64_t i = 0; i < n; i += kFashionMnistDecodeChunk) {
    const int64_t m = std::min(kFashionMnistDecodeChunk, n - i);
    img.narrow(0, i, m).narrow(2, 2, h).narrow(3, 2, w).copy_(raw.narrow(0, i, m).to(dtype).div_(127.5).sub_(1.0));
  }
  return img;
}

at::Tensor load_fashion_mnist_labels(const std::string& dir, const std::string& split) {
  check_split(split);
  IdxReader f(dir + "/" + split + "-labels-idx1-ubyte.gz");
  const std::string& path = f.path();
  f.expect_magic(2049, "idx1 label");
  const int64_t n = f.read_be32("count");
  if (n < 1 || n > kMaxItems) {
    throw DataError(path + ": implausible label count " + std::to_string(n) + " in the header");
  }
  at::Tensor raw = torch::empty({n}, torch::kUInt8);
  f.read_exact(raw.data_ptr<uint8_t>(), n, std::to_string(n) + " labels");
  f.expect_end(std::to_string(n) + " labels");
  const uint8_t* p = raw.data_ptr<uint8_t>();
  for (int64_t i = 0; i < n; ++i) {
    if (p[i] >= kFashionMnistClasses) {
      throw DataError(path + ": label " + std::to_string(i) + " is " + std::to_string(p[i]) +
                      ", outside [0, " + std::to_string(kFashionMnistClasses) + ")");
    }
  }
  return raw.to(torch::kLong);
}

at::Tensor make_synthetic_labels(int64_t n, uint64_t seed, int64_t num_classes) {
  if (n < 0 || num_classes < 1) {
    throw std::invalid_argument("make_synthetic_labels: need n >= 0 and num_classes >= 1, got n=" +
                                std::to_string(n) + ", num_classes=" + std::to_string(num_classes));
  }
  auto gen = at::detail::createCPUGenerator(seed);
  return at::randint(num_classes, {n}, gen, torch::TensorOptions().dtype(at::kLong));
}

at::Tensor make_synthetic_images(int64_t n, uint64_t seed, at::ScalarType dtype) {
  auto gen = at::detail::createCPUGenerator(seed);
  at::Tensor coarse = at::randn({n, 1, 4, 4}, gen, torch::TensorOptions().dtype(at::kDouble));
  namespace F = torch::nn::functional;
  at::Tensor img = F::interpolate(
      coarse, F::InterpolateFuncOptions().size(std::vector<int64_t>{32, 32}).mode(torch::kBilinear).align_corners(false));
  return img.tanh().to(dtype).contiguous();
}

DistributedSampler::DistributedSampler(int64_t dataset_size, int64_t global_batch, int rank,
                                       int world_size, uint64_t seed, int64_t micro_batches)
    : dataset_size_(dataset_size), global_batch_(global_batch), micro_batches_(micro_batches),
      rank_(rank), world_size_(world_size), seed_(seed) {
  if (micro_batches < 1 || global_batch % (micro_batches * world_size) != 0) {
    throw std::invalid_argument("train.global_batch " + std::to_string(global_batch) +
                                " must divide evenly by train.micro_batches (" +
                                std::to_string(micro_batches) + ") x the world size (" +
                                std::to_string(world_size) + ")");
  }
  if (dataset_size < global_batch) {
    throw std::invalid_argument("the dataset (" + std::to_string(dataset_size) +
                                " images) is smaller than train.global_batch " +
                                std::to_string(global_batch));
  }
}

at::Tensor DistributedSampler::indices(int64_t epoch, int64_t batch, int64_t micro) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (epoch != cached_epoch_) {
    auto gen = at::detail::createCPUGenerator(seed_ + 1000003ULL * static_cast<uint64_t>(epoch));
    cached_perm_ = at::randperm(dataset_size_, gen, torch::TensorOptions().dtype(at::kLong));
    cached_epoch_ = epoch;
  }
  const int64_t local = local_batch();
  const int64_t start = batch * global_batch_ + micro * (global_batch_ / micro_batches_) + rank_ * local;
  return cached_perm_.narrow(0, start, local).clone();
}

}  // namespace shardgan
