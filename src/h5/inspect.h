#pragma once
/// Inspecting HDF5 files beyond reading datasets (used by src/checkpoint), for
/// `shardgan-ckpt verify`: it compares the index's virtual datasets with the layout the
/// manifest implies, and walks every object of every file, so that a corrupted file cannot
/// make h5py or h5dump read wrong values (or fail) while verify reports it as sound.
#include <string>
#include <vector>

#include "shardgan/h5/h5.h"

namespace shardgan::h5 {

/// One file opened read-only for inspecting its virtual datasets.
class VirtualLayouts {
 public:
  /// Throws H5Error naming the path if it cannot be opened.
  explicit VirtualLayouts(const std::string& path);
  VirtualLayouts(const VirtualLayouts&) = delete;
  VirtualLayouts& operator=(const VirtualLayouts&) = delete;
  ~VirtualLayouts();

  /// The mappings of virtual dataset `dataset`, in HDF5's order, as write_virtual takes
  /// them: each side's selection must be one box (from src_start on the 1-D source; start
  /// and count in the virtual dataset). src_numel is -1: HDF5 does not keep the source's
  /// extent. Throws H5Error if the dataset is missing, not virtual, or a selection is not
  /// one box.
  std::vector<File::VirtualPiece> pieces(const std::string& dataset) const;

 private:
  int64_t id_ = -1;
  std::string path_;
};

/// Opens `path` read-only and visits every object in it with all of its header information
/// (what h5py's visititems does). Throws H5Error with HDF5's error stack if any object
/// header cannot be decoded.
void check_object_headers(const std::string& path);

}  // namespace shardgan::h5
