// Fuzz target: the HDF5 image dataset reader (include/shardgan/data/hdf5_dataset.h:
// datasets imgs, labels, A and the root attribute classes). The input is written as an
// HDF5 file; the reader opens it, and when it accepts it, reads the class names, checks
// the labels against 10 classes and reads a few rows (first, last, middle, a repeat) as
// scaled images, labels, raw bytes and, for a file of pairs, the condition images.
// Documented errors: DataError (std::runtime_error), std::out_of_range, std::logic_error
// for read_condition without A (not called here then).
#include <cstddef>
#include <cstdint>
#include <string>

#include <torch/torch.h>

#include "fuzz_common.h"
#include "shardgan/data/hdf5_dataset.h"

namespace {
// Rows larger than this are not read: a crafted dataspace can declare any image size, and
// the trainer compares C, H and W with its config before it reads a row.
constexpr int64_t kMaxRowBytes = int64_t{1} << 22;
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardgan;
  fuzz::quiet_libraries();
  static const std::string path = fuzz::scratch_dir("hdf5_dataset") + "/data.h5";
  fuzz::write_file(path, data, size);
  fuzz::run_reader("hdf5_dataset_fuzz", [&] {
    data::Hdf5Dataset ds(path);
    (void)ds.class_names();
    fuzz::clear_error_or_ok("hdf5_dataset_fuzz", [&] { ds.check_labels(10); });
    if (ds.image_numel() <= 0 || ds.image_numel() > kMaxRowBytes) return;
    const int64_t n = ds.size();
    const at::Tensor idx = torch::tensor({int64_t{0}, n - 1, n / 2, int64_t{0}}, torch::kInt64);
    at::Tensor images, labels;
    data::ReadStats stats;
    ds.read(idx, torch::kFloat32, &images, &labels, &stats);
    (void)ds.read_raw(idx.slice(0, 0, 2));
    if (ds.condition_channels() > 0 && ds.condition_channels() * ds.height() * ds.width() <= kMaxRowBytes) {
      (void)ds.read_condition(idx, torch::kFloat32);
    }
  });
  return 0;
}
