#pragma once
/// Graceful preemption: SIGTERM and SIGUSR1 (what Slurm sends before it preempts or times
/// out a job, e.g. `sbatch --signal=USR1@120`; Open MPI's mpirun forwards SIGUSR1 to every
/// rank) ask the trainer to finish the current step on every rank, save a checkpoint and
/// exit 0. `--resume auto` then continues from it, so a requeued job needs no edits.

namespace shardgan {

/// Local. Installs handlers for SIGTERM and SIGUSR1 that only record the signal and its
/// time (async-signal-safe: clock_gettime and a sig_atomic_t write), then restore both
/// signals' default action, so that a second signal ends the process at once. Call once,
/// early in main().
void install_preemption_handlers();

/// Local. The last preemption signal this process received (SIGTERM or SIGUSR1), or 0.
int preemption_signal();

/// Local. Seconds (monotonic clock) since the first preemption signal, or -1 if none came.
double preemption_signal_age_s();
/// Local, pure. Whether a step must be abandoned now to save within the grace period:
/// a signal came `age_s` seconds ago (< 0: none), `grace_s` seconds before the kill; the
/// last step took `step_s` (0: no step finished yet, so its length is unknown) and this
/// one has run `elapsed_s`; a save takes `save_s`. True when grace_s - age_s is less than
/// 1.25 x (the rest of the step + the save) + 1 s, or the step length is unknown.
bool must_abandon_step(double grace_s, double age_s, double step_s, double elapsed_s, double save_s);
/// Local, for tests: forget a recorded signal.
void clear_preemption_signal();

}  // namespace shardgan
