// The dist section of the training configuration (config_sections.h): the communication
// backend and its settings.
#include "shardgan/train/config_sections.h"

namespace shardgan::config_sections {

void read_dist(Reader& r, TrainConfig& c) {
  c.backend = r.get<std::string>(
      "dist.backend", c.device == "cuda" ? "nccl" : "mpi",
      "mpi (host tensors; the default with run.device cpu) or nccl (GPU tensors; the default with run.device cuda)");
  require(c.backend == "mpi" || c.backend == "nccl", r, "dist.backend", "must be mpi or nccl");
  require(c.backend != "nccl" || c.device == "cuda", r, "dist.backend",
          "nccl needs run.device=cuda: NCCL moves GPU tensors only (use dist.backend=mpi on cpu)");
  require(c.backend != "mpi" || c.device == "cpu", r, "dist.backend",
          "mpi needs run.device=cpu: the MPI backend moves host tensors only (use dist.backend=nccl, the default "
          "on cuda)");
  c.timeout_s = r.get<double>("dist.timeout_s", c.timeout_s,
      "timeout of every collective, in seconds; a rank that waits longer ends the job");
  // At most about 31 years: longer ones overflow the clock's deadline arithmetic.
  require(c.timeout_s > 0 && c.timeout_s <= 1e9, r, "dist.timeout_s", "must be > 0 and at most 1e9 (seconds)");
  c.blocking_wait = r.get<bool>("dist.blocking_wait", c.blocking_wait,
      "nccl only: waits block the host until the collective finished");
  require(!c.blocking_wait || c.backend == "nccl", r, "dist.blocking_wait",
          "needs dist.backend nccl: the MPI backend always waits on the host (set it to false)");
  c.progress_thread = r.get<bool>("dist.progress_thread", c.progress_thread,
      "mpi only: a helper thread drives in-flight collectives during compute");
  require(!c.progress_thread || c.backend == "mpi", r, "dist.progress_thread",
          "needs dist.backend mpi: NCCL progresses on its own streams (set it to false)");
  c.progress_interval_us = r.get<double>("dist.progress_interval_us", c.progress_interval_us,
      "progress thread polling interval, in microseconds");
  require(c.progress_interval_us >= 1 && c.progress_interval_us <= 1e6, r, "dist.progress_interval_us",
          "must be 1 to 1e6 (microseconds)");
}

}  // namespace shardgan::config_sections
