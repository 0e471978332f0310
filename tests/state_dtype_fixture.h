#pragma once
// Shared by the reduced-state tests (test_state_dtype_sharded.cpp, test_state_dtype_offload.cpp):
// a three-unit model whose parameters divide by neither 2 or 4 ranks nor the block, the
// gradients every rank sets alike, the Adam configs, and bitwise snapshots.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "shardgan/comm/communicator.h"
#include "shardgan/optim/sharded_adam.h"
#include "shardgan/sharding/sharded_model.h"

namespace state_dtype_fixture {

using namespace shardgan;

constexpr int kSteps = 12;

// Three units whose parameters do not divide by 2 or 4 ranks or by the block:
// a: Linear 96->80 (weight 7680, bias 80), b: Linear 80->70 (weight 5600: kept float32 by
// a glob; bias 70), c: two Linears 70->64 and 64->65 (4480 + 64, 4160 + 65), c's first
// weight frozen.
inline std::unique_ptr<ShardedModel> make_model(Communicator& comm, int stage, int64_t align,
                                        at::ScalarType dtype = torch::kFloat) {
  ShardingConfig sc;
  sc.stage = stage;
  sc.flat_align = align;
  auto model = std::make_unique<ShardedModel>("m", comm, sc);
  torch::manual_seed(11);
  auto a = torch::nn::Linear(96, 80);
  auto b = torch::nn::Linear(80, 70);
  auto c = torch::nn::Sequential(torch::nn::Linear(70, 64), torch::nn::Linear(64, 65));
  a->to(dtype);
  b->to(dtype);
  c->to(dtype);
  model->add_unit("a", a.ptr(), [a](const at::Tensor& x) mutable { return a->forward(x); });
  model->add_unit("b", b.ptr(), [b](const at::Tensor& x) mutable { return b->forward(x); });
  model->add_unit("c", c.ptr(), [c](const at::Tensor& x) mutable { return c->forward(x); });
  for (auto& s : model->units()[2]->slots()) {
    if (s.name == "0.weight") s.param.requires_grad_(false);
  }
  return model;
}

// The same gradient on every rank, seeded by step and unit: each parameter's part (scaled
// per parameter, so blocks see different magnitudes) at its flat offset, zero padding.
inline void set_gradients(ShardedModel& model, int step) {
  for (size_t u = 0; u < model.units().size(); ++u) {
    ShardedUnit& unit = *model.units()[u];
    at::Tensor padded = torch::zeros({unit.padded_numel()}, torch::kFloat);
    int k = 0;
    for (const auto& s : unit.slots()) {
      torch::manual_seed(5000 + 100 * step + 10 * static_cast<int64_t>(u) + k);
      padded.narrow(0, s.offset, s.numel).copy_(torch::randn({s.numel}) * std::pow(10.0, k % 3 - 1));
      ++k;
    }
    unit.grad_shard().copy_(padded.narrow(0, unit.shard_offset(), unit.shard_numel()));
  }
}

inline AdamConfig config(StateDtype dtype, double beta1, bool adamw) {
  AdamConfig c;
  c.lr = 1e-2;
  c.beta1 = beta1;
  c.weight_decay = adamw ? 0.05 : 0.01;
  c.decoupled_weight_decay = adamw;
  c.state.dtype = dtype;
  c.state.float32 = {"b.weight"};
  return c;
}

inline int64_t align_for(const AdamConfig& c) { return c.state.dtype == StateDtype::kInt8 ? c.state.block : 1; }

// Per unit: [data_end] float32 of the parameters, then of each state, gathered over the
// model's ranks (a collective at stages 1-3).
inline std::vector<at::Tensor> snapshot(ShardedModel& model, ShardedOptimizer& opt, Communicator& comm, int stage) {
  std::vector<at::Tensor> out;
  for (size_t u = 0; u < model.units().size(); ++u) {
    ShardedUnit& unit = *model.units()[u];
    std::vector<at::Tensor> shards = {unit.master_shard().clone()};
    opt.read_unit_state(u, [&](const std::string&, at::Tensor& st) { shards.push_back(st.clone()); });
    for (at::Tensor& s : shards) {
      at::Tensor full = s;
      if (stage != 0) {
        full = torch::empty({unit.padded_numel()}, torch::kFloat);
        comm.all_gather(full, s);
      }
      out.push_back(full.narrow(0, 0, unit.data_end()).clone());
    }
  }
  return out;
}

inline std::vector<at::Tensor> run(Communicator& comm, int stage, const AdamConfig& cfg, int64_t align) {
  auto model = make_model(comm, stage, align);
  ShardedAdam opt(*model, cfg);
  for (int s = 0; s < kSteps; ++s) {
    set_gradients(*model, s);
    opt.step();
    model->after_optimizer_step();
  }
  EXPECT_EQ(opt.nonfinite_blocks(), 0);
  return snapshot(*model, opt, comm, stage);
}

// Bitwise equality of two snapshots (memcmp: also the sign of zero and NaN payloads).
inline bool same_bits(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].numel() != b[i].numel()) return false;
    if (std::memcmp(a[i].data_ptr(), b[i].data_ptr(), static_cast<size_t>(a[i].numel()) * 4) != 0) return false;
  }
  return true;
}

// A temporary directory with the same name on every rank.
inline std::string shared_tmpdir(Communicator& world) {
  char buf[256] = {0};
  if (world.rank() == 0) {
    std::snprintf(buf, sizeof(buf), "/tmp/shardgan-state-dtype.XXXXXX");
    if (!mkdtemp(buf)) std::abort();
  }
  at::Tensor t = torch::from_blob(buf, {static_cast<int64_t>(sizeof(buf))}, torch::kByte).clone();
  world.broadcast(t, 0);
  return std::string(reinterpret_cast<const char*>(t.data_ptr<uint8_t>()));
}

}  // namespace state_dtype_fixture
