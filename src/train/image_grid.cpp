#include "shardgan/train/image_grid.h"

#include <stdexcept>
#include <vector>

#include <stb/stb_image_write.h>
#include <torch/torch.h>

namespace shardgan {

void write_png_grid(const std::string& path, const at::Tensor& images, int nrow) {
  TORCH_CHECK(images.dim() == 4 && images.size(1) == 1, "write_png_grid: expected [N, 1, H, W]");
  const int n = static_cast<int>(images.size(0)), h = static_cast<int>(images.size(2)),
            w = static_cast<int>(images.size(3)), pad = 2;
  const int rows = (n + nrow - 1) / nrow;
  const int gw = nrow * (w + pad) + pad, gh = rows * (h + pad) + pad;
  at::Tensor px = ((images.detach().to(at::kFloat).clamp(-1, 1) + 1) * 127.5).round().to(at::kByte).contiguous();
  std::vector<uint8_t> grid(static_cast<size_t>(gw) * gh, 0);
  const uint8_t* src = px.data_ptr<uint8_t>();
  for (int i = 0; i < n; ++i) {
    const int oy = pad + (i / nrow) * (h + pad), ox = pad + (i % nrow) * (w + pad);
    for (int y = 0; y < h; ++y) {
      for (int x = 0; x < w; ++x) grid[(oy + y) * gw + ox + x] = src[(i * h + y) * w + x];
    }
  }
  if (!stbi_write_png(path.c_str(), gw, gh, 1, grid.data(), gw)) {
    throw std::runtime_error("cannot write PNG '" + path + "': check that the folder is writable");
  }
}

}  // namespace shardgan
