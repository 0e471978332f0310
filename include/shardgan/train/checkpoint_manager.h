#pragma once
/// The trainer's checkpoints: synchronous saves (save_checkpoint) and, with
/// checkpoint.async, background ones (AsyncCheckpointer), the wait for a background write
/// in flight before anything that must see it committed (a synchronous save, a preemption,
/// the end of the run), retention (train.keep_checkpoints), and the time of the last save
/// (the preemption grace's estimate). What a checkpoint holds (the models, their
/// optimizers, the EMA, the counters) comes from the trainer through a Source.
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "shardgan/checkpoint/checkpoint.h"

namespace shardgan {

class AsyncCheckpointer;
class Communicator;
struct TrainConfig;

class CheckpointManager {
 public:
  /// What a save reads, filled by the trainer at the moment of the save.
  struct Source {
    /// Collective under split placement (the real batches' position is D's ranks'): fills
    /// the counters' RNG state, loss scales and non-finite counts.
    std::function<void()> fill_counters;
    /// This rank's models, optimizers and extras (EMA), each led by its group's rank.
    std::function<std::vector<ModelAndOptimizer>()> models;
    /// Holds the data loader's reads for a fork snapshot (an empty lock when none).
    std::function<std::unique_lock<std::mutex>()> pause_reads;
  };
  /// `counters` is the trainer's, saved as it stands after fill_counters. `cfg`,
  /// `comm` and `counters` must outlive the manager. Local (no collective: the
  /// AsyncCheckpointer's writer starts at the first background save).
  CheckpointManager(const TrainConfig& cfg, Communicator& comm, TrainCounters& counters, Source source);
  /// Waits for a background write in flight (its error is logged, not thrown).
  ~CheckpointManager();

  /// Collective. Saves the current state synchronously, after waiting for a background
  /// write in flight; returns the checkpoint's directory. Throws CheckpointError on every
  /// rank (the previous checkpoint stays intact).
  std::string save();
  /// Collective. With checkpoint.async, snapshots the current state and writes it in the
  /// background (the previous background write is waited for first, its error rethrown);
  /// returns the directory it will have once committed. Otherwise save().
  std::string save_async();
  /// Collective when a write is in flight: waits for it (logging `why` when it took over
  /// 1 ms); returns the seconds waited (0 when none was in flight).
  double wait_for_write(const char* why);
  /// Local: throws CheckpointError when a background save's write has hung past
  /// dist.timeout_s (AsyncCheckpointer::check_write); nothing without checkpoint.async.
  void check_write();
  /// Seconds the last synchronous save took (0 before the first).
  double last_save_s() const { return last_save_s_; }
  /// Rank 0 logs the background saves' totals (checkpoint.async only). Local.
  void log_totals() const;

 private:
  const TrainConfig& cfg_;
  Communicator& comm_;
  TrainCounters& counters_;
  Source source_;
  std::unique_ptr<AsyncCheckpointer> async_;  // checkpoint.async
  double last_save_s_ = 0;
};

}  // namespace shardgan
