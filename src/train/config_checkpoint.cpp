// The checkpoint section of the training configuration (config_sections.h): background
// saves and how they snapshot the state.
#include "shardgan/train/config_sections.h"

namespace shardgan::config_sections {

void read_checkpoint(Reader& r, TrainConfig& c) {
  c.checkpoint_async = r.get<bool>("checkpoint.async", c.checkpoint_async,
      "write checkpoints in the background: training waits only for a snapshot (at most one save in flight)");
  require(!c.checkpoint_async || c.backend == "mpi", r, "checkpoint.async",
          "needs dist.backend mpi: the background commit needs a communicator of its own, which the NCCL "
          "backend cannot split off yet (set checkpoint.async: false)");
  for (const auto* o : {&c.g_optim.offload, &c.d_optim.offload}) {
    require(!c.checkpoint_async || !o->any(), r, "checkpoint.async",
            "cannot be true with offload.<model>.optimizer or .param: the snapshot would read the offloaded "
            "state back into memory (set checkpoint.async: false)");
  }
  c.checkpoint_snapshot = r.get<std::string>("checkpoint.snapshot", c.checkpoint_snapshot,
      "with checkpoint.async: auto (fork when every transport Open MPI selected is shared memory or TCP, "
      "copy otherwise: a fork is unsafe once an RDMA transport has registered memory), fork (a copy-on-write "
      "child process writes the files) or copy (host staging buffers as big as the rank's checkpoint, written "
      "by a thread)");
  require(c.checkpoint_snapshot == "auto" || c.checkpoint_snapshot == "fork" || c.checkpoint_snapshot == "copy", r,
          "checkpoint.snapshot", "must be auto, fork or copy");
  r.warn_if_ignored(!c.checkpoint_async, "checkpoint.snapshot",
                    "has no effect with checkpoint.async false: it chooses how a background save snapshots the "
                    "state, and every save is synchronous");
}

}  // namespace shardgan::config_sections
