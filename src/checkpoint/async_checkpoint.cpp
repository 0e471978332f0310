#include "shardgan/checkpoint/async_checkpoint.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <tuple>

#include <mpi.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "save_parts.h"
#include "shardgan/checkpoint/shard_io.h"
#include "shardgan/comm/communicator.h"
#include "shardgan/device/host_copy.h"
#include "shardgan/util/poll.h"
#include "shardgan/util/test_control.h"

namespace shardgan {
using namespace ckpt_detail;
namespace {

using clock_type = std::chrono::steady_clock;
double since(clock_type::time_point t0) { return std::chrono::duration<double>(clock_type::now() - t0).count(); }

// One step of writing a rank file, without torch: the snapshot's datasets point at memory
// that stays as it was until the file is written (staging, or the child's copy-on-write view).
struct FileOp {
  bool is_attr = false;
  std::string path;  // dataset path, or the object an attribute is set on
  h5::DType dt = h5::DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  std::string name;  // attribute name
  int64_t value = 0;
  bool if_exists = false;
};

// SHARDGAN_TEST_CKPT_WRITE_DELAY_MS (tests only): the background writer sleeps this long
// before it writes, so that a test can act while a write is surely in flight.
void test_delay() {
  if (const char* e = std::getenv("SHARDGAN_TEST_CKPT_WRITE_DELAY_MS")) {
    // The line tells a harness when the hang begins (benchmarks/chaos.py times exits from it).
    std::fprintf(stderr, "shardgan: checkpoint writer delayed %s ms (SHARDGAN_TEST_CKPT_WRITE_DELAY_MS)\n", e);
    std::this_thread::sleep_for(std::chrono::milliseconds(std::atoll(e)));
  }
}

ckpt::FileEntry write_ops(const std::string& dir, int rank, const std::vector<FileOp>& ops) {
  test_delay();
  ckpt::RankFileWriter w(dir, rank);
  for (const FileOp& op : ops) {
    if (!op.is_attr) {
      w.write(op.path, op.dt, op.shape, op.data);
    } else if (!op.if_exists || w.file().exists(op.path)) {
      w.file().set_attr(op.path, op.name, op.value);
    }
  }
  return w.finish();
}

// Records the rank file as FileOps. Under kFork a contiguous host tensor is referenced in
// place (the child sees it as it is at the fork); everything else is copied into staging.
class SnapshotSink : public RankFileSink {
 public:
  SnapshotSink(SnapshotKind kind, std::vector<at::Tensor>& staging) : kind_(kind), staging_(staging) {}
  void dataset(const std::string& path, const at::Tensor& t) override {
    FileOp op;
    op.path = path;
    op.dt = h5_type(t.scalar_type());
    op.shape = t.sizes().vec();
    if (kind_ == SnapshotKind::kFork && t.device().is_cpu() && t.is_contiguous()) {
      keep_.push_back(t);
      op.data = t.data_ptr();
    } else {
      at::Tensor& s = slot(t);
      at::Tensor flat = t.reshape({-1});
      if (t.device().is_cpu()) {
        s.copy_(flat);
      } else {
        copy_to_host(flat.contiguous(), s);
      }
      staged_bytes += s.nbytes();
      op.data = s.data_ptr();
    }
    ops.push_back(std::move(op));
  }
  void attr(const std::string& obj, const std::string& name, int64_t v, bool if_exists) override {
    FileOp op;
    op.is_attr = true;
    op.path = obj;
    op.name = name;
    op.value = v;
    op.if_exists = if_exists;
    ops.push_back(std::move(op));
  }
  std::vector<FileOp> ops;
  int64_t staged_bytes = 0;

 private:
  // The next staging buffer, reused when the previous save had one of this size and dtype.
  at::Tensor& slot(const at::Tensor& t) {
    std::vector<at::Tensor>& pool = kind_ == SnapshotKind::kCopy ? staging_ : keep_;
    const size_t k = kind_ == SnapshotKind::kCopy ? next_++ : pool.size();
    if (k >= pool.size()) pool.resize(k + 1);
    at::Tensor& s = pool[k];
    if (!s.defined() || s.numel() != t.numel() || s.scalar_type() != t.scalar_type()) {
      s = torch::empty({t.numel()}, torch::TensorOptions().dtype(t.scalar_type()).pinned_memory(!t.device().is_cpu()));
    }
    return s;
  }
  SnapshotKind kind_;
  std::vector<at::Tensor>& staging_;
  size_t next_ = 0;
  std::vector<at::Tensor> keep_;  // kFork: what the ops point at, alive until the fork
};

void write_all(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    const ssize_t n = ::write(fd, s.data() + done, s.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

// Reads the writer's report until the pipe's end and reaps the writer, both by `timeout_s`
// after `t0`. Past it, kills the writer (SIGKILL), reaps it (for at most 5 s more: a writer
// in uninterruptible I/O may take longer, and is then left to init) and throws.
std::string await_writer(pid_t pid, int fd, clock_type::time_point t0, double timeout_s, int* status) {
  // Control "ckpt_writer_ignores_timeout": waits without a deadline, as the writer did before it had a timeout
  // (tests/async_checkpoint_timeout_test.sh must then fail).
  if (test_control("ckpt_writer_ignores_timeout")) timeout_s = 1e9;
  const auto deadline = t0 + std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(timeout_s));
  auto left_ms = [&] {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock_type::now()).count();
    return static_cast<int>(std::clamp<int64_t>(left, 0, 100));  // wake at least every 0.1 s
  };
  std::string s;
  char buf[65536];
  bool eof = false, reaped = false;
  while (!(eof && reaped) && clock_type::now() < deadline) {
    if (!eof) {
      pollfd p{fd, POLLIN, 0};
      const int r = ::poll(&p, 1, left_ms());
      if (r < 0 && errno != EINTR) eof = true;
      if (r > 0) {
        const ssize_t n = ::read(fd, buf, sizeof(buf));
        if (n > 0) s.append(buf, static_cast<size_t>(n));
        if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) eof = true;
      }
    } else {
      const pid_t w = ::waitpid(pid, status, WNOHANG);
      if (w == pid || (w < 0 && errno != EINTR)) {
        reaped = true;
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(std::min(left_ms(), 5)));
      }
    }
  }
  if (eof && reaped) return s;
  ::kill(pid, SIGKILL);
  const auto give_up = clock_type::now() + std::chrono::seconds(5);
  while (::waitpid(pid, status, WNOHANG) == 0 && clock_type::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::ostringstream msg;
  msg << "the checkpoint writer process (pid " << pid << ") did not finish within dist.timeout_s = " << timeout_s
      << " s of the fork (" << (eof ? "it reported but did not exit" : "no report") << "); killed it";
  throw CheckpointError(msg.str());
}

// Forks the writer process of this rank's file; returns its pid and the read end of its report.
std::pair<pid_t, int> fork_writer(const SaveParts& parts, int rank, const std::vector<FileOp>& ops) {
  {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) {
      throw CheckpointError(parts.what + ": pipe2 failed on rank " + std::to_string(rank) + ": " + std::strerror(errno));
    }
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid == 0) {
      // The child: one thread, a copy-on-write view of the parent at this instant. It writes
      // the rank file with HDF5 only (no torch, no MPI), reports, and leaves without running
      // any destructor or exit handler of the parent's libraries.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(3);
      ::prctl(PR_SET_NAME, "sg-ckpt-writer", 0, 0, 0);  // its name in ps and /proc/PID/comm
      ::close(fds[0]);
      std::string report;
      try {
        ckpt::Manifest rec = parts.mine;
        rec.files.push_back(write_ops(parts.tmp_dir, rank, ops));
        report = "OK" + ckpt::to_json(rec);
      } catch (const std::exception& e) {
        report = std::string("ER") + e.what();
      }
      write_all(fds[1], report);
      ::_exit(0);
    }
    const int fork_errno = errno;
    ::close(fds[1]);
    if (pid < 0) {
      ::close(fds[0]);
      throw CheckpointError(parts.what + ": fork() failed on rank " + std::to_string(rank) + ": " +
                            std::strerror(fork_errno) + ". Set checkpoint.snapshot: copy (or checkpoint.async: false)");
    }
    return {pid, fds[0]};
  }
}

}  // namespace

SnapshotKind parse_snapshot_kind(const std::string& name) {
  if (name == "fork") return SnapshotKind::kFork;
  if (name == "copy") return SnapshotKind::kCopy;
  if (name == "auto") return SnapshotKind::kAuto;
  throw std::invalid_argument("checkpoint.snapshot: unknown snapshot kind '" + name + "' (expected auto, fork or copy)");
}

const char* snapshot_kind_name(SnapshotKind k) {
  return k == SnapshotKind::kFork ? "fork" : k == SnapshotKind::kCopy ? "copy" : "auto";
}

namespace {

// Transports a fork cannot break: shared memory and TCP (and the loopback "self").
bool safe_btl(const std::string& c) { return c == "self" || c == "vader" || c == "sm" || c == "tcp"; }

std::string joined(const std::set<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// OMPI_MCA_pml / OMPI_MCA_btl as "; OMPI_MCA_x=v" (for the reason), or "".
std::string mca_env() {
  std::string s;
  for (const char* k : {"OMPI_MCA_pml", "OMPI_MCA_btl"}) {
    if (const char* v = std::getenv(k)) s += std::string("; ") + k + "=" + v;
  }
  return s;
}

// The fallback when no component is visible: the environment forces ob1 over safe btls.
SnapshotChoice choose_from_env(const std::string& why) {
  const char* pml = std::getenv("OMPI_MCA_pml");
  const char* btl = std::getenv("OMPI_MCA_btl");
  bool safe = pml && std::string(pml) == "ob1" && btl && *btl && *btl != '^';
  if (safe) {
    std::stringstream list(btl);
    for (std::string c; std::getline(list, c, ',');) safe = safe && safe_btl(c);
  }
  if (safe) return {SnapshotKind::kFork, why + ", but the environment forces pml ob1 over shared memory and TCP" + mca_env()};
  return {SnapshotKind::kCopy, why + ", and the environment does not force pml ob1 with btls of shared memory and TCP only" +
                                   mca_env()};
}

}  // namespace

SnapshotChoice choose_snapshot_kind() {
  // Control "snapshot_auto_ignores_transports": always fork (the copy cases of
  // test_async_snapshot must then fail).
  if (test_control("snapshot_auto_ignores_transports")) return {SnapshotKind::kFork, "test control"};
#ifndef OPEN_MPI
  return {SnapshotKind::kCopy, "the MPI library is not Open MPI, whose transport selection this check reads"};
#else
  // Open MPI's component DSOs mapped in this process: framework -> components.
  std::map<std::string, std::set<std::string>> loaded;
  std::set<std::string> rdma_libs;
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    const size_t slash = line.rfind('/');
    if (slash == std::string::npos) continue;
    const std::string file = line.substr(slash + 1);
    if (file.rfind("mca_", 0) == 0 && file.size() > 7 && file.compare(file.size() - 3, 3, ".so") == 0) {
      const std::string body = file.substr(4, file.size() - 7);  // "<framework>_<component>"
      const size_t u = body.find('_');
      if (u != std::string::npos) loaded[body.substr(0, u)].insert(body.substr(u + 1));
    }
    for (const char* lib : {"libucp.so", "libuct.so", "libhcoll.so", "libsharp.so", "libsharp_coll.so"}) {
      if (file.rfind(lib, 0) == 0) rdma_libs.insert(lib);
    }
  }
  std::set<std::string> pml = loaded["pml"];
  pml.erase("monitoring");  // a wrapper around the selected pml
  if (pml.empty()) return choose_from_env("no Open MPI pml component is visible in this process (a static build?)");
  std::set<std::string> unsafe;
  for (const std::string& c : pml) {
    if (c != "ob1") unsafe.insert("pml " + c);
  }
  for (const std::string& c : loaded["btl"]) {
    if (!safe_btl(c)) unsafe.insert("btl " + c);
  }
  for (const std::string& c : loaded["osc"]) {
    if (c != "sm" && c != "pt2pt" && c != "rdma" && c != "monitoring") unsafe.insert("osc " + c);  // rdma: over the btls
  }
  for (const char* c : {"hcoll", "fca", "ucc"}) {
    if (loaded["coll"].count(c)) unsafe.insert(std::string("coll ") + c);
  }
  for (const std::string& l : rdma_libs) unsafe.insert(l);
  const std::string selected = "pml " + joined(pml) + ", btl " + (loaded["btl"].empty() ? "(none)" : joined(loaded["btl"]));
  if (!unsafe.empty()) {
    return {SnapshotKind::kCopy, "Open MPI loaded " + joined(unsafe) + " (" + selected +
                                     "), which may register memory for RDMA: a fork child would not see those pages" +
                                     mca_env()};
  }
  return {SnapshotKind::kFork, "Open MPI selected " + selected + ": shared memory and TCP only" + mca_env()};
#endif
}

struct AsyncCheckpointer::State {
  std::shared_ptr<Communicator> comm;
  SaveParts parts;
  std::vector<FileOp> ops;  // kCopy: written by the thread
  pid_t child = -1;         // kFork: the writer process
  int pipe_fd = -1;         // kFork: its report (the rank's record as JSON, or an error)
  int rank = 0;
  double timeout_s = 600;      // the training communicator's timeout: the fork writer's bound
  clock_type::time_point started;  // the thread's start
  std::atomic<bool> written{false};  // the write is over (the file, or its error): the commit is next
  std::atomic<bool> done{false};   // run() returned
  std::string snapshot_error;  // the snapshot failed here: the commit fails on every rank
  std::exception_ptr error;
  double write_s = 0;
  std::thread thread;

  void run() {
    const auto t0 = clock_type::now();
    std::string error = snapshot_error;
    if (error.empty()) try {
      if (child > 0) {
        int status = 0;
        std::string report;
        try {
          report = await_writer(child, pipe_fd, t0, timeout_s, &status);
        } catch (...) {
          ::close(pipe_fd);
          pipe_fd = -1;
          child = -1;
          throw;
        }
        ::close(pipe_fd);
        pipe_fd = -1;
        child = -1;
        if (report.rfind("OK", 0) == 0) {
          parts.mine = ckpt::manifest_from_json(report.substr(2), "the checkpoint writer's record");
        } else if (report.rfind("ER", 0) == 0) {
          throw CheckpointError(report.substr(2));
        } else {
          throw CheckpointError("the checkpoint writer process ended without a report (" +
                                std::string(WIFSIGNALED(status) ? "killed by signal " + std::to_string(WTERMSIG(status))
                                                                : "exit status " + std::to_string(WEXITSTATUS(status))) +
                                ")");
        }
      } else {
        parts.mine.files.push_back(write_ops(parts.tmp_dir, rank, ops));
        ops.clear();
      }
    } catch (const std::exception& e) {
      error = "rank " + std::to_string(rank) + ": " + parts.what + " (background write): " + e.what();
    }
    written = true;
    try {
      commit_save(parts, error, *comm);
    } catch (...) {
      this->error = std::current_exception();
    }
    write_s = since(t0);
  }
};

AsyncCheckpointer::AsyncCheckpointer(Communicator& comm, SnapshotKind kind) : train_comm_(comm), kind_(kind) {
  int initialized = 0, provided = MPI_THREAD_MULTIPLE;
  MPI_Initialized(&initialized);
  if (initialized && comm.backend() == "mpi") MPI_Query_thread(&provided);
  if (provided < MPI_THREAD_MULTIPLE) {
    throw CheckpointError("checkpoint.async: MPI was initialized without MPI_THREAD_MULTIPLE (level " +
                          std::to_string(provided) + "), and the background commit calls MPI from its own thread; "
                          "use an MPI build with thread support or set checkpoint.async: false");
  }
  try {
    comm_ = comm.split(0, comm.rank());
  } catch (const std::exception& e) {
    throw CheckpointError("checkpoint.async: the " + comm.backend() +
                          " backend cannot make the background commit a communicator of its own (" + e.what() +
                          "); set checkpoint.async: false");
  }
  if (kind_ == SnapshotKind::kAuto) resolve_auto();
}

void AsyncCheckpointer::resolve_auto() {
  const SnapshotChoice mine = choose_snapshot_kind();
  // Every rank's verdict; the first copying rank's reason goes to rank 0's log.
  at::Tensor copying = torch::zeros({train_comm_.world_size()}, torch::kDouble);
  if (mine.kind == SnapshotKind::kCopy) copying[train_comm_.rank()] = 1.0;
  train_comm_.all_reduce(copying, ReduceOp::kSum);
  const at::Tensor first = copying.nonzero();
  const int src = first.numel() > 0 ? static_cast<int>(first[0][0].item<int64_t>()) : 0;
  kind_ = first.numel() > 0 ? SnapshotKind::kCopy : SnapshotKind::kFork;
  at::Tensor len = torch::tensor({static_cast<int64_t>(mine.reason.size())}, torch::kLong);
  train_comm_.broadcast(len, src);
  at::Tensor text = torch::zeros({len.item<int64_t>()}, torch::kUInt8);
  if (train_comm_.rank() == src) std::memcpy(text.data_ptr(), mine.reason.data(), mine.reason.size());
  if (text.numel() > 0) train_comm_.broadcast(text, src);
  if (train_comm_.rank() == 0) {
    spdlog::info("checkpoint.snapshot auto: {} snapshots (rank {}: {})", snapshot_kind_name(kind_), src,
                 std::string(static_cast<const char*>(text.data_ptr()), static_cast<size_t>(text.numel())));
  }
}

AsyncCheckpointer::~AsyncCheckpointer() {
  if (!state_) return;
  if (std::uncaught_exceptions() > 0) {
    // The job is ending with an error (main() aborts every rank): do not wait on peers
    // that may never join the commit. The thread owns what it uses (State).
    state_->thread.detach();
    return;
  }
  try {
    wait();
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
  }
}

namespace {

// The write's bound: timeout_s from the thread's start, and 2 s for a killed fork writer's
// report to arrive (await_writer kills it at timeout_s and the thread then reports that).
constexpr double kWriteReportSlackS = 2.0;

// The write's bound as fail_hung_write names it.
std::string write_bound_text(double timeout_s) { return "dist.timeout_s = " + fmt::format("{}", timeout_s) + " s"; }

}  // namespace

void AsyncCheckpointer::fail_hung_write(const char* bound) {
  std::shared_ptr<State> s = std::move(state_);
  // The thread may be blocked in a write that cannot be interrupted: leave it (it owns its
  // State) and fail this rank; the caller ends the job. The checkpoint stays uncommitted.
  s->thread.detach();
  throw CheckpointError("rank " + std::to_string(s->rank) + ": " + s->parts.what + " (background write, " +
                        snapshot_kind_name(kind_) + " snapshot) did not finish within " + bound + "; the " +
                        "previous checkpoint is intact. Check the file system under run.dir, or raise dist.timeout_s");
}

void AsyncCheckpointer::check_write() {
  if (!state_ || state_->written.load() || test_control("ckpt_copy_writer_unbounded")) return;
  if (since(state_->started) > state_->timeout_s + kWriteReportSlackS) {
    fail_hung_write(write_bound_text(state_->timeout_s).c_str());
  }
}

double AsyncCheckpointer::wait() {
  if (!state_) return 0;
  const auto t0 = clock_type::now();
  std::shared_ptr<State> s = state_;
  // The thread's bounds: its write, timeout_s (a fork writer is killed then; a copy write is
  // held to the same), then the commit's collectives at twice that timeout each side: 3 x
  // timeout_s in all. Control "ckpt_copy_writer_unbounded": no bound, as before (the test
  // must then fail).
  const bool unbounded = test_control("ckpt_copy_writer_unbounded");
  const double bound_s = unbounded ? 1e9 : 3 * s->timeout_s;
  PollSchedule naps;  // a wait of seconds: sleep, do not spin (the compute thread waits here)
  naps.spins = 0;
  naps.yields = 0;
  naps.first_nap = std::chrono::microseconds(200);
  naps.nap_step = std::chrono::microseconds(200);
  naps.sleep_cap = std::chrono::microseconds(5000);
  auto after = [&](double seconds) {
    return s->started + std::chrono::duration_cast<clock_type::duration>(
                            std::chrono::duration<double>(std::min(seconds, 3.15e7)));
  };
  const double write_bound_s = unbounded ? 1e9 : s->timeout_s + kWriteReportSlackS;
  if (!poll_until(after(write_bound_s), [&] { return s->written.load(); }, {}, naps)) {
    fail_hung_write(write_bound_text(s->timeout_s).c_str());
  }
  if (!poll_until(after(bound_s), [&] { return s->done.load(); }, {}, naps)) {
    fail_hung_write(("3 x dist.timeout_s = " + fmt::format("{}", bound_s) + " s (the write, then the commit's "
                     "collectives)").c_str());
  }
  state_.reset();
  s->thread.join();
  const double waited = since(t0);
  totals_.write_s += s->write_s;
  if (s->error) std::rethrow_exception(s->error);
  return waited;
}

std::string AsyncCheckpointer::save(const std::string& run_dir, const TrainCounters& counters,
                                    const std::vector<ModelAndOptimizer>& models, const std::string& config_yaml,
                                    int keep_last, AsyncSaveStats* stats) {
  const auto t0 = clock_type::now();
  const bool had_one = in_flight();
  const double waited = wait();
  if (had_one && waited > 1e-3) {
    ++totals_.waits;
    totals_.waited_s += waited;
  }
  const int rank = train_comm_.rank();
  auto s = std::make_shared<State>();
  s->comm = comm_;
  s->rank = rank;
  s->timeout_s = train_comm_.timeout_s();
  // A peer may spend one timeout on its write before it joins the commit (see the header).
  comm_->set_timeout_s(2 * train_comm_.timeout_s());
  s->parts = plan_save(run_dir, counters, models, config_yaml, rank, train_comm_.world_size(), keep_last);
  prepare_tmp_dir(s->parts, train_comm_);
  const auto t_snap = clock_type::now();
  SnapshotSink sink(kind_, staging_);
  // A failure from here on still starts the thread, whose commit then fails on every rank
  // (rethrown by their next wait) instead of leaving the peers' commits waiting for this one.
  try {
    {
      torch::NoGradGuard no_grad;
      visit_rank_file(s->parts, counters, models, rank, sink);
    }
    if (kind_ == SnapshotKind::kFork) std::tie(s->child, s->pipe_fd) = fork_writer(s->parts, rank, sink.ops);
  } catch (const std::exception& e) {
    s->snapshot_error = "rank " + std::to_string(rank) + ": " + s->parts.what + " (snapshot): " + e.what();
  }
  if (kind_ == SnapshotKind::kCopy) s->ops = std::move(sink.ops);
  const double snapshot_s = since(t_snap);
  State* raw = s.get();
  s->started = clock_type::now();
  s->thread = std::thread([raw, keep = s] {
    raw->run();
    raw->done.store(true);
  });
  state_ = std::move(s);
  ++totals_.saves;
  const double stall = since(t0);
  totals_.stall_s += stall;
  if (stats) {
    stats->waited_s = had_one ? waited : 0;
    stats->snapshot_s = snapshot_s;
    stats->stall_s = stall;
    stats->staged_bytes = sink.staged_bytes;
  }
  return state_->parts.final_dir;
}

}  // namespace shardgan
