// Fuzz target: a rank file of a checkpoint (rank-00000.h5: its HDF5 datasets and
// attributes; the reader in src/checkpoint/shard_io.cpp and verify.cpp's checks). The input
// is written as the rank file of a one-rank checkpoint whose index is the seed
// checkpoint's manifest (tests/fuzz/data/ckpt) with the rank file's committed size set to
// the input's, so that the size check passes and the reads reach HDF5 (the checksums of
// the data blocks still hold the seed's values). Also reads the schema_version attribute
// the way a folder without index.h5 is probed. Documented errors: CheckpointError,
// h5::H5Error, std::runtime_error.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>

#include "ckpt_exercise.h"

#ifndef SHARDGAN_FUZZ_DATA_DIR
#error "SHARDGAN_FUZZ_DATA_DIR (tests/fuzz/data) must be defined"
#endif

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardgan;
  fuzz::quiet_libraries();
  static const ckpt::Manifest seed = [] {
    ckpt::CheckpointReader r(std::string(SHARDGAN_FUZZ_DATA_DIR) + "/ckpt");
    return r.manifest();
  }();
  static const std::string dir = [] {
    const std::string d = fuzz::scratch_dir("ckpt_rankfile") + "/ckpt";
    std::filesystem::create_directories(d);
    return d;
  }();
  fuzz::clear_dir(dir);
  fuzz::write_file(dir + "/" + ckpt::rank_file_name(0), data, size);
  // A folder with rank files and no index: probed through rank-00000.h5's attribute.
  fuzz::clear_error_or_ok("ckpt_rankfile_fuzz", [&] { (void)ckpt::checkpoint_schema_version(dir); });
  ckpt::Manifest m = seed;
  for (ckpt::FileEntry& fe : m.files) fe.bytes = static_cast<int64_t>(size);
  fuzz::write_minimal_index(dir, ckpt::to_json(m));
  fuzz::exercise_checkpoint("ckpt_rankfile_fuzz", dir, /*check_index=*/false);
  return 0;
}
