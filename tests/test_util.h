#pragma once
// Small helpers shared by the test files.
#include "shardgan/sharding/sharded_unit.h"

namespace shardgan::test_util {

/// A ShardingConfig with `stage` and every other option at its default.
inline ShardingConfig sharding(int stage) {
  ShardingConfig c;
  c.stage = stage;
  return c;
}

}  // namespace shardgan::test_util
