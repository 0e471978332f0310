// ZeRO++'s quantized collectives (comm/quantized_collectives.h) against the unquantized ones,
// element by element, within the bounds derived in comm/quantize.h. Each bound check has a
// negative control that must fail it: the same payload with its scales made 10% larger.
// Run under mpirun with 1, 2 and 4 ranks.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "shardgan/comm/mpi_communicator.h"
#include "shardgan/comm/quantized_collectives.h"

using namespace shardgan;

namespace {

// Gradient-like data: mostly small values with a few large ones per block (the case block
// scales are for), the last block of each rank's part shorter than the others.
at::Tensor sample(int64_t n, int64_t seed) {
  at::Generator g = at::detail::createCPUGenerator(seed);
  at::Tensor x = torch::randn({n}, g, torch::kFloat) * 1e-3;
  at::Tensor big = torch::rand({n}, g, torch::kFloat) < 0.01;
  return torch::where(big, x * 1000, x);
}

// max|x| over the block (of `block` elements, counted from the start of x) holding each element.
at::Tensor block_absmax(const at::Tensor& x, int64_t block) {
  const int64_t n = x.numel(), nb = (n + block - 1) / block;
  at::Tensor p = at::constant_pad_nd(x.abs(), {0, nb * block - n}, 0).view({nb, block});
  return p.amax(1, true).expand({nb, block}).reshape({-1}).narrow(0, 0, n);
}

// Float32 rounding of a value of magnitude m, generously: 4 ulps.
at::Tensor fp32_slack(const at::Tensor& m) { return m * 4 * std::numeric_limits<float>::epsilon() + 1e-30; }

// Scales the float32 scales of a payload of n elements by `factor` (the broken-scale control).
void corrupt_scales(at::Tensor payload, int64_t n, const QuantSpec& q, double factor) {
  const int64_t nb = (n + q.block - 1) / q.block;
  payload.narrow(0, payload.numel() - 4 * nb, 4 * nb).view(at::kFloat).mul_(factor);
}

class QuantizeBlocks : public ::testing::TestWithParam<int> {};

TEST_P(QuantizeBlocks, RoundTripWithinHalfAScale) {
  const QuantSpec q{GetParam(), 64};
  for (int64_t n : {1, 63, 64, 65, 1000, 4097}) {
    at::Tensor x = sample(n, 7 + n);
    at::Tensor payload = torch::empty({quantized_bytes(n, q)}, torch::kByte), y = torch::empty({n});
    quantize_blocks(x, q, payload);
    dequantize_blocks(payload, q, y);
    const at::Tensor bound = block_absmax(x, q.block) / (2.0 * q.qmax()) + fp32_slack(x.abs());
    EXPECT_TRUE(((y - x).abs() <= bound).all().item<bool>()) << "n " << n << " bits " << q.bits;
    corrupt_scales(payload, n, q, 1.1);
    dequantize_blocks(payload, q, y);
    EXPECT_FALSE(((y - x).abs() <= bound).all().item<bool>()) << "broken scales passed, n " << n;
  }
}

// The bound is tight: on uniform data some element comes within 10% of it.
TEST_P(QuantizeBlocks, BoundIsTight) {
  const QuantSpec q{GetParam(), 64};
  at::Generator g = at::detail::createCPUGenerator(3);
  at::Tensor x = torch::rand({4096}, g, torch::kFloat) * 2 - 1;
  at::Tensor payload = torch::empty({quantized_bytes(4096, q)}, torch::kByte), y = torch::empty({4096});
  quantize_blocks(x, q, payload);
  dequantize_blocks(payload, q, y);
  const at::Tensor bound = block_absmax(x, q.block) / (2.0 * q.qmax());
  EXPECT_GT(((y - x).abs() / bound).max().item<double>(), 0.9);
}

TEST_P(QuantizeBlocks, ZerosNonFiniteAndAccumulate) {
  const QuantSpec q{GetParam(), 8};
  at::Tensor x = torch::zeros({20});
  x[13] = std::numeric_limits<float>::infinity();
  at::Tensor payload = torch::empty({quantized_bytes(20, q)}, torch::kByte), y = torch::ones({20});
  quantize_blocks(x, q, payload);
  dequantize_blocks(payload, q, y, /*accumulate=*/true);
  EXPECT_TRUE(torch::equal(y.narrow(0, 0, 8), torch::ones({8})));  // an all-zero block adds 0
  EXPECT_FALSE(torch::isfinite(y.narrow(0, 8, 8)).all().item<bool>());  // Inf stays non-finite
  EXPECT_THROW(quantize_blocks(x, q, torch::empty({3}, torch::kByte)), std::invalid_argument);
  EXPECT_EQ(parse_quant_bits("int4"), 4);
  EXPECT_THROW(parse_quant_bits("int2"), std::invalid_argument);
}

INSTANTIATE_TEST_SUITE_P(Bits, QuantizeBlocks, ::testing::Values(8, 4));

class QuantizedCollectives : public ::testing::TestWithParam<int> {
 protected:
  MpiCommunicator comm{MPI_COMM_WORLD, 60.0};
  int n = comm.world_size(), r = comm.rank();
};

TEST(QuantizedAllGather, WithinBoundAndIdenticalOnEveryRank) {  // qwZ is int8 only
  MpiCommunicator comm{MPI_COMM_WORLD, 60.0};
  const int n = comm.world_size(), r = comm.rank();
  const QuantSpec q{8, 128};
  const int64_t s = 1000;
  at::Tensor shard = sample(s, 100 + r), exact = torch::empty({s * n}), full = torch::empty({s * n});
  comm.all_gather(exact, shard);
  quantized_all_gather_async(comm, full, shard, q)->wait();
  at::Tensor bound = torch::empty({s * n});
  for (int p = 0; p < n; ++p) {
    at::Tensor e = exact.narrow(0, p * s, s);
    bound.narrow(0, p * s, s).copy_(block_absmax(e, q.block) / 254.0 + fp32_slack(e.abs()));
  }
  EXPECT_TRUE(((full - exact).abs() <= bound).all().item<bool>());
  // Every rank computes with the same values: rank 0's result, broadcast, equals this one.
  at::Tensor r0 = full.clone();
  comm.broadcast(r0, 0);
  EXPECT_TRUE(torch::equal(r0, full));
  EXPECT_EQ(comm.stats().all_gather_bytes, 4 * s * n + quantized_bytes(s, q) * n);
}

TEST_P(QuantizedCollectives, ReduceScatterWithinDerivedBound) {
  const QuantSpec q{GetParam(), 64};
  const int64_t s = 777;  // blocks of 64 do not divide it: a short last block
  at::Tensor full = sample(s * n, 200 + r);
  at::Tensor exact = torch::empty({s}, torch::kDouble), out = torch::empty({s});
  {  // The reference: float64 reduce-scatter of the same data.
    at::Tensor f64 = full.to(at::kDouble);
    comm.reduce_scatter(exact, f64, ReduceOp::kAvg);
  }
  comm.reset_stats();
  quantized_reduce_scatter_async(comm, out, full, q)->wait();
  EXPECT_EQ(comm.stats().all_to_all_bytes, quantized_bytes(s, q) * n);
  // The bound needs every rank's blocks of this rank's part: gather them.
  at::Tensor every = torch::empty({s * n * n});
  comm.all_gather(every, full);
  at::Tensor bound = torch::zeros({s}, torch::kDouble), mag = torch::zeros({s}, torch::kDouble);
  for (int p = 0; p < n; ++p) {
    at::Tensor part = every.narrow(0, p * s * n + r * s, s);
    bound += block_absmax(part, q.block).to(at::kDouble) / (2.0 * q.qmax() * n);
    mag += part.abs().to(at::kDouble);
  }
  bound += mag * n * std::numeric_limits<float>::epsilon() + 1e-30;  // float32 sum of N terms
  at::Tensor err = (out.to(at::kDouble) - exact).abs();
  EXPECT_TRUE((err <= bound).all().item<bool>()) << "max err/bound " << (err / bound).max().item<double>();
  // Negative control: the same exchange with this rank's scales 10% too large must exceed it.
  // (Dequantized locally from this rank's own payloads, so every rank checks its own.)
  at::Tensor payload = torch::empty({quantized_bytes(s, q)}, torch::kByte), y = torch::zeros({s});
  for (int p = 0; p < n; ++p) {
    at::Tensor part = every.narrow(0, p * s * n + r * s, s).contiguous();
    quantize_blocks(part, q, payload);
    corrupt_scales(payload, s, q, 1.1);
    dequantize_blocks(payload, q, y, /*accumulate=*/true);
  }
  y.div_(n);
  EXPECT_FALSE(((y.to(at::kDouble) - exact).abs() <= bound).all().item<bool>()) << "broken scales passed";
}

TEST_P(QuantizedCollectives, FewerBytesThanTheUnquantizedCollectives) {
  const QuantSpec q{GetParam(), 256};
  const int64_t s = 4096;
  // Payload per element against float32 (4 bytes) and bfloat16 (2 bytes).
  const double per_elem = static_cast<double>(quantized_bytes(s, q)) / s;
  EXPECT_LT(per_elem, GetParam() == 8 ? 1.02 : 0.52);
  EXPECT_GE(2.0 / per_elem, GetParam() == 8 ? 1.96 : 3.8);
}

// HSDP's cross-replica average: quantized reduce-scatter, float32 sum, int8 all-gather.
TEST_P(QuantizedCollectives, AllReduceAvgWithinBoundAndIdenticalOnEveryRank) {
  const QuantSpec q{GetParam(), 64};
  const int64_t len = 1001;  // not a multiple of the world size: padded inside
  at::Tensor t = sample(len, 300 + r), exact = t.to(at::kDouble);
  comm.all_reduce(exact, ReduceOp::kAvg);
  at::Tensor every = torch::empty({len * n});
  comm.all_gather(every, t);
  quantized_all_reduce_avg(comm, t, q);
  // The reduce-scatter's bound on each element (blocks of the padded per-rank parts), then
  // the int8 re-quantization of the average (blocks of the same parts of the result).
  const int64_t s = (len + n - 1) / n;
  at::Tensor bound = torch::zeros({s * n}, torch::kDouble), mag = torch::zeros({s * n}, torch::kDouble);
  for (int p = 0; p < n; ++p) {
    at::Tensor x = at::constant_pad_nd(every.narrow(0, p * len, len), {0, s * n - len}, 0);
    for (int b = 0; b < n; ++b) {
      bound.narrow(0, b * s, s) += block_absmax(x.narrow(0, b * s, s).contiguous(), q.block).to(at::kDouble) /
                                   (2.0 * q.qmax() * n);
    }
    mag += x.abs().to(at::kDouble);
  }
  at::Tensor avg = at::constant_pad_nd(exact, {0, s * n - len}, 0);
  for (int b = 0; b < n; ++b) {
    bound.narrow(0, b * s, s) += block_absmax(avg.narrow(0, b * s, s).contiguous(), q.block) * (1.0 / 254 * 1.01);
  }
  bound += mag * n * std::numeric_limits<float>::epsilon() + 1e-30;
  bound = bound.narrow(0, 0, len);
  at::Tensor err = (t.to(at::kDouble) - exact).abs();
  EXPECT_TRUE((err <= bound).all().item<bool>()) << "max err/bound " << (err / bound).max().item<double>();
  EXPECT_FALSE((err <= bound / 10).all().item<bool>()) << "the bound is ten times too loose";
  at::Tensor r0 = t.clone();
  comm.broadcast(r0, 0);
  EXPECT_TRUE(torch::equal(r0, t));
}

INSTANTIATE_TEST_SUITE_P(Bits, QuantizedCollectives, ::testing::Values(8, 4));

}  // namespace
