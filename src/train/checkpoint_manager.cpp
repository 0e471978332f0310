#include "shardgan/train/checkpoint_manager.h"

#include <chrono>

#include <spdlog/spdlog.h>

#include "shardgan/checkpoint/async_checkpoint.h"
#include "shardgan/comm/communicator.h"
#include "shardgan/train/config.h"

namespace shardgan {

CheckpointManager::CheckpointManager(const TrainConfig& cfg, Communicator& comm, TrainCounters& counters,
                                     Source source)
    : cfg_(cfg), comm_(comm), counters_(counters), source_(std::move(source)) {
  if (cfg_.checkpoint_async) {
    async_ = std::make_unique<AsyncCheckpointer>(comm_, parse_snapshot_kind(cfg_.checkpoint_snapshot));
  }
}

CheckpointManager::~CheckpointManager() = default;  // AsyncCheckpointer's destructor waits

double CheckpointManager::wait_for_write(const char* why) {
  if (!async_ || !async_->in_flight()) return 0;
  const double waited = async_->wait();
  if (comm_.rank() == 0 && waited > 1e-3) {
    spdlog::info("waited {:.2f} s for the checkpoint write in flight ({})", waited, why);
  }
  return waited;
}

void CheckpointManager::check_write() {
  if (async_) async_->check_write();
}

std::string CheckpointManager::save() {
  wait_for_write("before a synchronous save");
  source_.fill_counters();
  SaveStats st;
  const auto t0 = std::chrono::steady_clock::now();
  std::string dir = save_checkpoint(cfg_.run_dir, counters_, source_.models(), cfg_.resolved_yaml, comm_,
                                    static_cast<int>(cfg_.keep_checkpoints), &st);
  last_save_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (comm_.rank() == 0) {
    spdlog::info("saved step {}: {:.2f} MB on rank 0, training stalled {:.3f} s", counters_.step,
                 st.bytes / 1e6, st.total_s);
  }
  return dir;
}

std::string CheckpointManager::save_async() {
  if (!async_) return save();
  source_.fill_counters();
  // A fork must not copy an HDF5 lock that the read-ahead thread holds mid-read.
  std::unique_lock<std::mutex> paused;
  if (async_->kind() == SnapshotKind::kFork) paused = source_.pause_reads();
  AsyncSaveStats st;
  const std::string dir = async_->save(cfg_.run_dir, counters_, source_.models(), cfg_.resolved_yaml,
                                       static_cast<int>(cfg_.keep_checkpoints), &st);
  if (paused.owns_lock()) paused.unlock();
  if (comm_.rank() == 0) {
    spdlog::info("saving step {} in the background ({} snapshot): training stalled {:.3f} s (snapshot {:.3f} s{})",
                 counters_.step, snapshot_kind_name(async_->kind()), st.stall_s, st.snapshot_s,
                 st.waited_s > 1e-3 ? fmt::format(", {:.3f} s waiting for the previous save's write", st.waited_s)
                                    : std::string());
  }
  return dir;
}

void CheckpointManager::log_totals() const {
  if (!async_ || comm_.rank() != 0) return;
  const AsyncSaveTotals& t = async_->totals();
  spdlog::info("background checkpoints: {} saves, training stalled {:.3f} s in all ({:.3f} s per save); {} waited "
               "for the previous write ({:.2f} s); writing took {:.2f} s in the background",
               t.saves, t.stall_s, t.saves ? t.stall_s / t.saves : 0.0, t.waits, t.waited_s, t.write_s);
}

}  // namespace shardgan
