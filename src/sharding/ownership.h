#pragma once
// Which sharding unit owns each parameter, process-wide. A parameter owned by two units
// would be flattened twice; one owned by none would never be averaged across ranks.
#include <string>

#include <ATen/core/Tensor.h>

namespace shardgan::detail {

/// Records that `qualified_name` ("generator.block0.conv1.weight") owns parameter `p`.
/// Throws std::invalid_argument naming both names if another unit already owns it.
void claim_parameter(const at::Tensor& p, const std::string& qualified_name);

/// Forgets `p` (its unit is being destroyed).
void release_parameter(const at::Tensor& p);

/// Whether some unit owns `p`.
bool is_owned_parameter(const at::Tensor& p);

}  // namespace shardgan::detail
