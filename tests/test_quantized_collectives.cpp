// ZeRO++'s quantized collectives (comm/quantized_collectives.h) against the unquantized ones,
// element by element, within the bounds derived in comm/quantize.h. Each bound check has a
// negative control that must fail it: the same payload with its scales made 10% larger.
// Run under mpirun with 1, 2 and 4 ranks.
#include <atomic>
#include <chrono>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <thread>

#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "shardgan/comm/mpi_communicator.h"
#include "shardgan/comm/quantized_collectives.h"

// The gtest files compile together in batches (tests/CMakeLists.txt): this file's names
// live in a namespace of its own.
namespace SHARDGAN_UNITY_ID {

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

// Non-finite input (NaN, +Inf, -Inf in some blocks, each block its own case): the codes are
// defined values (0 in a block with a non-finite element, within [-q_max, q_max] elsewhere),
// the padding between the codes and the scales is zero, and the dequantized values are
// non-finite in exactly the blocks whose input was. The payload starts as 0xAB bytes, so that
// an unwritten byte shows.
TEST_P(QuantizeBlocks, NonFiniteInputGivesDefinedCodesZeroPaddingAndNonFiniteBlocks) {
  const QuantSpec q{GetParam(), 8};
  const float inf = std::numeric_limits<float>::infinity();
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), inf, -inf}) {
    for (int64_t n : {5, 37, 64}) {
      at::Tensor x = sample(n, 11 + n);
      x[3] = bad;                 // block 0
      if (n > 20) x[20] = bad;    // block 2
      if (n > 60) x[60] = -bad;   // block 7: the other sign (NaN stays NaN)
      const std::string what = "n " + std::to_string(n) + " bits " + std::to_string(q.bits) + " input " +
                               std::to_string(bad);
      at::Tensor payload = torch::full({quantized_bytes(n, q)}, 0xAB, torch::kByte), y = torch::empty({n});
      quantize_blocks(x, q, payload);
      const int64_t raw = q.bits == 8 ? n : (n + 1) / 2, cb = (raw + 3) / 4 * 4;
      EXPECT_TRUE(payload.narrow(0, raw, cb - raw).eq(0).all().item<bool>()) << "padding not zero, " << what;
      // The codes as integers, one per element (int4: sign-extended nibbles, low first).
      at::Tensor codes;
      if (q.bits == 8) {
        codes = payload.narrow(0, 0, n).view(at::kChar).to(at::kInt);
      } else {
        at::Tensor b = payload.narrow(0, 0, raw).to(at::kInt);
        at::Tensor nib = at::stack({b.bitwise_and(0xF), b.bitwise_right_shift(4)}, 1).view({-1});
        codes = nib - nib.ge(8).to(at::kInt) * 16;
        if (n % 2 == 1) {
          EXPECT_EQ(codes[n].item<int>(), 0) << "the unused last nibble, " << what;
        }
        codes = codes.narrow(0, 0, n);
      }
      EXPECT_TRUE(codes.abs().le(q.qmax()).all().item<bool>()) << "a code outside [-q_max, q_max], " << what;
      const at::Tensor finite = torch::isfinite(x);
      // Per element: does its block hold only finite inputs?
      const at::Tensor block_finite =
          block_absmax((~finite).to(at::kFloat), q.block).eq(0);
      EXPECT_TRUE(codes.masked_select(~block_finite).eq(0).all().item<bool>()) << "codes of a non-finite block, " << what;
      dequantize_blocks(payload, q, y);
      EXPECT_TRUE(torch::equal(torch::isfinite(y), block_finite)) << "non-finite blocks differ, " << what;
      // The finite blocks are still within half a scale.
      const at::Tensor xf = x.masked_select(block_finite), yf = y.masked_select(block_finite);
      const at::Tensor bound = block_absmax(x.masked_fill(~block_finite, 0), q.block).masked_select(block_finite) /
                                   (2.0 * q.qmax()) + fp32_slack(xf.abs());
      EXPECT_TRUE(((yf - xf).abs() <= bound).all().item<bool>()) << what;
    }
  }
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

// ---- the error path: a collective abandoned in flight ----------------------------------------

// Wraps LibTorch's CPU allocator for its lifetime and counts the bytes alive that it handed
// out, so that a test can see whether a buffer was freed.
class CountingCpuAllocator final : public c10::Allocator {
 public:
  CountingCpuAllocator() : inner_(c10::GetCPUAllocator()) { c10::SetCPUAllocator(this, 255); }
  ~CountingCpuAllocator() override { c10::SetCPUAllocator(inner_, 255); }
  CountingCpuAllocator(const CountingCpuAllocator&) = delete;
  CountingCpuAllocator& operator=(const CountingCpuAllocator&) = delete;
  c10::DataPtr allocate(size_t n) override {
    auto* b = new Block{inner_->allocate(n), n};
    live_ += static_cast<int64_t>(n);
    return c10::DataPtr(b->inner.get(), b, &CountingCpuAllocator::release, c10::Device(c10::kCPU));
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }
  int64_t live() const { return live_.load(); }

 private:
  struct Block {
    c10::DataPtr inner;
    size_t bytes;
  };
  static void release(void* p) {
    auto* b = static_cast<Block*>(p);
    live_ -= static_cast<int64_t>(b->bytes);
    delete b;
  }
  c10::Allocator* inner_;
  static std::atomic<int64_t> live_;  // static: a block may be freed after the allocator is gone
};
std::atomic<int64_t> CountingCpuAllocator::live_{0};

// An exception unwinds past a quantized collective's Work before wait(): its MPI requests
// stay in flight (the job is ending), so the send and receive buffers they use must stay
// allocated, not be freed under them.
TEST(QuantizedErrorPath, UnwindingKeepsTheInFlightBuffers) {
  MpiCommunicator comm{MPI_COMM_WORLD, 60.0};
  const int n = comm.world_size(), r = comm.rank();
  const QuantSpec q{8, 64};
  const int64_t s = 1000, pb = quantized_bytes(s, q);
  at::Tensor shard = sample(s, 400 + r), full = sample(s * n, 450 + r), out = torch::empty({s});
  CountingCpuAllocator counting;
  for (const char* op : {"all_gather", "reduce_scatter"}) {
    const int64_t before = counting.live();
    int64_t during = 0;
    try {
      std::unique_ptr<Work> w = std::string(op) == "all_gather" ? quantized_all_gather_async(comm, full, shard, q)
                                                                : quantized_reduce_scatter_async(comm, out, full, q);
      during = counting.live();
      throw std::runtime_error("an error while the collective is in flight");
    } catch (const std::runtime_error&) {
    }
    const int64_t buffers = pb * (n + (std::string(op) == "all_gather" ? 1 : n));  // send + receive
    EXPECT_GE(during - before, buffers) << op;
    EXPECT_GE(counting.live() - before, buffers) << op << ": buffers freed under in-flight requests";
  }
  comm.barrier();  // the abandoned collectives progress here and complete
}

// Rank 0's wait times out (its peers join a second later): the requests are still in flight
// when the Work goes, so its buffers must stay, the half-received exchange must not be
// dequantized into `full` (the Work's destruction leaves it as it was), and the peers'
// collective must still complete (rank 0 keeps progressing the abandoned requests inside its
// next collective).
TEST(QuantizedErrorPath, TimeoutKeepsTheInFlightBuffers) {
  MpiCommunicator world{MPI_COMM_WORLD, 60.0};
  const int n = world.world_size(), r = world.rank();
  if (n < 2) {
    std::printf("TimeoutKeepsTheInFlightBuffers needs a peer; nothing to check on 1 rank\n");
    return;
  }
  MpiCommunicator comm{MPI_COMM_WORLD, r == 0 ? 0.2 : 60.0};
  const QuantSpec q{8, 64};
  const int64_t s = 1000, pb = quantized_bytes(s, q);
  at::Tensor shard = sample(s, 500 + r), full = torch::empty({s * n});
  CountingCpuAllocator counting;
  world.barrier();
  if (r == 0) {
    const int64_t before = counting.live();
    full.fill_(7);
    std::unique_ptr<Work> w = quantized_all_gather_async(comm, full, shard, q);
    EXPECT_THROW(w->wait(), CollectiveTimeout);
    w.reset();
    EXPECT_GE(counting.live() - before, pb * (n + 1)) << "buffers freed under in-flight requests";
    EXPECT_TRUE(full.eq(7).all().item<bool>()) << "an unfinished exchange was dequantized into full";
  } else {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    quantized_all_gather_async(comm, full, shard, q)->wait();
  }
  world.barrier();
}

}  // namespace

}  // namespace SHARDGAN_UNITY_ID
