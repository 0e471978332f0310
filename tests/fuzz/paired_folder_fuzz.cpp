// Fuzz target: the paired-folder reader (include/shardgan/data/paired_folder.h
// read_paired_folder: pix2pix's A|B image files, decoded with stb_image). The input's first
// byte picks the call's parameters: size = 1 + (b & 31), channels 3 if b & 0x40 else 1,
// limit 2 if b & 0x80 else all. The rest is 1 to 4 files separated by "@@FILE@@"
// (fuzz_common.h); each file's first byte picks its extension (.png .jpg .jpeg .bmp .pgm
// .ppm .tga, or .txt: not an image), the remaining bytes are its content. The files are
// written into an empty folder, which is then read. Documented errors: DataError
// (std::runtime_error), std::invalid_argument.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>

#include <torch/torch.h>

#include "fuzz_common.h"
#include "shardgan/data/paired_folder.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardgan;
  fuzz::quiet_libraries();
  static const std::string dir = fuzz::scratch_dir("paired_folder") + "/pairs";
  if (size < 1) return 0;
  const uint8_t p = data[0];
  const int64_t image_size = 1 + (p & 31), channels = (p & 0x40) ? 3 : 1, limit = (p & 0x80) ? 2 : -1;
  static const char* const kExt[] = {".png", ".jpg", ".jpeg", ".bmp", ".pgm", ".ppm", ".tga", ".txt"};
  std::filesystem::create_directories(dir);
  fuzz::clear_dir(dir);
  const auto parts = fuzz::split_parts(std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1), 4);
  int64_t files = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    std::string_view f = parts[i];
    if (f.empty()) continue;
    const char* ext = kExt[static_cast<uint8_t>(f[0]) % 8];
    f.remove_prefix(1);
    fuzz::write_file(dir + "/" + std::to_string(i) + ext, f.data(), f.size());
    ++files;
  }
  fuzz::run_reader("paired_folder_fuzz", [&] {
    const data::PairedImages r = data::read_paired_folder(dir, image_size, channels, limit);
    const int64_t n = r.a.size(0);
    if (r.a.sizes() != r.b.sizes() || r.a.dim() != 4 || r.a.size(1) != channels || r.a.size(2) != image_size ||
        r.a.size(3) != image_size || n < 1 || n + r.skipped_files > files || (limit >= 0 && n > limit)) {
      std::fprintf(stderr, "FINDING in paired_folder_fuzz: result of the wrong shape\n");
      std::abort();
    }
  });
  return 0;
}
