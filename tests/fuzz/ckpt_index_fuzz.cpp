// Fuzz target: a checkpoint's index and manifest (index.h5, manifest.json; the reader in
// src/checkpoint/shard_io.cpp and manifest.cpp). An input that starts with HDF5's signature
// is written as the checkpoint's index.h5; any other input is taken as the manifest's JSON
// text and wrapped in an index.h5 with a matching checksum (a crafted index, which the
// checksum cannot refuse). The checkpoint folder also holds the rank file of the seed
// checkpoint (tests/fuzz/data/ckpt, a 1-step run of a tiny DCGAN on one rank), so that a
// manifest that parses drives reads of a real rank file. Documented errors:
// CheckpointError, h5::H5Error, std::runtime_error, std::out_of_range (Manifest::file).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>

#include "ckpt_exercise.h"

#ifndef SHARDGAN_FUZZ_DATA_DIR
#error "SHARDGAN_FUZZ_DATA_DIR (tests/fuzz/data) must be defined"
#endif

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardgan;
  fuzz::quiet_libraries();
  static const std::string dir = [] {
    const std::string d = fuzz::scratch_dir("ckpt_index") + "/ckpt";
    std::filesystem::create_directories(d);
    std::filesystem::copy_file(std::string(SHARDGAN_FUZZ_DATA_DIR) + "/ckpt/rank-00000.h5", d + "/rank-00000.h5",
                               std::filesystem::copy_options::overwrite_existing);
    return d;
  }();
  static const char kHdf5Signature[] = "\x89HDF\r\n\x1a\n";
  const std::string index = dir + "/" + ckpt::kIndexFile;
  std::filesystem::remove(index);
  const bool hdf5 = size >= 8 && std::memcmp(data, kHdf5Signature, 8) == 0;
  if (hdf5) {
    fuzz::write_file(index, data, size);
  } else {
    fuzz::write_minimal_index(dir, std::string(reinterpret_cast<const char*>(data), size));
  }
  fuzz::exercise_checkpoint("ckpt_index_fuzz", dir, /*check_index=*/hdf5);
  return 0;
}
