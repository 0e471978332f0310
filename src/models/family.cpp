#include "shardgan/models/family.h"

#include <torch/torch.h>

#include "shardgan/models/biggan.h"
#include "shardgan/models/dcgan.h"
#include "shardgan/models/pix2pix.h"

namespace shardgan {

at::Tensor ModelFamily::sample_labels(int64_t n, at::Generator& gen) const {
  if (num_classes() == 0) return at::Tensor();
  return at::randint(num_classes(), {n}, gen, torch::TensorOptions().dtype(at::kLong));
}

const std::vector<std::string>& model_archs() {
  static const std::vector<std::string> archs{"dcgan", "biggan", "pix2pix"};
  return archs;
}

std::unique_ptr<ModelFamily> make_family(ConfigReader& r) {
  const std::string arch = r.get<std::string>("model.arch", "dcgan", "model family: dcgan, biggan or pix2pix");
  if (arch == "dcgan") return make_dcgan_family(r);
  if (arch == "biggan") return make_biggan_family(r);
  if (arch == "pix2pix") return make_pix2pix_family(r);
  throw ConfigError(r.source() + ": key 'model.arch' is '" + arch + "'; use dcgan, biggan or pix2pix");
}

}  // namespace shardgan
