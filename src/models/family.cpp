#include "shardgan/models/family.h"

#include <stdexcept>
#include <string>

#include <torch/torch.h>

#include "shardgan/models/biggan.h"
#include "shardgan/models/dcgan.h"
#include "shardgan/models/pix2pix.h"
#include "shardgan/models/stylegan2.h"

namespace shardgan {

at::Tensor ModelFamily::sample_labels(int64_t n, at::Generator& gen) const {
  if (num_classes() == 0) return at::Tensor();
  return at::randint(num_classes(), {n}, gen, torch::TensorOptions().dtype(at::kLong));
}

at::Tensor ModelFamily::sample_truncated_latents(int64_t n, at::Generator& gen, at::ScalarType dtype,
                                                 double truncation) const {
  at::Tensor z = sample_latents(n, gen, dtype);
  if (truncation <= 0) return z;
  if (!truncation_applies()) {
    throw std::invalid_argument(std::string("the truncation trick needs Gaussian latents; model.arch ") + arch() +
                                " has none (set the truncation to 0)");
  }
  if (truncation < 0.05) throw std::invalid_argument("truncation " + std::to_string(truncation) + " is below 0.05");
  // Resampling (not clamping) keeps the draw a truncated normal, as the paper defines it.
  for (;;) {
    const at::Tensor out = z.abs().gt(truncation);
    const int64_t outside = out.sum().item<int64_t>();  // one host read per round
    if (outside == 0) return z;
    z.masked_scatter_(out, at::randn({outside}, gen, z.options()));
  }
}

const std::vector<std::string>& model_archs() {
  static const std::vector<std::string> archs{"dcgan", "biggan", "pix2pix", "stylegan2"};
  return archs;
}

std::unique_ptr<ModelFamily> make_family(ConfigReader& r) {
  const std::string arch =
      r.get<std::string>("model.arch", "dcgan", "model family: dcgan, biggan, pix2pix or stylegan2");
  if (arch == "dcgan") return make_dcgan_family(r);
  if (arch == "biggan") return make_biggan_family(r);
  if (arch == "pix2pix") return make_pix2pix_family(r);
  if (arch == "stylegan2") return make_stylegan2_family(r);
  throw ConfigError(r.source() + ": key 'model.arch' is '" + arch + "'; use dcgan, biggan, pix2pix or stylegan2");
}

}  // namespace shardgan
