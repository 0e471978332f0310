#pragma once
// The TorchScript implementation of feature_network.h's FeatureNetwork, kept in its own
// file so that only it includes torch/script.h.
#include <memory>
#include <string>

#include "shardgan/eval/feature_network.h"

namespace shardgan::eval {

/// load_feature_network("torchscript", path): see feature_network.h.
std::unique_ptr<FeatureNetwork> load_torchscript_network(const std::string& path);

}  // namespace shardgan::eval
