#include "sharding/ownership.h"

#include <mutex>
#include <stdexcept>
#include <unordered_map>

namespace shardgan::detail {
namespace {

std::mutex& mu() {
  static std::mutex m;
  return m;
}

// Keyed by TensorImpl: flattening replaces a parameter's data (set_data) but keeps the
// TensorImpl, which is what the module, autograd and our slots all hold.
std::unordered_map<const c10::TensorImpl*, std::string>& owners() {
  static std::unordered_map<const c10::TensorImpl*, std::string> m;
  return m;
}

}  // namespace

void claim_parameter(const at::Tensor& p, const std::string& qualified_name) {
  std::lock_guard<std::mutex> lock(mu());
  auto [it, inserted] = owners().emplace(p.unsafeGetTensorImpl(), qualified_name);
  if (!inserted) {
    throw std::invalid_argument("parameter '" + qualified_name + "' already belongs to unit parameter '" +
                                it->second + "': every parameter must belong to exactly one sharding "
                                "unit; put a shared module in one unit and pass its output to the others");
  }
}

void release_parameter(const at::Tensor& p) {
  std::lock_guard<std::mutex> lock(mu());
  owners().erase(p.unsafeGetTensorImpl());
}

bool is_owned_parameter(const at::Tensor& p) {
  std::lock_guard<std::mutex> lock(mu());
  return owners().count(p.unsafeGetTensorImpl()) != 0;
}

}  // namespace shardgan::detail
