#pragma once
/// Parameter offload's read-ahead (ShardingConfig::read_ahead): reads queued by the compute
/// thread (e.g. a stage-3 unit's master shard, two units before its all-gather) run on one
/// long-lived TierWorker thread, in the order they were started, one at a time, with the
/// tier mutex held, while the compute thread runs the units before. Reads of one disk file
/// are sequential anyway: a second read waits behind the first instead of competing for
/// the disk on a thread of its own (as one std::async thread per read did).
///
/// A read's result or error is kept under its key until take() hands it to the compute
/// thread or drain() drops it. At most `max_reads` reads are held at once (queued,
/// running, or done and not taken); start() beyond that queues nothing and returns false,
/// so the caller reads that shard itself when it needs it. start() never waits for a read.
/// Local: no communication. Thread-safe; meant for one calling thread (the compute thread).
#include <atomic>
#include <cstddef>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>

#include <ATen/core/Tensor.h>

#include "shardgan/offload/tier_worker.h"

namespace shardgan {

class ReadAhead {
 public:
  /// What a read is for (ShardedModel: the unit's address).
  using Key = const void*;
  /// Starts the worker thread. `tier_mu` (may be nullptr) is held around each read and must
  /// outlive this object. `max_reads` values below 1 read as 1.
  ReadAhead(std::mutex* tier_mu, size_t max_reads);
  /// Drops the reads that have not begun (they never run), waits for the one running, and
  /// joins the worker; values and errors are dropped.
  ~ReadAhead();
  ReadAhead(const ReadAhead&) = delete;
  ReadAhead& operator=(const ReadAhead&) = delete;

  /// Queues `read` under `key` and returns at once: it runs on the worker after every read
  /// started before it, with the tier mutex held. Returns false, queuing nothing, when a
  /// read for `key` is already held or `max_reads` reads are held.
  bool start(Key key, std::function<at::Tensor()> read);
  /// Whether a read for `key` is held (queued, running, or done and not taken).
  bool contains(Key key) const;
  /// The value of `key`'s read, waiting for it while it is queued or running; the read is
  /// no longer held afterwards. Rethrows the read's error (e.g. the tier's OffloadError).
  /// Throws std::out_of_range when no read for `key` is held.
  at::Tensor take(Key key);
  /// Drops every held read: those not begun never run, the running one is waited for, and
  /// values and errors are discarded (a tier that cannot be read fails again on the next
  /// read). Afterwards no read is in flight.
  void drain();
  /// Reads held now.
  size_t size() const;
  /// The worker thread's id: every read runs on it.
  std::thread::id worker_thread_id() const { return worker_.thread_id(); }

 private:
  struct Held {
    std::future<at::Tensor> value;
    std::shared_ptr<std::atomic<bool>> dropped;  // set by drain(): a read not begun skips
  };

  std::mutex* tier_mu_;
  const size_t max_reads_;
  mutable std::mutex mu_;  // guards held_
  std::unordered_map<Key, Held> held_;
  // Below held_: destroyed first, so the worker is joined before the futures go.
  TierWorker worker_;
};

}  // namespace shardgan
