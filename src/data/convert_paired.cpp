// The pix2pix folder layout (A|B side by side in one image file): in RAM, and as a file of pairs.
#include <algorithm>
#include <filesystem>
#include <stdexcept>
#include <vector>

#include <torch/torch.h>

#include "data/image_files.h"
#include "shardgan/data/convert.h"
#include "shardgan/data/images.h"
#include "shardgan/data/paired_folder.h"

namespace fs = std::filesystem;

namespace shardgan::data {
namespace {

// The image files directly in `dir`, sorted by name; counts the others in `skipped`.
std::vector<std::string> pair_files(const std::string& dir, int64_t size, int64_t channels, int64_t* skipped) {
  if (size < 1 || size > 4096) throw std::invalid_argument("--size must be 1 to 4096, got " + std::to_string(size));
  if (channels != 1 && channels != 3) {
    throw std::invalid_argument("--channels must be 1 (grey) or 3 (RGB), got " + std::to_string(channels));
  }
  if (!fs::is_directory(dir)) throw DataError(dir + ": no such folder");
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    if (is_image_file(e.path())) {
      files.push_back(e.path().string());
    } else {
      ++*skipped;
    }
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) {
    throw DataError(dir + ": no image files: the pix2pix layout holds one image per pair, A and B side by side (" +
                    dir + "/1.jpg, ...)");
  }
  return files;
}

// Decodes one A|B file into [channels, size, size] at `a` and at `b`.
void decode_pair(const std::string& file, int64_t size, int64_t channels, uint8_t* a, uint8_t* b) {
  const DecodedImage d = decode_image(file, channels);
  if (d.width % 2 != 0) {
    throw DataError(file + ": width " + std::to_string(d.width) +
                    " is odd; a pair holds A (left half) and B (right half) of equal widths");
  }
  const int64_t half = d.width / 2, stride = d.width * channels;
  resize_to_chw(d.pixels.get(), half, d.height, stride, channels, size, a, file);
  resize_to_chw(d.pixels.get() + half * channels, half, d.height, stride, channels, size, b, file);
}

}  // namespace

PairedImages read_paired_folder(const std::string& dir, int64_t size, int64_t channels, int64_t limit) {
  PairedImages r;
  std::vector<std::string> files = pair_files(dir, size, channels, &r.skipped_files);
  if (limit >= 0 && static_cast<int64_t>(files.size()) > limit) files.resize(static_cast<size_t>(limit));
  const auto n = static_cast<int64_t>(files.size());
  r.a = torch::empty({n, channels, size, size}, torch::kUInt8);
  r.b = torch::empty({n, channels, size, size}, torch::kUInt8);
  const int64_t row = channels * size * size;
  for (int64_t i = 0; i < n; ++i) {
    decode_pair(files[static_cast<size_t>(i)], size, channels, r.a.data_ptr<uint8_t>() + i * row,
                r.b.data_ptr<uint8_t>() + i * row);
  }
  return r;
}

ConvertResult convert_paired_folder(const std::string& dir, const std::string& out, int64_t size, int64_t channels,
                                    int64_t chunk_images) {
  ConvertResult r;
  const std::vector<std::string> files = pair_files(dir, size, channels, &r.skipped_files);
  r.images = static_cast<int64_t>(files.size());
  r.channels = channels;
  r.height = r.width = size;
  Hdf5Writer w(out, r.images, channels, size, size, chunk_images, channels);
  const int64_t row = channels * size * size, batch = 256;  // streamed: 256 pairs in RAM at a time
  std::vector<uint8_t> b(static_cast<size_t>(batch * row)), a(static_cast<size_t>(batch * row));
  const std::vector<int64_t> labels(static_cast<size_t>(batch), 0);
  for (int64_t s = 0; s < r.images; s += batch) {
    const int64_t k = std::min(batch, r.images - s);
    for (int64_t i = 0; i < k; ++i) {
      decode_pair(files[static_cast<size_t>(s + i)], size, channels, a.data() + i * row, b.data() + i * row);
    }
    w.append(b.data(), labels.data(), k, a.data());
  }
  w.commit();
  return r;
}

}  // namespace shardgan::data
