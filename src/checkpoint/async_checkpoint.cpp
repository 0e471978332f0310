#include "shardgan/checkpoint/async_checkpoint.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
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

std::string read_all(int fd) {
  std::string s;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    s.append(buf, static_cast<size_t>(n));
  }
  return s;
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
  throw std::invalid_argument("unknown snapshot kind '" + name + "' (expected fork or copy)");
}

const char* snapshot_kind_name(SnapshotKind k) { return k == SnapshotKind::kFork ? "fork" : "copy"; }

struct AsyncCheckpointer::State {
  std::shared_ptr<Communicator> comm;
  SaveParts parts;
  std::vector<FileOp> ops;  // kCopy: written by the thread
  pid_t child = -1;         // kFork: the writer process
  int pipe_fd = -1;         // kFork: its report (the rank's record as JSON, or an error)
  int rank = 0;
  std::string snapshot_error;  // the snapshot failed here: the commit fails on every rank
  std::exception_ptr error;
  double write_s = 0;
  std::thread thread;

  void run() {
    const auto t0 = clock_type::now();
    std::string error = snapshot_error;
    if (error.empty()) try {
      if (child > 0) {
        const std::string report = read_all(pipe_fd);
        ::close(pipe_fd);
        pipe_fd = -1;
        int status = 0;
        while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
        }
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

double AsyncCheckpointer::wait() {
  if (!state_) return 0;
  const auto t0 = clock_type::now();
  std::shared_ptr<State> s = std::move(state_);
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
  s->thread = std::thread([raw, keep = s] { raw->run(); });
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
