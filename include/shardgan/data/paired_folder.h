#pragma once
/// pix2pix's folder layout in RAM (data.source: paired): every image file directly in a
/// folder holds an input image A (left half) and its target B (right half), as facades,
/// edges2shoes and maps ship (Isola et al. 2017; junyanz/pytorch-CycleGAN-and-pix2pix's
/// aligned dataset, direction AtoB). `shardgan-data convert --paired` writes the same pairs
/// to HDF5 (convert.h), the way to go for sets that do not fit in RAM.
#include <cstdint>
#include <string>

#include <ATen/core/Tensor.h>

namespace shardgan::data {

struct PairedImages {
  at::Tensor a, b;            ///< uint8 [n, channels, size, size] each, row i from file i
  int64_t skipped_files = 0;  ///< files without an image extension
};

/// Local. The first `limit` image files of `dir` (all with limit < 0), sorted by name
/// (.png, .jpg, .jpeg, .bmp, .pgm, .ppm, .tga), each decoded into `channels` (1 grey, 3 RGB)
/// with stb_image, split into its left (A) and right (B) halves, and each half resized to
/// size x size with stb_image_resize (copied when already that size). Throws DataError
/// naming the folder or file when there is no image, a file cannot be decoded or has an odd
/// width; std::invalid_argument for size outside [1, 4096] or another channel count.
PairedImages read_paired_folder(const std::string& dir, int64_t size, int64_t channels, int64_t limit = -1);

}  // namespace shardgan::data
