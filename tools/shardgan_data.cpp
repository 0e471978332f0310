// shardgan-data: write and inspect datasets in BigGAN-PyTorch's HDF5 layout (imgs uint8
// [N, C, H, W], labels int64 [N]) for data.source: hdf5. Needs no MPI runtime.
//   shardgan-data convert /usr/share/datasets/fashion-mnist [--split train|t10k] -o fmnist.h5
//   shardgan-data convert IMAGE_FOLDER -o out.h5 [--size 32] [--channels 1|3]
//   shardgan-data convert --paired FASHION_MNIST_DIR|PAIR_FOLDER -o pairs.h5 [--size 256] [--channels 3]
//   shardgan-data info FILE.h5
// SOURCE is Fashion-MNIST's folder when it holds <split>-images-idx3-ubyte.gz, else an
// ImageFolder (one subfolder per class). Exit status: 0 fine, 1 bad data, 2 bad usage.
#include <cstdio>
#include <filesystem>
#include <string>

#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include "shardgan/data/convert.h"
#include "shardgan/data/hdf5_dataset.h"

using namespace shardgan;

namespace {

int cmd_convert(const std::string& src, const std::string& out, const std::string& split, int64_t size,
                int64_t channels, int64_t chunk, bool paired) {
  const bool idx = std::filesystem::exists(src + "/" + split + "-images-idx3-ubyte.gz");
  const data::ConvertResult r = idx      ? data::convert_fashion_mnist(src, split, out, chunk, paired)
                                : paired ? data::convert_paired_folder(src, out, size, channels, chunk)
                                         : data::convert_image_folder(src, out, size, channels, chunk);
  std::string what = idx ? "Fashion-MNIST " + split + ", padded 28x28 -> 32x32" : paired ? "A|B pairs" : "ImageFolder";
  if (idx && paired) what += "; A: Sobel edges, B: the image";
  std::printf("wrote %s: %lld %s [%lld, %lld, %lld] uint8, %zu classes (%s)%s\n", out.c_str(), (long long)r.images,
              paired ? "pairs" : "images", (long long)r.channels, (long long)r.height, (long long)r.width,
              r.classes.size(), what.c_str(),
              r.skipped_files ? (", skipped " + std::to_string(r.skipped_files) + " non-image files").c_str() : "");
  return 0;
}

int cmd_info(const std::string& file) {
  data::Hdf5Dataset ds(file);
  std::printf("%s\nimgs    uint8 [%lld, %lld, %lld, %lld] (%.3f GB)\nlabels  int64 [%lld], values %lld .. %lld\n",
              file.c_str(), (long long)ds.size(), (long long)ds.channels(), (long long)ds.height(),
              (long long)ds.width(), ds.size() * ds.image_numel() / 1e9, (long long)ds.size(),
              (long long)ds.min_label(), (long long)ds.max_label());
  const auto names = ds.class_names();
  std::string joined;
  for (size_t k = 0; k < names.size(); ++k) joined += (k ? ", " : "") + std::to_string(k) + ": " + names[k];
  std::printf("classes %zu%s%s\n", names.size(), names.empty() ? " (no 'classes' attribute)" : ": ", joined.c_str());
  if (ds.condition_channels() > 0) {
    std::printf("pairs   A uint8 [%lld, %lld, %lld, %lld] (input images), B = imgs\n", (long long)ds.size(),
                (long long)ds.condition_channels(), (long long)ds.height(), (long long)ds.width());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"shardgan-data: datasets in BigGAN-PyTorch's HDF5 layout for data.source: hdf5"};
  app.require_subcommand(1);
  std::string src, out, split = "train", file;
  int64_t size = 32, channels = 1, chunk = data::kDefaultChunkImages;
  auto* convert = app.add_subcommand("convert", "Fashion-MNIST idx files or an ImageFolder -> OUT.h5");
  convert->add_option("source", src, "Fashion-MNIST folder (idx .gz files) or ImageFolder root")->required();
  convert->add_option("-o,--output", out, "the .h5 file to write (atomically: OUT.tmp, then renamed)")->required();
  convert->add_option("--split", split, "Fashion-MNIST split")->check(CLI::IsMember({"train", "t10k"}));
  convert->add_option("--size", size, "ImageFolder: square side in pixels after crop and resize")
      ->check(CLI::Range(1, 4096));
  convert->add_option("--channels", channels, "ImageFolder: 1 (grey) or 3 (RGB)")->check(CLI::IsMember({1, 3}));
  convert->add_option("--chunk", chunk, "images per HDF5 chunk of imgs; 0 = contiguous")->check(CLI::NonNegativeNumber);
  bool paired = false;
  convert->add_flag("--paired", paired,
                    "a file of pairs (A and B) for image-to-image models: Fashion-MNIST's images with their Sobel "
                    "edge maps as A, or a folder of A|B side-by-side images (pix2pix's layout)");
  auto* info = app.add_subcommand("info", "validate FILE.h5 and print its shape and label range");
  info->add_option("file", file, "an .h5 file in BigGAN-PyTorch's layout")->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  try {
    torch::set_num_threads(1);
    if (*convert) return cmd_convert(src, out, split, size, channels, chunk, paired);
    if (*info) return cmd_info(file);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "shardgan-data: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "shardgan-data: error: %s\n", e.what());
    return 1;
  }
  return 2;
}
