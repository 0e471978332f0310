#pragma once
// Image-file helpers shared by the converters (convert.cpp, convert_paired.cpp); internal.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

namespace shardgan::data {

/// Whether `p` has an image extension stb_image decodes (.png .jpg .jpeg .bmp .pgm .ppm .tga).
bool is_image_file(const std::filesystem::path& p);

/// An image decoded by stb_image: height x width x channels bytes, interleaved.
struct DecodedImage {
  std::unique_ptr<unsigned char, void (*)(void*)> pixels;
  int64_t width = 0, height = 0;
};

/// Decodes `file` into `channels` (1 grey, 3 RGB; stb converts). Throws DataError naming it.
DecodedImage decode_image(const std::string& file, int64_t channels);

/// Resizes the w x h region at `src` (row stride `stride` bytes, `channels` interleaved) to
/// size x size with stb_image_resize (a copy when already that size) and writes it to `dst`
/// as [channels, size, size]. Throws DataError naming `file` when resizing fails.
void resize_to_chw(const uint8_t* src, int64_t w, int64_t h, int64_t stride, int64_t channels, int64_t size,
                   uint8_t* dst, const std::string& file);

}  // namespace shardgan::data
