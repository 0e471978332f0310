#include "shardgan/offload/read_ahead.h"

#include <stdexcept>
#include <utility>

#include "shardgan/util/test_control.h"
#include "shardgan/util/threads.h"

namespace shardgan {

namespace {

// Runs `read` unless drain() dropped it first, and hands its value or error to `out`.
void run_read(const std::function<at::Tensor()>& read, const std::atomic<bool>& dropped,
              std::promise<at::Tensor>& out) {
  if (dropped.load()) {
    out.set_exception(std::make_exception_ptr(std::runtime_error("read-ahead dropped before it began")));
    return;
  }
  try {
    out.set_value(read());
  } catch (...) {
    out.set_exception(std::current_exception());
  }
}

}  // namespace

// The worker's own bound is one above max_reads: a job whose value was already taken may
// still count as running for a moment, and start() must not wait for it.
ReadAhead::ReadAhead(std::mutex* tier_mu, size_t max_reads)
    : tier_mu_(tier_mu), max_reads_(max_reads < 1 ? 1 : max_reads), worker_(tier_mu, max_reads_ + 1) {}

ReadAhead::~ReadAhead() { drain(); }

bool ReadAhead::start(Key key, std::function<at::Tensor()> read) {
  std::lock_guard<std::mutex> lk(mu_);
  if (held_.count(key) || held_.size() >= max_reads_) return false;
  auto dropped = std::make_shared<std::atomic<bool>>(false);
  Held h{{}, dropped};
  // Negative control (ctest tier_worker_control): one std::async thread per read, as
  // ShardedModel did before the worker; the single-thread test must then fail.
  if (test_control("read_ahead_async")) {
    h.value = std::async(std::launch::async, [this, read = std::move(read), dropped] {
      use_one_intra_op_thread();
      std::unique_lock<std::mutex> tier;
      if (tier_mu_) tier = std::unique_lock<std::mutex>(*tier_mu_);
      if (dropped->load()) throw std::runtime_error("read-ahead dropped before it began");
      return read();
    });
  } else {
    auto promise = std::make_shared<std::promise<at::Tensor>>();
    h.value = promise->get_future();
    // Never waits: at most max_reads_ + 1 jobs are queued or running (see the constructor).
    worker_.submit([read = std::move(read), dropped, promise] { run_read(read, *dropped, *promise); });
  }
  held_.emplace(key, std::move(h));
  return true;
}

bool ReadAhead::contains(Key key) const {
  std::lock_guard<std::mutex> lk(mu_);
  return held_.count(key) != 0;
}

at::Tensor ReadAhead::take(Key key) {
  std::future<at::Tensor> f;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = held_.find(key);
    if (it == held_.end()) throw std::out_of_range("read-ahead: no read was started for this key");
    f = std::move(it->second.value);
    held_.erase(it);
  }
  return f.get();  // waits outside the lock; rethrows the read's error
}

void ReadAhead::drain() {
  std::unordered_map<Key, Held> dropping;
  {
    std::lock_guard<std::mutex> lk(mu_);
    dropping.swap(held_);
  }
  for (auto& [key, h] : dropping) h.dropped->store(true);
  for (auto& [key, h] : dropping) {
    try {
      h.value.get();
    } catch (...) {  // nobody needs it; a tier that cannot be read fails again on the next read
    }
  }
}

size_t ReadAhead::size() const {
  std::lock_guard<std::mutex> lk(mu_);
  return held_.size();
}

}  // namespace shardgan
