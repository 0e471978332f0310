// Fuzz target: the FID classifier file (include/shardgan/eval/classifier.h
// load_classifier). The input is written as an HDF5 file and loaded; a file the loader
// accepts is run on one image (extract_features), which must give a [1, 128] result.
// Documented errors: ClassifierFileError (std::runtime_error), h5::H5Error.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <torch/torch.h>

#include "fuzz_common.h"
#include "shardgan/eval/classifier.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardgan;
  fuzz::quiet_libraries();
  static const bool threads = [] {
    torch::set_num_threads(1);
    return true;
  }();
  (void)threads;
  static const std::string path = fuzz::scratch_dir("classifier") + "/classifier.h5";
  fuzz::write_file(path, data, size);
  fuzz::run_reader("classifier_fuzz", [&] {
    eval::ClassifierInfo info;
    eval::Classifier model = eval::load_classifier(path, &info);
    const at::Tensor f = eval::extract_features(model, torch::zeros({1, 1, 32, 32}), 1);
    if (f.dim() != 2 || f.size(0) != 1 || f.size(1) != eval::kClassifierFeatureDim) {
      std::fprintf(stderr, "FINDING in classifier_fuzz: features of %d dimensions, expected [1, 128]\n", static_cast<int>(f.dim()));
      std::abort();
    }
  });
  return 0;
}
