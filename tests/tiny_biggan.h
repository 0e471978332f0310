#pragma once
// A BigGAN small enough for whole training steps in a test (32x32, 1 channel, 3 classes,
// one block per resolution, attention at its defaults), and the per-layer count of spectral
// norm's power iterations. Shared by the activation-checkpointing and joint-pass tests.
#include <cstdint>
#include <vector>

#include "models/biggan/layers.h"
#include "shardgan/models/biggan.h"
#include "shardgan/sharding/sharded_model.h"

namespace shardgan::test_util {

inline BigGanConfig tiny_biggan() {
  BigGanConfig c;
  c.ch = 4;
  c.d_ch = 4;
  c.g_ch_mult = {4, 4, 4, 2};
  c.d_ch_mult = {2, 4, 4, 4};
  c.g_blocks_per_res = 0;
  c.d_blocks_per_res = 0;
  c.z_dim = 8;
  c.shared_dim = 4;
  c.n_classes = 3;
  c.channels = 1;
  return c;  // init "ortho"
}

/// advances() of every spectral-norm layer of `m`, in unit and module order.
inline std::vector<int64_t> sn_advances(ShardedModel& m) {
  std::vector<int64_t> out;
  for (auto& u : m.units()) {
    for (auto& mod : u->module().modules()) {
      if (auto* sn = dynamic_cast<biggan::SNBase*>(mod.get())) out.push_back(sn->advances());
    }
  }
  return out;
}

}  // namespace shardgan::test_util
