#pragma once
/// Graceful preemption: SIGTERM and SIGUSR1 (what Slurm sends before it preempts or times
/// out a job, e.g. `sbatch --signal=USR1@120`; Open MPI's mpirun forwards SIGUSR1 to every
/// rank) ask the trainer to finish the current step on every rank, save a checkpoint and
/// exit 0. `--resume auto` then continues from it, so a requeued job needs no edits.

namespace shardgan {

/// Local. Installs handlers for SIGTERM and SIGUSR1 that only record the signal (async-
/// signal-safe: one write to a sig_atomic_t). Call once, early in main().
void install_preemption_handlers();

/// Local. The last preemption signal this process received (SIGTERM or SIGUSR1), or 0.
int preemption_signal();

/// Local, for tests: forget a recorded signal.
void clear_preemption_signal();

}  // namespace shardgan
