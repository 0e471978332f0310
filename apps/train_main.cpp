// shardgan-train: mpirun -np N shardgan-train config.yaml [--set key=value ...] [--resume DIR]
#include <malloc.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "shardgan/comm/factory.h"
#include "shardgan/comm/hybrid_communicator.h"
#include "shardgan/device/device.h"
#include "shardgan/device/host_copy.h"
#include "shardgan/train/build_info.h"
#include "shardgan/train/config.h"
#include "shardgan/train/metrics_record.h"
#include "shardgan/train/preflight.h"
#include "shardgan/train/preemption.h"
#include "shardgan/train/trainer.h"
#include "shardgan/util/deadman.h"
#include "shardgan/util/log.h"
#include "shardgan/util/threads.h"

namespace {

// The command line, defined once: parsed before MPI_Init (for dist.timeout_s alone) and
// after it.
struct Options {
  std::string config_path, resume;
  std::vector<std::string> overrides;
  bool dry_run = false, print_config = false, config_reference = false, metrics_reference = false, version = false;
};

void define_cli(CLI::App& app, Options& o) {
  app.add_option("config", o.config_path, "YAML config file (see configs/ and docs/config.md)");
  app.add_flag("--version", o.version,
               "print shardgan's version and what it runs on (torch, BLAS, oneDNN, CPU capability, CUDA, MPI, "
               "HDF5, NCCL, threads) and exit");
  app.add_option("--set", o.overrides, "override a config key, e.g. --set train.steps=200");
  app.add_option("--resume", o.resume,
                 "continue from a checkpoint, checkpoints folder or run dir; 'auto': from the newest "
                 "checkpoint of run.dir if there is one, else start fresh (for requeued jobs)");
  app.add_flag("--dry-run", o.dry_run,
               "print the memory pre-flight (parameters, bytes per rank per ZeRO stage, node memory) "
               "as one JSON object on rank 0's stdout and exit without training");
  app.add_flag("--print-config", o.print_config,
               "print the fully resolved config (the file, the --set overrides and every default) as YAML on "
               "stdout and exit");
  app.add_flag("--config-reference", o.config_reference,
               "print the reference of every config key as Markdown (docs/config.md) and exit");
  app.add_flag("--metrics-reference", o.metrics_reference,
               "print the reference of every metrics.jsonl field as Markdown (docs/metrics.md) and exit");
}

// dist.timeout_s of the config the command line names, read before MPI_Init; the default
// when it cannot be read (the run reports why once MPI is up).
double startup_timeout_s(int argc, char** argv) {
  try {
    CLI::App app;
    Options o;
    define_cli(app, o);
    app.parse(argc, argv);
    if (!o.config_path.empty()) return shardgan::load_config(o.config_path, o.overrides).timeout_s;
  } catch (...) {
  }
  return shardgan::TrainConfig{}.timeout_s;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  // Start-up has no collective timeout of its own: MPI_Init waits for every host's daemon
  // (a host cut off stalls it for good), and the node's ranks are found with blocking MPI
  // calls. A deadline of dist.timeout_s ends this process if they stall.
  auto startup = std::make_unique<shardgan::Deadman>("MPI_Init", startup_timeout_s(argc, argv), "dist.timeout_s");
  // MPI_THREAD_MULTIPLE for dist.progress_thread, which enters MPI from a helper thread
  // (src/comm/progress_thread.h); the thread refuses to start if MPI provides less.
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);

  CLI::App app{"shardgan-train: ZeRO-sharded GAN training (run under mpirun or srun)"};
  app.footer(
      "Every config key, with its type, default and meaning: docs/config.md (or --config-reference).\n"
      "The resolved config of a file and its overrides: shardgan-train CONFIG [--set ...] --print-config.");
  Options opts;
  define_cli(app, opts);
  std::string& config_path = opts.config_path;
  std::string& resume = opts.resume;
  std::vector<std::string>& overrides = opts.overrides;
  const bool& dry_run = opts.dry_run;
  const bool& print_config = opts.print_config;
  const bool& config_reference = opts.config_reference;
  const bool& metrics_reference = opts.metrics_reference;
  try {
    app.parse(argc, argv);
    if (opts.version) {
      if (rank == 0) std::printf("%s\n", shardgan::build_info_text().c_str());
      throw CLI::Success();
    }
    if (config_path.empty() && !config_reference && !metrics_reference) throw CLI::RequiredError("config");
  } catch (const CLI::ParseError& e) {
    // Parse by hand so that help and errors print once and MPI is finalized.
    int code = rank == 0 ? app.exit(e) : (e.get_exit_code() == 0 ? 0 : 1);
    MPI_Finalize();
    return code;
  }

  if (config_reference || metrics_reference || print_config) {  // no training: print on rank 0 and leave
    int code = 0;
    try {
      const std::string text = config_reference    ? shardgan::config_reference_markdown()
                               : metrics_reference ? shardgan::metrics_reference_markdown()
                                                   : shardgan::load_config(config_path, overrides).resolved_nested_yaml;
      if (rank == 0) std::fputs(text.c_str(), stdout);
    } catch (const std::exception& e) {
      if (rank == 0) std::fprintf(stderr, "shardgan-train: error: %s\n", e.what());
      code = 1;
    }
    std::fflush(stdout);
    MPI_Finalize();
    return code;
  }

  shardgan::install_preemption_handlers();
  try {
    shardgan::TrainConfig cfg = shardgan::load_config(config_path, overrides);
    shardgan::init_logging(rank, cfg.run_dir);
    startup->rearm("finding this node's ranks (MPI_Comm_split_type, MPI_Allgather)", cfg.timeout_s, "dist.timeout_s");
    auto [local_rank, local_size] = shardgan::local_rank_and_size(MPI_COMM_WORLD);
    const std::vector<int> node_ranks = shardgan::node_world_ranks(MPI_COMM_WORLD);
    startup.reset();  // every later collective has its own timeout
    const int cores = std::max(1u, std::thread::hardware_concurrency());
    const int affinity = shardgan::affinity_cpu_count();
    const int threads = shardgan::default_intra_op_threads(static_cast<int>(cfg.threads), cores, local_size, affinity);
    // Every rank checks its own mask: a rank bound to fewer CPUs than its share says so once.
    const std::string binding = shardgan::core_binding_warning(rank, cores, local_size, affinity);
    if (!binding.empty()) spdlog::warn("{}", binding);
    torch::set_num_threads(threads);
    torch::set_num_interop_threads(1);
    // run.device: every rank resolves its own GPU (cuda:<local rank>) and refuses alike when
    // there is none; an error on some ranks only ends the job through MPI_Abort below.
    {
      auto [launcher_rank, launcher_size] = shardgan::launcher_local_rank_and_size();
      cfg.compute_device = shardgan::resolve_device(cfg.device, launcher_rank >= 0 ? launcher_rank : local_rank,
                                                    config_path);
      shardgan::set_pin_host_memory(cfg.compute_device.is_cuda());
      if (cfg.compute_device.is_cuda()) at::globalContext().setAllowTF32CuDNN(cfg.tf32);
      if (cfg.deterministic) {
        setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);  // read when cuBLAS starts
        at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
        at::globalContext().setDeterministicCuDNN(true);
      }
    }
    auto comm = shardgan::make_communicator(cfg.backend, MPI_COMM_WORLD, cfg.timeout_s,
                                            cfg.compute_device.is_cuda() ? cfg.compute_device.index() : -1,
                                            cfg.blocking_wait);
    if (cfg.progress_thread) shardgan::enable_progress_thread(*comm, cfg.progress_interval_us);
    // Memory pre-flight before anything of the models is allocated: every rank computes
    // the same estimate locally (no collectives), so every rank refuses alike.
    nlohmann::json report;
    if (dry_run || !cfg.skip_memory_check || !cfg.skip_disk_check) {
      shardgan::TrainConfig pre = cfg;  // the disk check alone needs no activation probe
      if (!dry_run && cfg.skip_memory_check) pre.memory_probe = false;
      report = shardgan::memory_preflight(pre, *comm, comm->world_size(), local_size, node_ranks);
      if (dry_run) {
        if (rank == 0) std::printf("%s\n", report.dump(2).c_str());
        std::fflush(stdout);
        MPI_Finalize();
        return 0;
      }
      if (!cfg.skip_memory_check) shardgan::check_memory(cfg, report);
      // Every rank reads the same filesystems' free space, so every rank refuses alike (ranks
      // of another node check their own disk).
      if (!cfg.skip_disk_check) shardgan::check_disk(cfg, report);
    }
    if (rank == 0) {
      std::istringstream info(shardgan::build_info_text());
      for (std::string line; std::getline(info, line);) spdlog::info("{}", line);
      spdlog::info("config {} ({} threads per rank, local rank {} of {})", config_path, threads, local_rank, local_size);
    }
    shardgan::Trainer trainer(cfg, *comm);
#ifndef SHARDGAN_TCMALLOC
    // Without tcmalloc (a sanitizer build): stage 3 allocates and frees large tensors every
    // step. glibc raises its mmap threshold to the size of the first such buffer freed (up
    // to 32 MiB), so later buffers below that come from the heap, which fragments and does
    // not shrink: peak RSS grew by 0.2-0.3 GiB per rank on a 6.7e7-parameter BigGAN at
    // N = 4. A fixed 1 MiB threshold maps every large buffer and gives it back on free, at
    // the cost of page faults; it applies to models of 5e7 parameters or more.
    // MALLOC_MMAP_THRESHOLD_ overrides it either way.
    if (!std::getenv("MALLOC_MMAP_THRESHOLD_") &&
        trainer.generator_numel() + trainer.discriminator_numel() >= 50'000'000) {
      mallopt(M_MMAP_THRESHOLD, 1 << 20);
    }
#endif
    if (resume == "auto") {
      trainer.resume_auto();
    } else if (!resume.empty()) {
      trainer.resume(resume);
    }
    trainer.run(report);
    comm->barrier();
  } catch (const std::exception& e) {
    // Library code throws; here we end the job on every rank so that no peer hangs.
    std::fprintf(stderr, "shardgan-train: error on rank %d: %s\n", rank, e.what());
    std::fflush(stderr);
    // Errors the ranks agreed on (a failed save, a NaN vote) throw on every rank at once:
    // a moment's grace lets each print its own message before the first abort kills all.
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
  MPI_Finalize();
  return 0;
}
