// data.source hdf5: images per second the loader (Hdf5Dataset + Hdf5Loader's prefetch
// thread + the DistributedSampler) delivers per rank, and peak RSS while reading through a
// file much larger than the queue. Prints one JSON object (rank 0).
//
//   mpirun -np 2 bench_loader [--dir /tmp] [--gb 2.5] [--chw 3x64x64] [--global-batch 64]
//                             [--queue 4] [--chunk 256] [--warm-batches 400] [--keep 0]
//
// Rank 0 writes a synthetic file of about --gb GB (uint8 images, labels i % 10) with
// shardgan-data's writer, fsyncs it and evicts it from the page cache
// (posix_fadvise(DONTNEED); the JSON says how much of it was still cached, from mincore).
// Then every rank reads its part of every global batch of one whole epoch through the
// loader ("cold": from the disk), then --warm-batches more batches of epoch 1 ("warm": the
// file is in the page cache by then). VmHWM (peak RSS) is read from /proc/self/status
// before and after the cold pass: it must not grow with the file.
#include <fcntl.h>
#include <mpi.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "shardgan/data/convert.h"
#include "shardgan/data/hdf5_dataset.h"
#include "shardgan/data/hdf5_loader.h"
#include "shardgan/data/images.h"
#include "registry.h"

// This file's names live in a namespace of their own (benchmarks/registry.h).
namespace SHARDGAN_UNITY_ID {

using namespace shardgan;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

int64_t status_kib(const char* key) {  // VmHWM / VmRSS in KiB
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(std::strlen(key) + 1));
  }
  return -1;
}

void evict(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

double cached_fraction(const std::string& path) {  // of the file's pages in the page cache
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return -1;
  const size_t bytes = fs::file_size(path), page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  void* m = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) return -1;
  std::vector<unsigned char> v((bytes + page - 1) / page);
  double frac = -1;
  if (::mincore(m, bytes, v.data()) == 0) {
    size_t in = 0;
    for (unsigned char c : v) in += c & 1;
    frac = static_cast<double>(in) / static_cast<double>(v.size());
  }
  ::munmap(m, bytes);
  return frac;
}

struct Pass {
  int64_t images = 0;
  double wall_s = 0, wait_s = 0;
};

// Reads batches [b0, b0 + count) of `epoch` through a fresh loader; returns what it delivered.
Pass read_pass(const data::Hdf5Dataset& ds, const DistributedSampler& sampler, int64_t queue, int64_t epoch,
               int64_t b0, int64_t count) {
  data::Hdf5Loader loader(ds, sampler, 1, at::kFloat, queue, true);
  loader.restart(epoch, b0);
  Pass p;
  const auto t0 = Clock::now();
  for (int64_t b = b0; b < b0 + count; ++b) p.images += loader.get(epoch, b, 0).at(0).size(0);
  p.wall_s = since(t0);
  p.wait_s = loader.wait_s();
  return p;
}

}  // namespace

int bench_main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  torch::set_num_threads(1);
  std::string dir = "/tmp", chw = "3x64x64";
  double gb = 2.5;
  int64_t global_batch = 64, queue = 4, chunk = data::kDefaultChunkImages, warm_batches = 400, keep = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--dir") dir = v;
    else if (k == "--gb") gb = std::stod(v);
    else if (k == "--chw") chw = v;
    else if (k == "--global-batch") global_batch = std::stoll(v);
    else if (k == "--queue") queue = std::stoll(v);
    else if (k == "--chunk") chunk = std::stoll(v);
    else if (k == "--warm-batches") warm_batches = std::stoll(v);
    else if (k == "--keep") keep = std::stoll(v);
  }
  int64_t c = 3, h = 64, w = 64;
  std::sscanf(chw.c_str(), "%ldx%ldx%ld", &c, &h, &w);
  const int64_t row = c * h * w, n = static_cast<int64_t>(gb * 1e9) / row;
  const std::string path = dir + "/bench_loader_" + chw + "_c" + std::to_string(chunk) + ".h5";

  nlohmann::json out;
  if (rank == 0) {
    const auto t0 = Clock::now();
    data::Hdf5Writer wr(path, n, c, h, w, chunk);
    const int64_t step = 1024;
    std::vector<uint8_t> img(static_cast<size_t>(step * row));
    std::vector<int64_t> lab(static_cast<size_t>(step));
    for (int64_t s = 0; s < n; s += step) {
      const int64_t k = std::min(step, n - s);
      for (int64_t i = 0; i < k; ++i) {
        lab[i] = (s + i) % 10;
        std::memset(&img[i * row], static_cast<int>((s + i) * 37 % 251), static_cast<size_t>(row));
      }
      wr.append(img.data(), lab.data(), k);
    }
    wr.commit();
    out["write_s"] = since(t0);
    out["file_bytes"] = static_cast<int64_t>(fs::file_size(path));
    out["cached_fraction_after_write"] = cached_fraction(path);
    evict(path);
    out["cached_fraction_before_cold_pass"] = cached_fraction(path);
  }
  MPI_Barrier(MPI_COMM_WORLD);

  const int64_t hwm_before_open_kib = status_kib("VmHWM:");
  data::Hdf5Dataset ds(path);
  DistributedSampler sampler(ds.size(), global_batch, rank, world, 7, 1);
  const int64_t bpe = sampler.batches_per_epoch();
  const auto t_idx = Clock::now();
  for (int i = 0; i < 20; ++i) sampler.indices(0, i);
  const double indices_s = since(t_idx) / 20;
  const int64_t hwm_before_kib = status_kib("VmHWM:");
  const Pass cold = read_pass(ds, sampler, queue, 0, 0, bpe);
  const int64_t hwm_after_kib = status_kib("VmHWM:"), rss_after_kib = status_kib("VmRSS:");
  MPI_Barrier(MPI_COMM_WORLD);
  double cached_after_cold = rank == 0 ? cached_fraction(path) : -1;
  const Pass warm = read_pass(ds, sampler, queue, 1, 0, std::min(warm_batches, bpe));

  // Per rank: cold img/s, warm img/s, cold wait, warm wait, HWM before open/pass/after, RSS.
  const std::vector<double> mine = {cold.images / cold.wall_s, warm.images / warm.wall_s, cold.wait_s, warm.wait_s,
                                    static_cast<double>(hwm_before_open_kib), static_cast<double>(hwm_before_kib),
                                    static_cast<double>(hwm_after_kib), static_cast<double>(rss_after_kib),
                                    cold.wall_s, indices_s};
  std::vector<double> all(mine.size() * static_cast<size_t>(world));
  MPI_Gather(mine.data(), static_cast<int>(mine.size()), MPI_DOUBLE, all.data(), static_cast<int>(mine.size()),
             MPI_DOUBLE, 0, MPI_COMM_WORLD);
  if (rank == 0) {
    out["world_size"] = world;
    out["images"] = n;
    out["image_chw"] = chw;
    out["chunk_images"] = chunk;
    out["global_batch"] = global_batch;
    out["local_batch"] = global_batch / world;
    out["queue_micro_batches"] = queue;
    out["queue_bytes_float32"] = queue * (global_batch / world) * row * 4;
    out["batches_per_epoch"] = bpe;
    out["warm_batches"] = std::min(warm_batches, bpe);
    out["cached_fraction_after_cold_pass"] = cached_after_cold;
    for (int r = 0; r < world; ++r) {
      const double* v = &all[static_cast<size_t>(r) * mine.size()];
      out["per_rank"].push_back({{"rank", r},
                                 {"cold_images_per_s", v[0]},
                                 {"warm_images_per_s", v[1]},
                                 {"cold_wait_s", v[2]},
                                 {"warm_wait_s", v[3]},
                                 {"cold_pass_s", v[8]},
                                 {"sampler_indices_s", v[9]},
                                 {"vmhwm_before_open_kib", v[4]},
                                 {"vmhwm_before_pass_kib", v[5]},
                                 {"vmhwm_after_pass_kib", v[6]},
                                 {"vmrss_after_pass_kib", v[7]}});
    }
    std::printf("%s\n", out.dump(2).c_str());
    if (!keep) fs::remove(path);
  }
  MPI_Finalize();
  return 0;
}

}  // namespace SHARDGAN_UNITY_ID

SHARDGAN_BENCHMARK(bench_loader)
