#pragma once
/// A cache of the reference side of the sample-quality metrics: the real images' features
/// through one feature network (feature_network.h), with their mean and covariance (FID)
/// and the features themselves (KID, precision/recall), stored in HDF5 together with the
/// hashes that say which network and which images they came from. `shardgan-fid stats`
/// writes one; the trainer's eval.reference_cache writes it when missing and reuses it only
/// when both hashes match the current evaluation's. See docs/fid.md. Local (no collectives).
#include <cstdint>
#include <stdexcept>
#include <string>

#include <ATen/core/Tensor.h>

#include "shardgan/eval/frechet.h"

namespace shardgan::eval {

/// The root attribute "format" of a statistics file, and its "version".
inline constexpr const char* kReferenceStatsFormat = "shardgan-fid-stats";
inline constexpr int64_t kReferenceStatsVersion = 1;

/// A statistics file that is missing, unreadable, or of another format; or one whose hashes
/// differ from what the caller expects (check_reference_stats). Names the file.
class ReferenceStatsError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// images_xxh3 of statistics made elsewhere (pytorch-fid's .npz, docs/fid.md): the images
/// cannot be checked, and check_reference_stats accepts them on the network hash alone.
inline constexpr const char* kImagesUnchecked = "unchecked";

struct ReferenceStats {
  FeatureStats stats;       ///< mean [F] and unbiased covariance [F, F] (float64), n = N
  /// float64 CPU [N, F] (stored as float32: the networks compute in float32); undefined in a
  /// file without the features dataset (converted from mean and covariance only: FID only)
  at::Tensor features;
  std::string network_xxh3;       ///< FeatureNetwork::hash() of the network
  std::string network;            ///< FeatureNetwork::description(), for messages
  std::string images_xxh3;        ///< images_xxh3() of the reference images
  std::string source;             ///< where the images came from (a path), for messages
};

/// xxh3-64 (16 hex digits) of `images`' float32 bytes ([N, C, H, W], made contiguous on the
/// CPU; other float dtypes are converted to float32 first): the identity of the images a
/// statistics file describes. Local.
std::string images_xxh3(const at::Tensor& images);

/// Writes `s` to `path` atomically (path.tmp, fsync, rename): datasets mean [F] and cov
/// [F, F] (float64), features [N, F] when defined (float32; throws std::invalid_argument if a feature is
/// not exactly representable in float32), and root attributes format, version, count,
/// feature_dim, network_xxh3, network, images_xxh3 and source. Throws h5::H5Error or
/// std::runtime_error naming the file when it cannot be written.
void save_reference_stats(const std::string& path, const ReferenceStats& s);

/// Reads a file written by save_reference_stats. Throws ReferenceStatsError naming `path`
/// when it is missing, not HDF5, of another format or version, or inconsistent (shapes).
ReferenceStats load_reference_stats(const std::string& path);

/// Throws ReferenceStatsError naming `path` (and both values) when `s` was computed with
/// another network (network_xxh3) or on other images (images_xxh3, unless it is
/// kImagesUnchecked) than the caller's: a stale cache is refused, never reused. The message says to delete the file or run
/// `shardgan-fid stats` again.
void check_reference_stats(const ReferenceStats& s, const std::string& path, const std::string& network_xxh3,
                           const std::string& images_xxh3);

}  // namespace shardgan::eval
