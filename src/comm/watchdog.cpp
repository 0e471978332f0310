#include "shardgan/comm/watchdog.h"

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <sstream>
#include <vector>

#include <spdlog/spdlog.h>

namespace shardgan {

CollectiveWatchdog::CollectiveWatchdog(std::chrono::microseconds interval,
                                       std::function<void(const std::string&)> on_failure, double exit_after_s)
    : interval_(interval.count() > 0 ? interval : std::chrono::microseconds(1)),
      on_failure_(std::move(on_failure)), exit_after_s_(exit_after_s) {
  thread_ = std::thread([this] { run(); });
}

CollectiveWatchdog::~CollectiveWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  for (auto& e : entries_) {
    try {
      e.release();
    } catch (...) {
    }
  }
}

void CollectiveWatchdog::watch(std::string what, Clock::time_point deadline, double timeout_s,
                               std::function<bool()> done, std::function<void()> release) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (failure_.empty()) {
      entries_.push_back({std::move(what), deadline, timeout_s, std::move(done), std::move(release)});
      return;
    }
  }
  release();
}

std::string CollectiveWatchdog::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

bool CollectiveWatchdog::timed_out() const {
  std::lock_guard<std::mutex> lock(mu_);
  return timed_out_;
}

size_t CollectiveWatchdog::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

void CollectiveWatchdog::fail(const std::string& msg, bool timed_out) {
  std::list<Entry> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    failure_ = msg;
    timed_out_ = timed_out;
    dropped.swap(entries_);
  }
  spdlog::error("collective watchdog: {}", msg);
  try {
    on_failure_(msg);
  } catch (...) {
  }
  for (auto& e : dropped) {
    try {
      e.release();
    } catch (...) {
    }
  }
  if (exit_after_s_ <= 0) return;
  std::unique_lock<std::mutex> lock(mu_);
  const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(exit_after_s_));
  if (cv_.wait_until(lock, until, [this] { return stop_; })) return;
  std::fprintf(stderr, "collective watchdog: %s; the process did not end within %.0f s, exiting with status %d\n",
               msg.c_str(), exit_after_s_, kExitStatus);
  std::fflush(nullptr);
  std::_Exit(kExitStatus);
}

void CollectiveWatchdog::run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    if (entries_.empty() || !failure_.empty()) {
      cv_.wait_for(lock, interval_ * 100, [this] { return stop_; });
      continue;
    }
    // Poll outside the lock, so that watch() can append meanwhile: std::list iterators
    // stay valid across appends, and only this thread erases.
    std::vector<std::list<Entry>::iterator> round;
    for (auto it = entries_.begin(); it != entries_.end(); ++it) round.push_back(it);
    lock.unlock();
    std::string error;
    bool timed_out = false;
    std::vector<std::list<Entry>::iterator> finished;
    for (auto it : round) {
      bool ok = false;
      try {
        ok = it->done();
      } catch (const std::exception& e) {
        error = it->what + " failed: " + e.what();
        break;
      }
      if (ok) {
        finished.push_back(it);
      } else if (Clock::now() > it->deadline) {
        std::ostringstream s;
        s << it->what << " timed out after " << it->timeout_s
          << " s: a peer rank never joined or died. HINT: check that every rank calls the same collectives in the "
             "same order, or raise dist.timeout_s";
        error = s.str();
        timed_out = true;
        break;
      }
    }
    for (auto it : finished) {
      try {
        it->release();
      } catch (...) {
      }
    }
    lock.lock();
    for (auto it : finished) entries_.erase(it);
    if (!error.empty()) {
      lock.unlock();
      fail(error, timed_out);
      lock.lock();
      continue;
    }
    cv_.wait_for(lock, interval_, [this] { return stop_; });
  }
}

}  // namespace shardgan
