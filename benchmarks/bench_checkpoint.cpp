// Checkpoint save and load throughput against the disk's sequential bandwidth, measured in
// the same run dd-style (write + fsync of the same number of bytes in 4 MiB blocks; read
// back after evicting the file from the page cache). Also the training stall per save of
// the demo's DCGAN. Prints one JSON object.
//
//   [mpirun -np N] bench_checkpoint [--dir /tmp] [--units 4] [--width 4096] [--reps 3]
//
// Every rank writes its own file; bandwidth is total bytes over wall time. Load is
// measured cold (files evicted with posix_fadvise(DONTNEED) after their fsync), at the same
// world size (each rank reads its own shards).
#include <fcntl.h>
#include <mpi.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "shardgan/checkpoint/checkpoint.h"
#include "shardgan/comm/mpi_communicator.h"
#include "shardgan/optim/sharded_adam.h"
#include "shardgan/sharding/sharded_model.h"
#include "shardgan/train/trainer.h"
#include "registry.h"

// This file's names live in a namespace of their own (benchmarks/registry.h).
namespace SHARDGAN_UNITY_ID {

using namespace shardgan;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

void evict(const std::string& path) {  // drop a (clean, fsynced) file from the page cache
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

void evict_tree(const std::string& dir) {
  for (auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_regular_file()) evict(e.path().string());
  }
}

// dd-style: write `bytes` in 4 MiB blocks and fsync; then read them back cold.
std::pair<double, double> dd(const std::string& path, int64_t bytes) {
  std::vector<char> block(4 << 20, 'x');
  auto t0 = Clock::now();
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  for (int64_t done = 0; done < bytes; done += static_cast<int64_t>(block.size())) {
    const size_t n = static_cast<size_t>(std::min<int64_t>(static_cast<int64_t>(block.size()), bytes - done));
    if (::write(fd, block.data(), n) != static_cast<ssize_t>(n)) std::abort();
  }
  ::fsync(fd);
  ::close(fd);
  const double w = since(t0);
  evict(path);
  t0 = Clock::now();
  fd = ::open(path.c_str(), O_RDONLY);
  while (::read(fd, block.data(), block.size()) > 0) {
  }
  ::close(fd);
  const double r = since(t0);
  ::unlink(path.c_str());
  return {w, r};
}

double max_over_ranks(double v) {
  double out = 0;
  MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return out;
}

std::unique_ptr<ShardedModel> linear_model(Communicator& comm, int stage, int units, int64_t width) {
  torch::manual_seed(1);
  ShardingConfig sc;
  sc.stage = stage;
  auto m = std::make_unique<ShardedModel>("generator", comm, sc);
  for (int i = 0; i < units; ++i) {
    auto lin = std::make_shared<torch::nn::LinearImpl>(width, width);
    m->add_unit("block" + std::to_string(i), lin, [lin](const at::Tensor& x) { return lin->forward(x); });
  }
  return m;
}

}  // namespace

int bench_main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  std::string dir = "/tmp";
  int units = 4, reps = 3;
  int64_t width = 4096;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--dir") dir = v;
    else if (k == "--units") units = std::stoi(v);
    else if (k == "--width") width = std::stoll(v);
    else if (k == "--reps") reps = std::stoi(v);
  }
  torch::set_num_threads(1);
  MpiCommunicator comm(MPI_COMM_WORLD);
  const int rank = comm.rank(), world = comm.world_size();
  char tmpl[512];
  std::snprintf(tmpl, sizeof(tmpl), "%s/bench-ckpt.XXXXXX", dir.c_str());
  if (rank == 0 && !mkdtemp(tmpl)) std::abort();
  MPI_Bcast(tmpl, sizeof(tmpl), MPI_CHAR, 0, MPI_COMM_WORLD);
  const std::string base = tmpl;

  // Sharded model + Adam (3 float32 states per parameter on disk).
  auto model = linear_model(comm, world > 1 ? 3 : 0, units, width);
  ShardedAdam adam(*model, AdamConfig{});
  for (auto& u : model->units()) {
    u->shard().normal_();
    adam.exp_avg()[&u - &model->units()[0]].normal_();
    adam.exp_avg_sq()[&u - &model->units()[0]].uniform_();
  }
  TrainCounters counters;
  counters.noise_rng_state = at::detail::createCPUGenerator(3).get_state();
  std::vector<ModelAndOptimizer> mo = {{model.get(), &adam}};

  nlohmann::json runs = nlohmann::json::array();
  double best_save_bw = 0, best_load_bw = 0, best_dd_w = 0, best_dd_r = 0;
  std::vector<double> save_ratio, load_ratio;  // per repetition: the disk varies a lot
  int64_t ckpt_bytes = 0;
  for (int rep = 0; rep < reps; ++rep) {
    counters.step = rep + 1;
    SaveStats st;
    comm.barrier();
    auto t0 = Clock::now();
    const std::string ck = save_checkpoint(base + "/run", counters, mo, "bench", comm, 1, &st);
    const double save_s = max_over_ranks(since(t0));
    int64_t bytes = 0;
    if (rank == 0) {
      for (auto& e : fs::directory_iterator(ck)) bytes += static_cast<int64_t>(fs::file_size(e.path()));
      evict_tree(ck);
    }
    MPI_Bcast(&bytes, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
    ckpt_bytes = bytes;
    // The save deletes the previous checkpoint in the background; a resume (a new process)
    // never overlaps with that, so let it finish before the load is timed.
    wait_for_checkpoint_cleanup();
    comm.barrier();
    TrainCounters back;
    t0 = Clock::now();
    load_checkpoint(ck, back, mo, comm);
    const double load_s = max_over_ranks(since(t0));
    // The disk, dd-style, with the same bytes per rank, all ranks at once.
    comm.barrier();
    const int64_t per_rank = bytes / world;
    auto [ddw, ddr] = dd(base + "/dd-" + std::to_string(rank), per_rank);
    const double dd_w = max_over_ranks(ddw), dd_r = max_over_ranks(ddr);
    const double mb = bytes / 1e6;
    runs.push_back({{"save_s", save_s}, {"save_write_fsync_s", max_over_ranks(st.write_s)}, {"load_s", load_s}, {"dd_write_s", dd_w}, {"dd_read_s", dd_r},
                    {"save_MBps", mb / save_s}, {"load_MBps", mb / load_s},
                    {"dd_write_MBps", per_rank * world / 1e6 / dd_w}, {"dd_read_MBps", per_rank * world / 1e6 / dd_r}});
    save_ratio.push_back((mb / save_s) / (per_rank * world / 1e6 / dd_w));
    load_ratio.push_back((mb / load_s) / (per_rank * world / 1e6 / dd_r));
    best_save_bw = std::max(best_save_bw, mb / save_s);
    best_load_bw = std::max(best_load_bw, mb / load_s);
    best_dd_w = std::max(best_dd_w, per_rank * world / 1e6 / dd_w);
    best_dd_r = std::max(best_dd_r, per_rank * world / 1e6 / dd_r);
  }

  // The demo's DCGAN (default widths, float32, synthetic data): stall per save.
  TrainConfig cfg = parse_config("data: {source: synthetic, synthetic_size: 128}\ntrain: {global_batch: 64}\n",
                                 "bench", {});
  cfg.run_dir = base + "/dcgan";
  std::vector<double> stalls;
  {
    Trainer t(cfg, comm);
    for (int i = 0; i < 5; ++i) {
      t.train_step();  // a new step each time, as in training (keep_checkpoints 3 prunes)
      auto t0 = Clock::now();
      t.save();
      stalls.push_back(max_over_ranks(since(t0)));
    }
  }
  std::sort(stalls.begin(), stalls.end());
  std::sort(save_ratio.begin(), save_ratio.end());
  std::sort(load_ratio.begin(), load_ratio.end());
  if (rank == 0) {
    int64_t n = 0;
    for (auto& u : model->units()) n += u->numel();
    nlohmann::json out = {
        {"benchmark", "checkpoint"},
        {"world_size", world},
        {"dir", dir},
        {"model_params", n},
        {"checkpoint_bytes", ckpt_bytes},
        {"runs", runs},
        {"best_save_MBps", best_save_bw},
        {"best_load_MBps", best_load_bw},
        {"best_dd_write_MBps", best_dd_w},
        {"best_dd_read_MBps", best_dd_r},
        {"save_vs_dd_write_best", best_save_bw / best_dd_w},
        {"load_vs_dd_read_best", best_load_bw / best_dd_r},
        {"save_vs_dd_write_median", save_ratio[save_ratio.size() / 2]},
        {"load_vs_dd_read_median", load_ratio[load_ratio.size() / 2]},
        {"dcgan_save_stall_s_median", stalls[stalls.size() / 2]},
        {"dcgan_save_stall_s_all", stalls},
    };
    std::printf("%s\n", out.dump(2).c_str());
    fs::remove_all(base);
  }
  MPI_Finalize();
  return 0;
}

}  // namespace SHARDGAN_UNITY_ID

SHARDGAN_BENCHMARK(bench_checkpoint)
