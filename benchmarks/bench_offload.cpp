// Offloaded Adam throughput against this disk's sequential O_DIRECT bandwidth, measured in
// the same run with dd (oflag=direct / iflag=direct, the same bytes in buffer-sized blocks),
// and the optimizer step of the same model with its state in memory (ShardedAdam, the
// baseline) and in the cpu tier. Prints one JSON object.
//
//   bench_offload [--path DIR] [--state-gib 4] [--buffer-mib 64] [--count 4] [--steps 3]
//                 [--in-memory 1]
//
// One rank, one unit of state-gib / 8 float32 parameters, so Adam's exp_avg + exp_avg_sq
// are state-gib GiB. A disk step reads and writes every byte of that state once:
//   fraction_of_disk_bandwidth = (bytes_read / dd_read_Bps + bytes_written / dd_write_Bps) / step_s,
// the share of the time dd needs to move the same bytes that the step took (1.0: the step
// runs at the disk's sequential speed). --in-memory 0 skips the baselines that hold the
// state in RAM (for a state larger than memory).
#include <mpi.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "shardgan/comm/mpi_communicator.h"
#include "shardgan/offload/direct_file.h"
#include "shardgan/offload/host_memory.h"
#include "shardgan/offload/state_store.h"
#include "shardgan/optim/offloaded_adam.h"
#include "shardgan/optim/sharded_adam.h"
#include "shardgan/sharding/sharded_model.h"
#include "registry.h"

// This file's names live in a namespace of their own (benchmarks/registry.h).
namespace SHARDGAN_UNITY_ID {

using namespace shardgan;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Runs dd and returns bytes per second from its own byte count and elapsed time.
double dd_bps(const std::string& args) {
  const std::string cmd = "dd " + args + " 2>&1";
  FILE* f = ::popen(cmd.c_str(), "r");
  if (!f) return 0;
  char line[512];
  double bytes = 0, secs = 0;
  while (std::fgets(line, sizeof line, f)) {
    // "4294967296 bytes (4.3 GB, 4.0 GiB) copied, 9.25 s, 464 MB/s"
    const char* c = std::strstr(line, "copied, ");
    double b;
    if (c && std::sscanf(line, "%lf bytes", &b) == 1) {
      bytes = b;
      secs = std::atof(c + 8);
    }
  }
  ::pclose(f);
  return secs > 0 ? bytes / secs : 0;
}

// The disk with the tier's own I/O pattern and no compute: `bytes` written, then read, in
// `block`-byte O_DIRECT requests, `depth` in flight (io_uring). Returns {write, read} B/s.
std::pair<double, double> uring_bps(const std::string& path, int64_t bytes, int64_t block, int64_t depth) {
  DirectFile f(path, bytes, static_cast<int>(depth));
  void* buf = host_alloc(block * depth);
  double out[2];
  for (int write = 1; write >= 0; --write) {
    std::vector<uint64_t> tickets(depth, 0);
    const auto t0 = Clock::now();
    int64_t k = 0;
    for (int64_t off = 0; off < bytes; off += block, ++k) {
      const int64_t slot = k % depth;
      if (tickets[slot]) f.wait(tickets[slot]);
      char* b = static_cast<char*>(buf) + slot * block;
      const int64_t n = std::min(block, bytes - off);
      tickets[slot] = write ? f.submit_write(off, b, n) : f.submit_read(off, b, n);
    }
    f.wait_all();
    out[write] = static_cast<double>(bytes) / since(t0);
  }
  host_free(buf);
  return {out[1], out[0]};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int64_t vm_hwm() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<int64_t>(u.ru_maxrss) * 1024;
}

}  // namespace

int bench_main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  spdlog::set_level(spdlog::level::warn);  // stdout carries only the JSON object
  std::string path = "/tmp";
  double state_gib = 4;
  int64_t buffer_mib = 64, count = 4, steps = 3, in_memory = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--path") path = v;
    else if (k == "--state-gib") state_gib = std::stod(v);
    else if (k == "--buffer-mib") buffer_mib = std::stoll(v);
    else if (k == "--count") count = std::stoll(v);
    else if (k == "--steps") steps = std::stoll(v);
    else if (k == "--in-memory") in_memory = std::stoll(v);
  }
  MpiCommunicator self(MPI_COMM_SELF, 3600.0);
  const int64_t cols = 32768;
  const int64_t numel = static_cast<int64_t>(state_gib * 1073741824.0 / 8) / cols * cols;
  torch::manual_seed(1);
  auto lin = torch::nn::Linear(torch::nn::LinearOptions(cols, numel / cols).bias(false));
  ShardingConfig sc;
  sc.stage = 0;  // one rank: the shard is the parameter itself
  ShardedModel model("generator", self, sc);
  ShardedUnit& unit = model.add_unit("w", lin.ptr(), [lin](const at::Tensor& x) mutable { return lin->forward(x); });
  unit.grad_shard().normal_(0, 1e-3);
  const at::Tensor start = in_memory ? unit.shard().clone() : at::Tensor();
  const double state_bytes = 8.0 * numel;
  nlohmann::json j = {{"benchmark", "offload"}, {"state_bytes", state_bytes}, {"parameters", numel},
                      {"buffer_bytes", buffer_mib << 20}, {"buffer_count", count}, {"path", path}};

  auto time_steps = [&](ShardedOptimizer& opt) {
    std::vector<double> t;
    opt.step();  // warm-up (first touch of the state)
    for (int64_t s = 0; s < steps; ++s) {
      const auto t0 = Clock::now();
      opt.step();
      t.push_back(since(t0));
    }
    return median(t);
  };
  AdamConfig adam{1e-4, 0.0, 0.999, 1e-8};
  at::Tensor in_memory_result;
  if (in_memory) {
    ShardedAdam opt(model, adam);
    j["in_memory_step_s"] = time_steps(opt);
    in_memory_result = unit.shard().clone();
    unit.shard().copy_(start);
  }
  if (in_memory) {
    OffloadConfig oc;
    oc.optimizer = OffloadDevice::kCpu;
    oc.buffer_bytes = buffer_mib << 20;
    oc.buffer_count = count;
    OffloadedAdam opt(model, adam, oc);
    j["cpu_tier_step_s"] = time_steps(opt);
    j["cpu_tier_equals_in_memory"] = torch::equal(unit.shard(), in_memory_result);
    unit.shard().copy_(start);
  }
  {
    OffloadConfig oc;
    oc.optimizer = OffloadDevice::kDisk;
    oc.path = path;
    oc.buffer_bytes = buffer_mib << 20;
    oc.buffer_count = count;
    OffloadedAdam opt(model, adam, oc);
    const int64_t r0 = opt.store().bytes_read(), w0 = opt.store().bytes_written();
    std::vector<double> t, io, compute;
    opt.step();
    const int64_t r1 = opt.store().bytes_read(), w1 = opt.store().bytes_written();
    for (int64_t s = 0; s < steps; ++s) {
      const auto t0 = Clock::now();
      opt.step();
      t.push_back(since(t0));
      io.push_back(opt.last_step_io_s());
      compute.push_back(opt.last_step_compute_s());
    }
    const double step_s = median(t);
    const double read = static_cast<double>(r1 - r0), written = static_cast<double>(w1 - w0);
    j["disk_step_s"] = step_s;
    j["disk_step_io_and_copy_s"] = median(io);
    j["disk_step_kernel_s"] = median(compute);
    j["bytes_read_per_step"] = read;
    j["bytes_written_per_step"] = written;
    j["streamed_GBps"] = (read + written) / step_s / 1e9;
    j["ring_bytes"] = opt.state_bytes();
    j["o_direct"] = opt.store().direct();
    if (in_memory) j["disk_tier_equals_in_memory"] = torch::equal(unit.shard(), in_memory_result);
    // dd on the same folder, the same bytes, buffer-sized blocks, O_DIRECT both ways.
    const std::string tmp = (fs::path(path) / "bench_offload_dd.tmp").string();
    const int64_t blocks = static_cast<int64_t>(state_bytes) / (buffer_mib << 20);
    const std::string bs = "bs=" + std::to_string(buffer_mib) + "M count=" + std::to_string(blocks);
    const double wbps = dd_bps("if=/dev/zero of=" + tmp + " " + bs + " oflag=direct conv=fsync");
    const double rbps = dd_bps("if=" + tmp + " of=/dev/null " + bs + " iflag=direct");
    fs::remove(tmp);
    j["dd_write_GBps"] = wbps / 1e9;
    j["dd_read_GBps"] = rbps / 1e9;
    j["dd_time_for_step_bytes_s"] = read / rbps + written / wbps;
    j["fraction_of_dd_bandwidth"] = (read / rbps + written / wbps) / step_s;
    // The same disk driven like the tier drives it (16 MiB requests, 8 in flight), which
    // is faster than dd's one request at a time on this virtual disk.
    const int64_t block = (buffer_mib << 20) / 4;
    auto [uw, ur] = uring_bps(tmp, static_cast<int64_t>(state_bytes) / block * block, block, 8);
    j["uring_write_GBps"] = uw / 1e9;
    j["uring_read_GBps"] = ur / 1e9;
    const double best_w = std::max(wbps, uw), best_r = std::max(rbps, ur);
    j["disk_time_for_step_bytes_s"] = read / best_r + written / best_w;
    // Against the faster of dd and the io_uring pass, per direction.
    j["fraction_of_disk_bandwidth"] = (read / best_r + written / best_w) / step_s;
  }
  j["vm_hwm_bytes"] = vm_hwm();
  std::printf("%s\n", j.dump().c_str());
  MPI_Finalize();
  return 0;
}

}  // namespace SHARDGAN_UNITY_ID

SHARDGAN_BENCHMARK(bench_offload)
