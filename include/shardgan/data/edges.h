#pragma once
/// Edge maps, the input images A of the edges -> image task (pix2pix's edges2shoes recipe,
/// Isola et al. 2017, Sec. 4, on an image set these machines hold): each training image B
/// is paired with the edges of itself.
#include <cstdint>

#include <ATen/core/Tensor.h>

namespace shardgan::data {

/// The gradient magnitude above which a pixel is an edge, on images scaled to [0, 1].
inline constexpr double kEdgeThreshold = 0.5;

/// Local. Binary Sobel edges of `images` [N, C, H, W] (any floating dtype, values in
/// [-1, 1], CPU): the channels' mean is scaled to [0, 1], convolved with the two 3x3 Sobel
/// kernels (zero padding, i.e. black beyond the border), and a pixel whose gradient
/// magnitude sqrt(gx^2 + gy^2) exceeds kEdgeThreshold becomes 1, every other -1. Returns
/// [N, channels, H, W] in images' dtype (the edge map repeated over `channels`), computed in
/// float32 in chunks of 4096 images, so the same image gives the same map in any batch.
/// Throws std::invalid_argument for a tensor that is not 4-D or floating, or channels < 1.
at::Tensor sobel_edges(const at::Tensor& images, int64_t channels = 1);

}  // namespace shardgan::data
