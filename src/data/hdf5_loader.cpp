#include "shardgan/data/hdf5_loader.h"

#include <stdexcept>
#include <string>

#include <hdf5.h>

namespace shardgan::data {

Hdf5Loader::Hdf5Loader(const Hdf5Dataset& dataset, const DistributedSampler& sampler, int64_t micro_batches,
                       at::ScalarType dtype, int64_t queue_micro_batches, bool with_labels, bool with_condition)
    : dataset_(dataset), sampler_(sampler), micro_batches_(micro_batches),
      queue_micro_batches_(queue_micro_batches), dtype_(dtype), with_labels_(with_labels),
      with_condition_(with_condition) {
  if (micro_batches < 1) throw std::invalid_argument("Hdf5Loader: micro_batches must be >= 1");
  // The read-ahead thread calls HDF5 while the main thread may write a checkpoint with it.
  // A library built without --enable-threadsafe has no global lock and corrupts its state.
  hbool_t threadsafe = false;
  if (H5is_library_threadsafe(&threadsafe) < 0 || !threadsafe) {
    unsigned major = 0, minor = 0, release = 0;
    H5get_libversion(&major, &minor, &release);
    throw std::runtime_error("data.source hdf5: the HDF5 library in use (" + std::to_string(major) + "." +
                             std::to_string(minor) + "." + std::to_string(release) +
                             ") is not thread-safe, and the data read-ahead thread shares it with checkpoint "
                             "writes on the main thread. Use a thread-safe HDF5 build (Debian's libhdf5-dev is one; "
                             "check that LD_LIBRARY_PATH does not put another libhdf5 first)");
  }
  start(0);
}

Hdf5Loader::~Hdf5Loader() = default;

int64_t Hdf5Loader::seq_of(int64_t epoch, int64_t batch, int64_t micro) const {
  return (epoch * sampler_.batches_per_epoch() + batch) * micro_batches_ + micro;
}

std::vector<at::Tensor> Hdf5Loader::read(int64_t seq) const {
  const int64_t micro = seq % micro_batches_, b = seq / micro_batches_;
  const int64_t epoch = b / sampler_.batches_per_epoch(), batch = b % sampler_.batches_per_epoch();
  at::Tensor x, y;
  const at::Tensor idx = sampler_.indices(epoch, batch, micro);
  dataset_.read(idx, dtype_, &x, with_labels_ && !with_condition_ ? &y : nullptr);
  if (with_condition_) y = dataset_.read_condition(idx, dtype_);
  return {x, y};
}

void Hdf5Loader::start(int64_t seq) {
  prefetcher_.reset();  // joins the old thread before the new one starts
  prefetcher_ = std::make_unique<Prefetcher>([this](int64_t s) { return read(s); }, seq, queue_micro_batches_);
  next_seq_ = seq;
}

void Hdf5Loader::restart(int64_t epoch, int64_t batch) {
  ++restarts_;
  start(seq_of(epoch, batch, 0));
}

double Hdf5Loader::wait_s() const { return prefetcher_ ? prefetcher_->wait_s() : 0.0; }

std::vector<at::Tensor> Hdf5Loader::get(int64_t epoch, int64_t batch, int64_t micro) {
  const int64_t seq = seq_of(epoch, batch, micro);
  if (seq < next_seq_) {  // asked again: off the schedule, read it here and keep the queue
    ++sync_reads_;
    return read(seq);
  }
  if (seq > next_seq_) {  // the schedule jumped ahead: prefetch from there
    ++restarts_;
    start(seq);
  }
  Prefetcher::Item item = prefetcher_->next();
  if (item.seq != seq) {  // cannot happen (the thread produces in order); never return wrong data
    throw std::logic_error("Hdf5Loader: the queue returned micro-batch " + std::to_string(item.seq) + " for " +
                           std::to_string(seq));
  }
  ++next_seq_;
  return std::move(item.tensors);
}

}  // namespace shardgan::data
