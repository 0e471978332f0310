#pragma once
// Writing an HDF5 file of the eval layer (classifier files, reference statistics) so that a
// crash leaves the previous file intact: fill PATH.tmp, fsync it, rename it over PATH, fsync
// the folder.
#include <filesystem>
#include <functional>
#include <string>

#include "shardgan/h5/h5.h"

namespace shardgan::eval::detail {

/// Creates `path`.tmp, lets `fill` write its datasets and attributes, flushes and closes it,
/// fsyncs it, renames it over `path` and fsyncs the parent folder (created if missing).
/// Throws h5::H5Error, std::filesystem::filesystem_error or std::runtime_error naming the
/// file when a step fails (the previous `path` is then untouched). Local.
inline void write_h5_atomically(const std::string& path, const std::function<void(h5::File&)>& fill) {
  namespace fs = std::filesystem;
  const std::string tmp = path + ".tmp";
  const fs::path parent = fs::path(path).parent_path();
  if (!parent.empty()) fs::create_directories(parent);
  {
    h5::File f = h5::File::create(tmp);
    fill(f);
    f.flush();
    f.close();
  }
  h5::fsync_path(tmp);
  fs::rename(tmp, path);
  h5::fsync_path(parent.empty() ? "." : parent.string());
}

}  // namespace shardgan::eval::detail
