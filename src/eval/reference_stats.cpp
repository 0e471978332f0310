// The reference statistics cache (reference_stats.h).
#include "shardgan/eval/reference_stats.h"

#include <filesystem>
#include <optional>

#include <torch/torch.h>

#include "eval/atomic_h5.h"
#include "eval/network_hash.h"
#include "shardgan/h5/h5.h"
#include "shardgan/h5/probe.h"

namespace shardgan::eval {
namespace fs = std::filesystem;

std::string images_xxh3(const at::Tensor& images) {
  return weights_xxh3({{"images", images.detach().to(at::kCPU, at::kFloat)}});
}

void save_reference_stats(const std::string& path, const ReferenceStats& s) {
  const at::Tensor mean = s.stats.mean.to(torch::kDouble).contiguous();
  const at::Tensor cov = s.stats.cov.to(torch::kDouble).contiguous();
  const at::Tensor f32 = s.features.defined() ? s.features.to(torch::kFloat).contiguous() : at::Tensor();
  if (f32.defined() && !f32.to(torch::kDouble).equal(s.features.to(torch::kDouble))) {
    throw std::invalid_argument("save_reference_stats: " + path + ": features are not exact in float32");
  }
  const int64_t F = mean.size(0);
  detail::write_h5_atomically(path, [&](h5::File& f) {
    f.write("mean", h5::DType::kF64, {F}, mean.data_ptr());
    f.write("cov", h5::DType::kF64, {F, F}, cov.data_ptr());
    if (f32.defined()) f.write("features", h5::DType::kF32, {f32.size(0), F}, f32.data_ptr());
    f.set_attr("/", "format", std::string(kReferenceStatsFormat));
    f.set_attr("/", "version", kReferenceStatsVersion);
    f.set_attr("/", "count", s.stats.n);
    f.set_attr("/", "feature_dim", F);
    f.set_attr("/", "network_xxh3", s.network_xxh3);
    f.set_attr("/", "network", s.network);
    f.set_attr("/", "images_xxh3", s.images_xxh3);
    f.set_attr("/", "source", s.source);
  });
}

ReferenceStats load_reference_stats(const std::string& path) {
  const std::string where = "reference statistics " + path;
  const std::string fix = "; delete it and let the trainer write it again, or run `shardgan-fid stats`";
  if (!fs::is_regular_file(path)) throw ReferenceStatsError(where + ": no such file" + fix);
  if (const std::string why = h5::probe_isolated(path, {"*"}); !why.empty()) {
    throw ReferenceStatsError(where + ": not a readable HDF5 file (" + why + ")" + fix);
  }
  std::optional<h5::File> f;
  try {
    f.emplace(h5::File::open_read(path));
  } catch (const h5::H5Error& e) {
    throw ReferenceStatsError(where + ": not a readable HDF5 file (" + e.what() + ")" + fix);
  }
  ReferenceStats s;
  try {
    if (f->attr_string("/", "format") != kReferenceStatsFormat) {
      throw ReferenceStatsError(where + ": format is not " + kReferenceStatsFormat + fix);
    }
    if (f->attr_int("/", "version") != kReferenceStatsVersion) {
      throw ReferenceStatsError(where + ": version " + std::to_string(f->attr_int("/", "version")) +
                                ", this shardgan reads " + std::to_string(kReferenceStatsVersion) + fix);
    }
    const int64_t n = f->attr_int("/", "count"), F = f->attr_int("/", "feature_dim");
    const bool with_features = f->exists("features");
    if (f->shape("mean") != std::vector<int64_t>{F} || f->shape("cov") != std::vector<int64_t>{F, F} ||
        (with_features && f->shape("features") != std::vector<int64_t>{n, F}) || n < 2) {
      throw ReferenceStatsError(where + ": its datasets' shapes do not match count and feature_dim" + fix);
    }
    s.stats.n = n;
    s.stats.mean = torch::empty({F}, torch::kDouble);
    s.stats.cov = torch::empty({F, F}, torch::kDouble);
    f->read("mean", h5::DType::kF64, s.stats.mean.data_ptr(), F);
    f->read("cov", h5::DType::kF64, s.stats.cov.data_ptr(), F * F);
    if (with_features) {
      at::Tensor f32 = torch::empty({n, F}, torch::kFloat);
      f->read("features", h5::DType::kF32, f32.data_ptr(), n * F);
      s.features = f32.to(torch::kDouble);
    }
    s.network_xxh3 = f->attr_string("/", "network_xxh3");
    s.network = f->attr_string("/", "network");
    s.images_xxh3 = f->attr_string("/", "images_xxh3");
    s.source = f->attr_string("/", "source");
  } catch (const h5::H5Error& e) {
    throw ReferenceStatsError(where + ": incomplete (" + e.what() + ")" + fix);
  }
  return s;
}

void check_reference_stats(const ReferenceStats& s, const std::string& path, const std::string& network_xxh3,
                           const std::string& images_xxh3) {
  const std::string fix = "; it is stale: delete it (the trainer writes a new one) or run `shardgan-fid stats` again";
  if (s.network_xxh3 != network_xxh3) {
    throw ReferenceStatsError("reference statistics " + path + ": computed with the feature network of weights xxh3 " +
                              s.network_xxh3 + " (" + s.network + "), but this evaluation uses weights xxh3 " +
                              network_xxh3 + fix);
  }
  if (s.images_xxh3 != kImagesUnchecked && s.images_xxh3 != images_xxh3) {
    throw ReferenceStatsError("reference statistics " + path + ": computed on images of xxh3 " + s.images_xxh3 +
                              " (" + s.source + "), but this evaluation's reference images hash to " + images_xxh3 +
                              fix);
  }
}

}  // namespace shardgan::eval
