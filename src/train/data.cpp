#include "shardgan/train/data.h"

#include <zlib.h>

#include <filesystem>
#include <memory>
#include <vector>

#include <torch/torch.h>

namespace shardgan {
namespace {

uint32_t read_be32(gzFile f, const std::string& path) {
  unsigned char b[4];
  if (gzread(f, b, 4) != 4) throw DataError(path + ": truncated idx header");
  return (uint32_t(b[0]) << 24) | (uint32_t(b[1]) << 16) | (uint32_t(b[2]) << 8) | b[3];
}

}  // namespace

at::Tensor load_fashion_mnist(const std::string& dir, at::ScalarType dtype) {
  const std::string path = dir + "/train-images-idx3-ubyte.gz";
  if (!std::filesystem::exists(path)) {
    throw DataError("Fashion-MNIST not found: '" + path +
                    "' does not exist. Install Debian's dataset-fashion-mnist (scripts/setup.sh "
                    "does) or set data.path to the folder that holds the idx .gz files");
  }
  std::unique_ptr<gzFile_s, int (*)(gzFile)> f(gzopen(path.c_str(), "rb"), gzclose);
  if (!f) throw DataError("cannot open '" + path + "'");
  const uint32_t magic = read_be32(f.get(), path);
  if (magic != 2051) {
    throw DataError(path + ": not an idx3 image file (magic " + std::to_string(magic) + ")");
  }
  const int64_t n = read_be32(f.get(), path), h = read_be32(f.get(), path),
                w = read_be32(f.get(), path);
  if (h != 28 || w != 28) throw DataError(path + ": expected 28x28 images");
  at::Tensor raw = torch::empty({n, 1, h, w}, torch::kUInt8);
  const int64_t bytes = raw.numel();
  int64_t got = 0;
  while (got < bytes) {
    int r = gzread(f.get(), raw.data_ptr<uint8_t>() + got,
                   static_cast<unsigned>(std::min<int64_t>(bytes - got, 1 << 30)));
    if (r <= 0) throw DataError(path + ": truncated after " + std::to_string(got) + " bytes");
    got += r;
  }
  at::Tensor img = raw.to(dtype).div_(127.5).sub_(1.0);
  return torch::constant_pad_nd(img, {2, 2, 2, 2}, -1.0).contiguous();
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
  auto gen = at::detail::createCPUGenerator(seed_ + 1000003ULL * static_cast<uint64_t>(epoch));
  at::Tensor perm = at::randperm(dataset_size_, gen, torch::TensorOptions().dtype(at::kLong));
  const int64_t local = local_batch();
  const int64_t start = batch * global_batch_ + micro * (global_batch_ / micro_batches_) + rank_ * local;
  return perm.narrow(0, start, local).clone();
}

}  // namespace shardgan
