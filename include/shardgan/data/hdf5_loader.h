#pragma once
/// This rank's real micro-batches of the training schedule, read from an HDF5 dataset by a
/// background thread ahead of use.
#include <cstdint>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

#include "shardgan/data/hdf5_dataset.h"
#include "shardgan/data/prefetcher.h"
#include "shardgan/data/images.h"

namespace shardgan::data {

/// Walks the deterministic schedule (epoch, batch, micro) -> sampler.indices(epoch, batch,
/// micro), micro-batch by micro-batch (micro 0 .. k-1 of batch 0, 1, ... of epoch 0, then
/// epoch 1, ...), reading each one's rows on a Prefetcher thread into a queue of
/// `queue_micro_batches` micro-batches. Local (no collectives). Memory: the queue holds at
/// most queue_micro_batches + 1 micro-batches of [B_local, C, H, W] in `dtype`, whatever N.
class Hdf5Loader {
 public:
  /// `dataset` and `sampler` must outlive the loader; `sampler` must have been built with
  /// N = dataset.size() and `micro_batches`. Labels are returned only if `with_labels`;
  /// with `with_condition` (a file of pairs), y is instead the input images A
  /// ([B_local, C_A, H, W] in dtype, Hdf5Dataset::read_condition).
  /// Starts prefetching at (0, 0, 0); call restart() for another position. Throws
  /// std::runtime_error, naming the HDF5 version, if the HDF5 library is not thread-safe
  /// (H5is_library_threadsafe): the read-ahead thread shares it with checkpoint writes.
  Hdf5Loader(const Hdf5Dataset& dataset, const DistributedSampler& sampler, int64_t micro_batches,
             at::ScalarType dtype, int64_t queue_micro_batches, bool with_labels, bool with_condition = false);
  ~Hdf5Loader();

  /// Drops what was prefetched and prefetches from micro 0 of batch `batch` of `epoch`
  /// (after a resume: the checkpoint's epoch and batch_in_epoch).
  void restart(int64_t epoch, int64_t batch);

  /// {x [B_local, C, H, W] in dtype, y int64 [B_local] or undefined} of micro-batch `micro`
  /// of batch `batch` of `epoch`: identical to reading sampler.indices(epoch, batch, micro)
  /// with Hdf5Dataset::read. Taken from the queue when it is the next micro-batch of the
  /// schedule; a later one restarts the prefetch there; an earlier one (asked again) is
  /// read synchronously (counted in sync_reads()). Never returns another micro-batch's
  /// data. Rethrows a read error of the thread (DataError naming the file) here.
  std::vector<at::Tensor> get(int64_t epoch, int64_t batch, int64_t micro);

  int64_t sync_reads() const { return sync_reads_; }  ///< micro-batches read off the schedule
  int64_t restarts() const { return restarts_; }      ///< prefetch restarts (restart() and jumps)
  /// Seconds get() waited for the thread (the I/O the queue did not hide); resets on restart.
  double wait_s() const;
  /// Pauses the read-ahead thread between two reads until the returned lock is released
  /// (Prefetcher::hold): no HDF5 call of this loader is in progress meanwhile.
  std::unique_lock<std::mutex> pause_reads() { return prefetcher_->hold(); }

 private:
  int64_t seq_of(int64_t epoch, int64_t batch, int64_t micro) const;
  std::vector<at::Tensor> read(int64_t seq) const;  // the micro-batch `seq` of the schedule
  void start(int64_t seq);

  const Hdf5Dataset& dataset_;
  const DistributedSampler& sampler_;
  const int64_t micro_batches_, queue_micro_batches_;
  const at::ScalarType dtype_;
  const bool with_labels_;
  const bool with_condition_;
  std::unique_ptr<Prefetcher> prefetcher_;
  int64_t next_seq_ = 0;  // the seq prefetcher_->next() returns
  int64_t sync_reads_ = 0, restarts_ = 0;
};

}  // namespace shardgan::data
