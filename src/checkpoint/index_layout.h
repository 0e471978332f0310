#pragma once
/// Private to src/checkpoint, shared by shard_io.cpp (the writer and reader) and verify.cpp
/// (`shardgan-ckpt verify`): the index's virtual datasets as the manifest lays them out
/// (write_index writes them; verify_all checks that the index still holds exactly them),
/// and the advice both append to a corrupted-file error.
#include <cstdint>
#include <string>
#include <vector>

#include "shardgan/h5/h5.h"
#include "shardgan/checkpoint/manifest.h"

namespace shardgan::ckpt {

/// Elements of a tensor of `shape` (1 for a 0-d shape).
inline int64_t product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

/// What to do about a corrupted checkpoint file, appended to the errors that report one.
extern const std::string kDoWhat;

// One virtual dataset of the index, as the manifest lays it out: write_index writes these,
// and verify_all checks that the index still holds exactly these.
struct IndexDataset {
  std::string path;
  h5::DType dt;
  std::vector<int64_t> shape;
  std::vector<h5::File::VirtualPiece> pieces;
  bool is_param = false;  // parameters and their states carry attributes unit and flat_offset
  std::string unit;
  int64_t flat_offset = 0;
};

/// Every virtual dataset of the index of the checkpoint `m` describes, in write order.
std::vector<IndexDataset> index_layout(const Manifest& m);

}  // namespace shardgan::ckpt
