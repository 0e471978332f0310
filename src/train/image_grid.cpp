#include "shardgan/train/image_grid.h"

#include <algorithm>
#include <stdexcept>
#include <vector>

#include <stb/stb_image_write.h>
#include <torch/torch.h>

namespace shardgan {
namespace {

std::string shape_str(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t d = 0; d < t.dim(); ++d) s += (d ? ", " : "") + std::to_string(t.size(d));
  return s + "]";
}

}  // namespace

void write_png_grid(const std::string& path, const at::Tensor& images, int nrow) {
  if (!images.defined() || images.dim() != 4 || images.size(0) < 1 ||
      (images.size(1) != 1 && images.size(1) != 3)) {
    throw std::invalid_argument(
        "write_png_grid: expected images [N, C, H, W] with N >= 1 and C = 1 (greyscale) or 3 (RGB), got " +
        (images.defined() ? shape_str(images) : std::string("an undefined tensor")));
  }
  if (nrow < 1) throw std::invalid_argument("write_png_grid: nrow must be >= 1, got " + std::to_string(nrow));
  const int n = static_cast<int>(images.size(0)), c = static_cast<int>(images.size(1)),
            h = static_cast<int>(images.size(2)), w = static_cast<int>(images.size(3)), pad = 2;
  const int rows = (n + nrow - 1) / nrow;
  const int gw = nrow * (w + pad) + pad, gh = rows * (h + pad) + pad;
  // [N, H, W, C] bytes: stb wants interleaved channels.
  at::Tensor px = ((images.detach().to(at::kCPU, at::kFloat).clamp(-1, 1) + 1) * 127.5)
                      .round()
                      .to(at::kByte)
                      .permute({0, 2, 3, 1})
                      .contiguous();
  std::vector<uint8_t> grid(static_cast<size_t>(gw) * gh * c, 0);
  const uint8_t* src = px.data_ptr<uint8_t>();
  const size_t row_bytes = static_cast<size_t>(w) * c;
  for (int i = 0; i < n; ++i) {
    const int oy = pad + (i / nrow) * (h + pad), ox = pad + (i % nrow) * (w + pad);
    for (int y = 0; y < h; ++y) {
      std::copy_n(src + (static_cast<size_t>(i) * h + y) * row_bytes, row_bytes,
                  grid.data() + (static_cast<size_t>(oy + y) * gw + ox) * c);
    }
  }
  if (!stbi_write_png(path.c_str(), gw, gh, c, grid.data(), gw * c)) {
    throw std::runtime_error("cannot write PNG '" + path + "': check that the folder is writable");
  }
}

at::Tensor class_grid_labels(int64_t num_classes, int64_t per_class) {
  if (num_classes < 1 || per_class < 1) {
    throw std::invalid_argument("class_grid_labels: need num_classes >= 1 and per_class >= 1, got " +
                                std::to_string(num_classes) + " and " + std::to_string(per_class));
  }
  return torch::arange(num_classes, torch::kLong).repeat_interleave(per_class);
}

at::Tensor class_grid_indices(const at::Tensor& labels, int64_t num_classes, int64_t per_class) {
  if (num_classes < 1 || per_class < 1) {
    throw std::invalid_argument("class_grid_indices: need num_classes >= 1 and per_class >= 1, got " +
                                std::to_string(num_classes) + " and " + std::to_string(per_class));
  }
  if (!labels.defined() || labels.dim() != 1 ||
      !at::isIntegralType(labels.scalar_type(), /*includeBool=*/false)) {
    throw std::invalid_argument("class_grid_indices: expected integer labels [M], got " +
                                (labels.defined() ? shape_str(labels) + " " +
                                                        std::string(c10::toString(labels.scalar_type()))
                                                  : std::string("an undefined tensor")));
  }
  at::Tensor lab = labels.to(at::kCPU, at::kLong).contiguous();
  const int64_t* l = lab.data_ptr<int64_t>();
  at::Tensor out = torch::full({num_classes * per_class}, -1, torch::kLong);
  int64_t* o = out.data_ptr<int64_t>();
  std::vector<int64_t> filled(static_cast<size_t>(num_classes), 0);
  for (int64_t i = 0; i < lab.numel(); ++i) {
    if (l[i] < 0 || l[i] >= num_classes) {
      throw std::invalid_argument("class_grid_indices: label " + std::to_string(i) + " is " +
                                  std::to_string(l[i]) + ", outside [0, " +
                                  std::to_string(num_classes) + ")");
    }
    int64_t& f = filled[static_cast<size_t>(l[i])];
    if (f < per_class) o[l[i] * per_class + f++] = i;
  }
  return out;
}

void write_class_grid(const std::string& path, const at::Tensor& images, const at::Tensor& labels,
                      int64_t num_classes, int64_t per_class) {
  if (!images.defined() || images.dim() != 4 || (images.size(1) != 1 && images.size(1) != 3) ||
      !labels.defined() || labels.dim() != 1 || images.size(0) != labels.size(0)) {
    throw std::invalid_argument(
        "write_class_grid: expected images [M, C, H, W] with C = 1 or 3 and labels [M], got " +
        (images.defined() ? shape_str(images) : std::string("undefined")) + " and " +
        (labels.defined() ? shape_str(labels) : std::string("undefined")));
  }
  at::Tensor idx = class_grid_indices(labels, num_classes, per_class);
  // Cells without a sample are -1 images, which write_png_grid draws black.
  at::Tensor src = images.detach().to(at::kCPU, at::kFloat);
  at::Tensor ordered = torch::full({idx.size(0), src.size(1), src.size(2), src.size(3)}, -1.0f);
  at::Tensor present = idx.ge(0).nonzero().squeeze(1);
  ordered.index_copy_(0, present, src.index_select(0, idx.index_select(0, present)));
  write_png_grid(path, ordered, static_cast<int>(per_class));
}

}  // namespace shardgan
