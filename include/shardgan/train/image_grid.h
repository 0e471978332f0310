#pragma once
/// PNG grids of images (greyscale or RGB), and class-per-row grids for conditional models.
#include <cstdint>
#include <string>

#include <ATen/core/Tensor.h>

namespace shardgan {

/// Writes images [N, C, H, W], C = 1 (greyscale PNG) or C = 3 (RGB PNG, channels in R, G, B
/// order), as one PNG grid of `nrow` columns and ceil(N / nrow) rows with a 2-pixel black
/// border around and between the cells: the PNG is nrow*(W+2)+2 wide and rows*(H+2)+2 high,
/// and image i sits in row i / nrow, column i % nrow. `images` may be any dtype on any device
/// and need not be contiguous; values in [-1, 1] map to pixels round((v + 1) * 127.5), values
/// outside are clamped. The last row's unused cells stay black.
/// Throws std::invalid_argument naming the shape unless images is 4-D with N >= 1 and
/// C in {1, 3}, or naming nrow unless nrow >= 1; std::runtime_error naming `path` if the
/// file cannot be written.
void write_png_grid(const std::string& path, const at::Tensor& images, int nrow);

/// Labels int64 [num_classes * per_class] = [0 x per_class, 1 x per_class, ...,
/// num_classes-1 x per_class]: feed them to a class-conditional G together with
/// num_classes * per_class latents, and write_png_grid(path, G(z, labels), per_class) (or
/// write_class_grid) shows class k in row k. Throws std::invalid_argument unless both are >= 1.
at::Tensor class_grid_labels(int64_t num_classes, int64_t per_class);

/// Where each cell of a class grid comes from: int64 [num_classes * per_class], entry
/// k * per_class + j the index (into `labels`) of the j-th sample of class k in `labels`'
/// order, or -1 where class k has fewer than j + 1 samples. `labels` is an integer tensor [M].
/// Throws std::invalid_argument if labels is not 1-D integer, holds a value outside
/// [0, num_classes), or num_classes or per_class is < 1.
at::Tensor class_grid_indices(const at::Tensor& labels, int64_t num_classes, int64_t per_class);

/// Writes a grid with one class per row: row k holds the first `per_class` images (in the
/// order of `images`) whose label is k, so the PNG has per_class columns and num_classes
/// rows, laid out as write_png_grid(path, ordered, per_class) would with `ordered`
/// [num_classes * per_class, C, H, W] class-major. A class with fewer than per_class samples
/// leaves its remaining cells black. `images` is [M, C, H, W] with C in {1, 3}, values in
/// [-1, 1]; `labels` an integer tensor [M] with values in [0, num_classes). With images
/// generated from class_grid_labels(num_classes, per_class) the images are already in grid
/// order and are written as they are.
/// Throws std::invalid_argument (naming the shapes) if images and labels disagree in M, as
/// class_grid_indices and write_png_grid do; std::runtime_error naming `path` if the file
/// cannot be written.
void write_class_grid(const std::string& path, const at::Tensor& images, const at::Tensor& labels,
                      int64_t num_classes, int64_t per_class);

}  // namespace shardgan
