#pragma once
// Small helpers shared by the test files.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "shardgan/sharding/sharded_unit.h"

namespace shardgan::test_util {

/// A ShardingConfig with `stage` and every other option at its default.
inline ShardingConfig sharding(int stage) {
  ShardingConfig c;
  c.stage = stage;
  return c;
}

/// Per tensor of two named lists (same names, same order): max|a - b| / max|b|. Expects
/// each to be <= `bound` (naming `what` and the tensor) and returns the largest.
inline double max_rel_diff(const std::vector<std::pair<std::string, at::Tensor>>& a,
                           const std::vector<std::pair<std::string, at::Tensor>>& b,
                           const std::string& what = "", double bound = 1e-9) {
  EXPECT_EQ(a.size(), b.size()) << what;
  double worst = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    const double scale = b[i].second.abs().max().item<double>();
    const double diff = (a[i].second - b[i].second).abs().max().item<double>();
    const double rel = diff / std::max(scale, 1e-300);
    EXPECT_LE(rel, bound) << what << " " << a[i].first << ": max abs diff " << diff << ", scale " << scale;
    worst = std::max(worst, rel);
  }
  return worst;
}

}  // namespace shardgan::test_util
