#pragma once
// The identity of a feature network's weights (feature_network.h's FeatureNetwork::hash).
#include <map>
#include <string>

#include <ATen/core/Tensor.h>

namespace shardgan::eval {

/// xxh3-64 of the tensors' raw bytes (each made contiguous on the CPU), in the order of their
/// names (std::map's, bytewise, as Python's sorted()), as 16 lowercase hex digits: the value
/// Python's xxhash.xxh3_64().hexdigest() gives for the same bytes (scripts/export_inception.py
/// writes it into the manifest). Also the hash of reference images (reference_stats.h's
/// images_xxh3: one float32 tensor). Local.
std::string weights_xxh3(const std::map<std::string, at::Tensor>& tensors);

}  // namespace shardgan::eval
