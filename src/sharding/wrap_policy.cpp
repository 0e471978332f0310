#include "shardgan/sharding/wrap_policy.h"

#include <torch/torch.h>

#include "shardgan/sharding/sharded_model.h"

namespace shardgan {
namespace {

bool matches(const torch::nn::Module& m, const std::vector<std::string>& types) {
  const std::string name = m.name();
  for (const auto& t : types) {
    // Match the class name exactly ("Conv2d" must not match "ConvTranspose2d").
    const std::string impl = t + "Impl";  // e.g. "torch::nn::Conv2dImpl"
    const bool qualified = name.size() > impl.size() &&
                           name.compare(name.size() - impl.size(), impl.size(), impl) == 0 &&
                           name[name.size() - impl.size() - 1] == ':';
    if (name == t || qualified) return true;
  }
  return false;
}

int64_t numel_of(const torch::nn::Module& m) {
  int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel();
  return n;
}

}  // namespace

size_t wrap_sequential(ShardedModel& model, torch::nn::Sequential seq, const WrapPolicy& policy) {
  size_t added = 0, first = 0, index = 0;
  int64_t group_numel = 0;
  torch::nn::Sequential group;
  auto close = [&](size_t last) {
    if (group->size() == 0) return;
    torch::nn::Sequential unit = group;
    model.add_unit("u" + std::to_string(first) + "-" + std::to_string(last), unit.ptr(),
                   [unit](const at::Tensor& x) mutable { return unit->forward(x); });
    ++added;
    group = torch::nn::Sequential();
    group_numel = 0;
  };
  for (const auto& child : *seq) {
    if (!policy.unit_types.empty() && matches(*child.ptr(), policy.unit_types) && group->size() > 0) {
      close(index - 1);
    }
    if (group->size() == 0) first = index;
    group->push_back(child);
    group_numel += numel_of(*child.ptr());
    if (policy.min_num_params > 0 && group_numel >= policy.min_num_params) close(index);
    ++index;
  }
  close(index - 1);
  return added;
}

}  // namespace shardgan
