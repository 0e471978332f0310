#pragma once
#include <string>

#include <ATen/core/Tensor.h>

namespace shardgan {

/// Writes images [N, 1, H, W] (any float dtype, values in [-1, 1], CPU) as one greyscale
/// PNG grid of `nrow` columns with a 2-pixel border. Throws std::runtime_error naming
/// `path` if it cannot be written.
void write_png_grid(const std::string& path, const at::Tensor& images, int nrow);

}  // namespace shardgan
