#include "shardgan/comm/mpi_communicator.h"

#include <algorithm>
#include <cstring>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <sstream>
#include <thread>
#include <vector>

#include <torch/torch.h>

#include "progress_thread.h"
#include "reduced_float.h"
#include "shardgan/util/deadman.h"
#include "shardgan/util/poll.h"

namespace shardgan {
using detail::is_16bit_float;
namespace {

MPI_Datatype mpi_type(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return MPI_FLOAT;
    case at::kDouble: return MPI_DOUBLE;
    case at::kLong: return MPI_INT64_T;
    case at::kInt: return MPI_INT32_T;
    case at::kByte: return MPI_UINT8_T;
    // 16-bit floats travel as raw 16-bit words; reductions upcast first.
    case at::kBFloat16:
    case at::kHalf: return MPI_UINT16_T;
    default:
      throw CollectiveError(std::string("MPI backend: unsupported dtype ") + c10::toString(t));
  }
}

// The reduce-scatter's point-to-point messages; no other point-to-point traffic uses the
// communicators this backend runs on (collectives have a context of their own).
constexpr int kReduceScatterTag = 0x5247;
constexpr int kAllToAllTag = 0x4141;
constexpr int kSendRecvTag = 0x5052;

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return MPI_SUM;  // kAvg divides afterwards
    case ReduceOp::kMax: return MPI_MAX;
  }
  return MPI_SUM;
}

void check_cpu_contiguous(const at::Tensor& t, const char* op, const char* arg, int rank) {
  if (!t.defined() || !t.is_contiguous() || !t.device().is_cpu()) {
    std::ostringstream s;
    s << op << " on rank " << rank << ": argument '" << arg
      << "' must be a defined, contiguous CPU tensor (the MPI backend handles CPU tensors only)";
    throw CollectiveError(s.str());
  }
}

std::string describe(const char* op, int rank, int world, const at::Tensor& t) {
  std::ostringstream s;
  s << op << " (rank " << rank << " of " << world << ", numel " << t.numel() << ", dtype "
    << c10::toString(t.scalar_type()) << ", " << t.numel() * t.element_size() << " bytes)";
  return s.str();
}

// Keeps `buffers` (and whatever `extra` owns) allocated until the process ends: the error
// path of a wait that left its requests in flight, which may still write them (the progress
// thread, or the next MPI call of this rank, keeps driving them) until MPI_Abort.
void keep_until_exit(std::vector<at::Tensor> buffers, std::function<void()> extra = nullptr) {
  new std::vector<at::Tensor>(std::move(buffers));      // NOLINT: deliberate leak
  if (extra) new std::function<void()>(std::move(extra));  // NOLINT: deliberate leak
}

// Runs `wait`; if it throws (a timeout, an MPI error), keeps `buffers` for the requests it
// left in flight, then rethrows.
template <class Wait>
void wait_keeping(std::vector<at::Tensor> buffers, Wait&& wait) {
  try {
    wait();
  } catch (...) {
    keep_until_exit(std::move(buffers));
    throw;
  }
}

}  // namespace

class MpiWork final : public Work {
 public:
  /// `buffers`: every tensor the requests read or write; `on_done` (may own more) runs after
  /// they complete.
  MpiWork(MpiCommunicator& comm, std::vector<MPI_Request> reqs, std::string what, std::vector<at::Tensor> buffers,
          std::function<void()> on_done = nullptr)
      : comm_(comm), reqs_(std::move(reqs)), what_(std::move(what)), buffers_(std::move(buffers)),
        on_done_(std::move(on_done)), progress_(comm.progress_) {
    if (progress_) progress_->begin();
  }
  MpiWork(MpiCommunicator& comm, MPI_Request req, std::string what, std::vector<at::Tensor> buffers,
          std::function<void()> on_done = nullptr)
      : MpiWork(comm, std::vector<MPI_Request>{req}, std::move(what), std::move(buffers), std::move(on_done)) {}
  ~MpiWork() override {
    if (state_ != State::kInFlight) return;
    if (std::uncaught_exceptions() > 0) {
      // The error path: this rank is unwinding to its top-level handler, which ends the job
      // with MPI_Abort. Waiting here could take dist.timeout_s (the peers may be blocked on
      // this very rank), so leave the requests in flight, with their buffers.
      std::fprintf(stderr, "shardgan: rank %d leaves %s in flight on an error path\n", comm_.rank(), what_.c_str());
      abandon();
      return;
    }
    try {
      wait();
    } catch (...) {  // never throw from a destructor; the error surfaces elsewhere
    }
  }
  void wait() override {
    if (state_ != State::kInFlight) return;
    try {
      comm_.wait(reqs_, what_);  // on a throw the job ends (MPI_Abort); the thread may poll on
    } catch (...) {
      abandon();
      throw;
    }
    state_ = State::kDone;
    if (progress_) progress_->end();
    buffers_.clear();
    if (on_done_) on_done_();
  }

 private:
  enum class State { kInFlight, kDone, kAbandoned };
  // The requests stay in flight (nothing cancels them; MPI_Cancel of a collective is not
  // allowed): their buffers, and `on_done` with the ones it owns, are kept until the process
  // ends. A later wait() returns at once.
  void abandon() {
    state_ = State::kAbandoned;
    keep_until_exit(std::move(buffers_), std::move(on_done_));
  }

  MpiCommunicator& comm_;
  std::vector<MPI_Request> reqs_;
  std::string what_;
  std::vector<at::Tensor> buffers_;  // what the requests read and write, until they complete
  std::function<void()> on_done_;    // the local reduction and averaging; owns its buffers
  std::shared_ptr<ProgressThread> progress_;  // polls while these requests are in flight
  State state_ = State::kInFlight;
};

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
  }
  return "?";
}

MpiCommunicator::MpiCommunicator(MPI_Comm comm, double timeout_s, std::string name)
    : comm_(comm), name_(std::move(name)) {
  timeout_s_ = timeout_s;
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &world_size_);
  // Errors come back as return codes (check(), wait()): MPI_ERRORS_ARE_FATAL would end the
  // job inside MPI with no word of which transfer failed.
  check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
}

namespace {

std::string mpi_error_text(int code) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, msg, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(msg, static_cast<size_t>(len));
}

}  // namespace

void MpiCommunicator::fail(int rc, const std::string& call, int peer) const {
  std::ostringstream s;
  s << call << " failed on rank " << rank_ << " of the " << name_ << " communicator (" << world_size_ << " ranks";
  if (!host_.empty()) s << "; this is " << host_;
  s << ")";
  if (peer >= 0) s << ", peer rank " << peer;
  s << ": " << mpi_error_text(rc);
  throw CollectiveError(s.str());
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owns_comm_ && !finalized) MPI_Comm_free(&comm_);
}

std::unique_ptr<Communicator> MpiCommunicator::split(int color, int key) {
  if (color < 0) throw CollectiveError("split on rank " + std::to_string(rank_) + ": color " + std::to_string(color) + " < 0");
  barrier();
  MPI_Comm sub = MPI_COMM_NULL;
  {
    // MPI_Comm_split blocks, with no request to time out: a peer lost between the barrier
    // and the split (a host cut off) would hold this rank forever. The deadline ends the
    // process instead, naming the call (found by benchmarks/chaos.sh's link cuts).
    Deadman deadline("MPI_Comm_split (color " + std::to_string(color) + ") of the " + name_ + " communicator",
                     timeout_s_, "dist.timeout_s");
    check(MPI_Comm_split(comm_, color, key, &sub), "MPI_Comm_split (color " + std::to_string(color) + ")");
  }
  if (sub == MPI_COMM_NULL) {
    throw CollectiveError("MPI_Comm_split on rank " + std::to_string(rank_) + " of the " + name_ +
                          " communicator (color " + std::to_string(color) + ") gave no communicator");
  }
  auto c = std::make_unique<MpiCommunicator>(sub, timeout_s_, name_ + " split " + std::to_string(color));
  c->owns_comm_ = true;
  c->max_count_ = max_count_;
  c->progress_ = progress_;
  c->learn_hosts();
  return c;
}

void MpiCommunicator::enable_progress_thread(double interval_us) {
  if (!(interval_us >= 1)) {
    throw CollectiveError("progress thread on rank " + std::to_string(rank_) + ": interval " +
                          std::to_string(interval_us) + " us (must be >= 1)");
  }
  progress_.reset();  // join a previous one first
  progress_ = std::make_shared<ProgressThread>(
      comm_, std::chrono::microseconds(static_cast<int64_t>(interval_us)), timeout_s_);
}

int64_t MpiCommunicator::progress_polls() const { return progress_ ? progress_->polls() : 0; }

void MpiCommunicator::learn_hosts() {
  // One record per rank: its MPI_COMM_WORLD rank (decimal) and its host name.
  constexpr int kRank = 16, kRecord = kRank + MPI_MAX_PROCESSOR_NAME;
  // This rank's record, then every rank's: one heap buffer, kept if the wait throws.
  at::Tensor buf = at::zeros({static_cast<int64_t>(world_size_ + 1) * kRecord}, at::kChar);
  char* mine = static_cast<char*>(buf.data_ptr());
  char* all = mine + kRecord;
  int world_rank = 0, len = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  std::snprintf(mine, kRank, "%d", world_rank);
  MPI_Get_processor_name(mine + kRank, &len);
  MPI_Request req;
  check(MPI_Iallgather(mine, kRecord, MPI_CHAR, all, kRecord, MPI_CHAR, comm_, &req), "MPI_Iallgather (host names)");
  wait_keeping({buf}, [&] { wait(req, "host name all-gather"); });
  host_ = "world rank " + std::to_string(world_rank) + " on " + std::string(mine + kRank);
  // Ranks in a row on one host form one entry, their world ranks as ranges:
  // "world ranks 0-1 on a, 2-3 on b" (or "world ranks 0 on a, 2 on b" for a split group).
  auto world_of = [&](int r) { return std::atoi(&all[static_cast<size_t>(r) * kRecord]); };
  auto host_of = [&](int r) { return std::string(&all[static_cast<size_t>(r) * kRecord + kRank]); };
  std::ostringstream s;
  s << "world ranks ";
  for (int r = 0; r < world_size_;) {
    const std::string h = host_of(r);
    if (r > 0) s << ", ";
    int e = r;
    while (e < world_size_ && host_of(e) == h) {
      int f = e;  // world ranks e..f consecutive
      while (f + 1 < world_size_ && host_of(f + 1) == h && world_of(f + 1) == world_of(f) + 1) ++f;
      s << (e > r ? "," : "") << world_of(e);
      if (f > e) s << "-" << world_of(f);
      e = f + 1;
    }
    s << " on " << h;
    r = e;
  }
  hosts_ = s.str();
}

void MpiCommunicator::wait(MPI_Request& req, const std::string& what) {
  std::vector<MPI_Request> one{req};
  wait(one, what);
  req = one[0];
}

void MpiCommunicator::wait(std::vector<MPI_Request>& reqs, const std::string& what) {
  std::vector<MPI_Status> statuses(reqs.size());
  auto test_all = [&] {
    int flag = 0;
    const int rc = MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &flag, statuses.data());
    if (rc == MPI_ERR_IN_STATUS) {  // a request completed in error: name it and its peer
      for (const MPI_Status& st : statuses) {
        if (st.MPI_ERROR != MPI_SUCCESS && st.MPI_ERROR != MPI_ERR_PENDING) {
          check(st.MPI_ERROR, what, st.MPI_SOURCE >= 0 ? st.MPI_SOURCE : -1);
        }
      }
    }
    check(rc, what);
    return flag != 0;
  };
  // Up to kTestsPerPoll calls per poll: Open MPI's MPI_Testall looks at the requests again
  // after its progress call only when that call counted events, which libnbc's rounds do
  // not, and a collective advances one round per call (a 2-rank all-reduce needs 3). With
  // one call per poll, each round after the data arrived cost another nap: on an idle rank
  // a 2-rank barrier returned ~40 us and a one-float all-reduce ~75 us later than with 4
  // (tests/test_poll.cpp).
  constexpr int kTestsPerPoll = 4;
  const bool done = poll_until(deadline_after(timeout_s_), [&] {
    for (int i = 0; i < kTestsPerPoll; ++i) {
      if (test_all()) return true;
    }
    return false;
  });
  if (done) return;
  std::ostringstream s;
  s << what << " timed out after " << timeout_s_ << " s: a peer rank never joined or died";
  if (!hosts_.empty()) s << " (this is " << host_ << "; this collective's ranks: " << hosts_ << ")";
  s << ". HINT: check that every rank calls the same collectives in the same order and that "
       "the hosts reach each other, or raise dist.timeout_s";
  throw CollectiveTimeout(s.str());
}

namespace {

// A committed datatype of `n` elements of `base` (n may exceed INT_MAX): q blocks of `chunk`
// elements (chunk <= INT_MAX) then the remainder, as one struct whose extent is exactly n
// elements. The large-count technique of BigMPI (Hammond et al., "To INT_MAX... and
// beyond!", ExaMPI 2014): the counts stay ints, no buffer is copied.
MPI_Datatype large_contiguous(int64_t n, int64_t chunk, MPI_Datatype base, int64_t elem_bytes) {
  const int64_t q = n / chunk, r = n % chunk;
  MPI_Datatype block, body, rest, out;
  MPI_Type_contiguous(static_cast<int>(chunk), base, &block);
  MPI_Type_contiguous(static_cast<int>(q), block, &body);
  int lens[2] = {1, 1};
  MPI_Aint disp[2] = {0, static_cast<MPI_Aint>(q * chunk * elem_bytes)};
  MPI_Datatype types[2] = {body, base};
  if (r > 0) {
    MPI_Type_contiguous(static_cast<int>(r), base, &rest);
    types[1] = rest;
  }
  MPI_Type_create_struct(r > 0 ? 2 : 1, lens, disp, types, &out);
  MPI_Type_commit(&out);
  MPI_Type_free(&block);
  MPI_Type_free(&body);
  if (r > 0) MPI_Type_free(&rest);
  return out;
}

// The direct exchange that reduce_scatter_async and all_to_all_async post (every pair at
// once, peers in the order r+1, r+2, ...): block q of `in` (contiguous 1-D, s elements per
// block) goes to rank q with `tag`, and rank `from`'s block for this rank arrives at
// recv_at(from). Blocks above max_count elements travel as one large_contiguous element.
std::vector<MPI_Request> post_block_exchange(const MpiCommunicator& c, int n, int tag, const at::Tensor& in,
                                             int64_t s, int64_t max_count,
                                             const std::function<void*(int from)>& recv_at) {
  const MPI_Comm comm = c.comm();
  const int rank = c.rank();
  MPI_Datatype base = mpi_type(in.scalar_type());
  const bool large = s > max_count;
  MPI_Datatype block = large ? large_contiguous(s, max_count, base, in.element_size()) : base;
  const int count = large ? 1 : static_cast<int>(s);
  std::vector<MPI_Request> reqs;
  reqs.reserve(2 * static_cast<size_t>(std::max(n - 1, 0)));
  const auto* src = static_cast<const char*>(in.data_ptr());
  const int64_t block_bytes = s * in.element_size();
  for (int k = 1; k < n; ++k) {
    const int to = (rank + k) % n, from = (rank - k + n) % n;
    MPI_Request rr, sr;
    c.check(MPI_Irecv(recv_at(from), count, block, from, tag, comm, &rr), "MPI_Irecv", from);
    c.check(MPI_Isend(src + to * block_bytes, count, block, to, tag, comm, &sr), "MPI_Isend", to);
    reqs.push_back(rr);
    reqs.push_back(sr);
  }
  if (large) MPI_Type_free(&block);
  return reqs;
}

}  // namespace

MPI_Request MpiCommunicator::start_all_gather(at::Tensor& full, const at::Tensor& shard) {
  check_cpu_contiguous(full, "all_gather", "full", rank_);
  check_cpu_contiguous(shard, "all_gather", "shard", rank_);
  check_block_sizes("all_gather", full, shard);
  stats_.all_gather_calls++;
  stats_.all_gather_bytes += full.numel() * full.element_size();
  MPI_Datatype dt = mpi_type(shard.scalar_type());
  // `shard` may be this rank's block of `full` itself (ZeRO-1/2 keep the owned partition
  // inside the full parameter); MPI forbids overlapping buffers, so use MPI_IN_PLACE.
  const bool in_place = static_cast<const char*>(shard.data_ptr()) ==
                        static_cast<const char*>(full.data_ptr()) + rank_ * shard.numel() * shard.element_size();
  // Above max_count_ elements per rank: one element per rank of a derived type as large
  // as the shard, no staging copy (a split used to stage world_size x max_count elements
  // per call, as much as the tensor itself at exactly the sizes where memory is tight).
  // MPI lets the type be freed once the operation has started.
  const bool large = shard.numel() > max_count_;
  const int count = large ? 1 : static_cast<int>(shard.numel());
  if (large) dt = large_contiguous(shard.numel(), max_count_, dt, shard.element_size());
  MPI_Request req;
  const int rc = MPI_Iallgather(in_place ? MPI_IN_PLACE : shard.data_ptr(), count, dt, full.data_ptr(), count, dt,
                                comm_, &req);
  if (large) MPI_Type_free(&dt);
  check(rc, "MPI_Iallgather");
  return req;
}

void MpiCommunicator::all_gather(at::Tensor& full, const at::Tensor& shard) {
  MPI_Request req = start_all_gather(full, shard);
  wait_keeping({full, shard}, [&] { wait(req, describe("all_gather", rank_, world_size_, full)); });
}


std::unique_ptr<Work> MpiCommunicator::all_gather_async(at::Tensor& full, const at::Tensor& shard) {
  MPI_Request req = start_all_gather(full, shard);
  return std::make_unique<MpiWork>(*this, req, describe("all_gather (prefetch)", rank_, world_size_, full),
                                   std::vector<at::Tensor>{full, shard});
}

std::unique_ptr<Work> MpiCommunicator::reduce_scatter_async(at::Tensor& shard, const at::Tensor& full,
                                                           ReduceOp op) {
  check_cpu_contiguous(full, "reduce_scatter", "full", rank_);
  check_cpu_contiguous(shard, "reduce_scatter", "shard", rank_);
  check_block_sizes("reduce_scatter", full, shard);
  stats_.reduce_scatter_calls++;
  stats_.reduce_scatter_bytes += full.numel() * full.element_size();
  // Direct exchange (the pairwise-exchange reduce-scatter of Thakur, Rabenseifner and Gropp,
  // "Optimization of Collective Communication Operations in MPICH", IJHPCA 2005, Sec. 4.5,
  // with every pair posted at once): block q of `full` goes to rank q, the N - 1 blocks
  // for this rank arrive in its own dtype, and wait() adds them in rank order. Each rank
  // sends and receives (N - 1) / N of the tensor and reduces only its own block, where
  // Open MPI's MPI_Ireduce_scatter_block (libnbc) reduces the whole tensor on rank 0 and
  // scatters it (rank 0 does N times the work while the others wait), and 16-bit blocks
  // travel as 16 bits instead of being upcast to float32 before the call.
  const int64_t s = shard.numel();
  const int n = world_size_;
  at::Tensor recv = at::empty({std::max(n - 1, 0), s}, full.options());
  // Row k-1 of `recv` holds the block of rank (rank - k) mod n.
  std::vector<MPI_Request> reqs = post_block_exchange(
      *this, n, kReduceScatterTag, full, s, max_count_,
      [&](int from) { return recv[(rank_ - from + n) % n - 1].data_ptr(); });
  at::Tensor own = full.narrow(0, rank_ * s, s), dst = shard;
  const int me = rank_;
  // Every rank's block in rank order: own at position `me`, rank q's in recv row (me - q) mod n - 1.
  auto finish = [recv, own, dst, op, n, me]() mutable {
    torch::NoGradGuard no_grad;
    auto block_of = [&](int q) { return q == me ? own : recv[(me - q + n) % n - 1]; };
    if (op == ReduceOp::kMax) {  // exact in every dtype
      dst.copy_(block_of(0));
      for (int q = 1; q < n; ++q) at::maximum_out(dst, dst, block_of(q));
    } else if (n == 1) {
      if (dst.data_ptr() != own.data_ptr()) dst.copy_(own);
    } else if (!is_16bit_float(dst) || (n == 2 && !(op == ReduceOp::kAvg && dst.scalar_type() == at::kHalf))) {
      // Two 16-bit blocks: ATen adds bfloat16 and float16 in float32 and rounds once, as the
      // float32 staging did; halving is exact. Not a float16 average: its rounded sum
      // overflows at 65504 where the average fits, so that one takes the float32 path below.
      at::add_out(dst, block_of(0), block_of(1));
      for (int q = 2; q < n; ++q) dst.add_(block_of(q));
      if (op == ReduceOp::kAvg) dst.div_(n);
    } else {  // more 16-bit blocks, or a float16 average: sum (and scale) in float32, round once
      at::Tensor acc = block_of(0).to(at::kFloat), up = at::empty_like(acc);
      for (int q = 1; q < n; ++q) acc.add_(up.copy_(block_of(q)));
      if (op == ReduceOp::kAvg) acc.div_(n);
      dst.copy_(acc);
    }
    recv = at::Tensor();
  };
  return std::make_unique<MpiWork>(*this, std::move(reqs), describe("reduce_scatter", rank_, world_size_, full),
                                   std::vector<at::Tensor>{full, shard, recv}, std::move(finish));
}

std::unique_ptr<Work> MpiCommunicator::all_to_all_async(at::Tensor& out, const at::Tensor& in) {
  check_cpu_contiguous(in, "all_to_all", "in", rank_);
  check_cpu_contiguous(out, "all_to_all", "out", rank_);
  const int n = world_size_;
  if (in.numel() != out.numel() || in.scalar_type() != out.scalar_type() || in.numel() % n != 0 ||
      in.data_ptr() == out.data_ptr()) {
    throw CollectiveError(describe("all_to_all", rank_, n, in) + ": out must be another tensor of the same numel "
                          "and dtype, divisible by the world size (got " + std::to_string(out.numel()) + ")");
  }
  stats_.all_to_all_calls++;
  stats_.all_to_all_bytes += in.numel() * in.element_size();
  const int64_t s = in.numel() / n, block_bytes = s * in.element_size();
  auto* dst = static_cast<char*>(out.data_ptr());
  std::memcpy(dst + rank_ * block_bytes, static_cast<const char*>(in.data_ptr()) + rank_ * block_bytes,
              static_cast<size_t>(block_bytes));
  std::vector<MPI_Request> reqs = post_block_exchange(*this, n, kAllToAllTag, in, s, max_count_,
                                                      [&](int from) { return dst + from * block_bytes; });
  return std::make_unique<MpiWork>(*this, std::move(reqs), describe("all_to_all", rank_, n, in),
                                   std::vector<at::Tensor>{out, in});
}

std::unique_ptr<Work> MpiCommunicator::send_recv_async(const std::vector<PeerBuffer>& sends,
                                                       const std::vector<PeerBuffer>& recvs) {
  std::vector<MPI_Request> reqs;
  std::vector<MPI_Datatype> types;  // freed once posted (MPI keeps its own reference)
  std::string what = "send_recv on rank " + std::to_string(rank_) + " (peers";
  auto post = [&](const PeerBuffer& b, bool send) {
    check_cpu_contiguous(b.t, "send_recv", send ? "send" : "recv", rank_);
    if (b.peer < 0 || b.peer >= world_size_ || b.peer == rank_) {
      throw CollectiveError("send_recv on rank " + std::to_string(rank_) + ": peer " + std::to_string(b.peer) +
                            " is not another rank of " + std::to_string(world_size_));
    }
    what += " " + std::to_string(b.peer);
    const int64_t s = b.t.numel();
    MPI_Datatype base = mpi_type(b.t.scalar_type());
    const bool large = s > max_count_;
    MPI_Datatype dt = large ? large_contiguous(s, max_count_, base, b.t.element_size()) : base;
    if (large) types.push_back(dt);
    MPI_Request r;
    if (send) {
      check(MPI_Isend(b.t.data_ptr(), large ? 1 : static_cast<int>(s), dt, b.peer, kSendRecvTag, comm_, &r),
            "MPI_Isend", b.peer, s * b.t.element_size());
      stats_.sent_bytes += s * b.t.element_size();
    } else {
      check(MPI_Irecv(b.t.data_ptr(), large ? 1 : static_cast<int>(s), dt, b.peer, kSendRecvTag, comm_, &r),
            "MPI_Irecv", b.peer, s * b.t.element_size());
    }
    reqs.push_back(r);
  };
  for (const auto& b : recvs) post(b, false);
  for (const auto& b : sends) post(b, true);
  for (MPI_Datatype& t : types) MPI_Type_free(&t);
  stats_.send_recv_calls++;
  std::vector<at::Tensor> buffers;
  for (const auto& b : recvs) buffers.push_back(b.t);
  for (const auto& b : sends) buffers.push_back(b.t);
  return std::make_unique<MpiWork>(*this, std::move(reqs), what + ")", std::move(buffers));
}

void MpiCommunicator::reduce_scatter(at::Tensor& shard, const at::Tensor& full, ReduceOp op) {
  reduce_scatter_async(shard, full, op)->wait();
}

void MpiCommunicator::all_reduce(at::Tensor& t, ReduceOp op) {
  check_cpu_contiguous(t, "all_reduce", "t", rank_);
  stats_.all_reduce_calls++;
  stats_.all_reduce_bytes += t.numel() * t.element_size();
  const bool up = is_16bit_float(t);
  at::Tensor buf = up ? t.to(at::kFloat) : t;
  for (int64_t a = 0; a < buf.numel(); a += max_count_) {  // one call unless above max_count_
    at::Tensor part = buf.view({-1}).narrow(0, a, std::min(max_count_, buf.numel() - a));
    MPI_Request req;
    check(MPI_Iallreduce(MPI_IN_PLACE, part.data_ptr(), static_cast<int>(part.numel()),
                         mpi_type(buf.scalar_type()), mpi_op(op), comm_, &req),
          "MPI_Iallreduce");
    wait_keeping({buf}, [&] { wait(req, describe("all_reduce", rank_, world_size_, t)); });
  }
  if (op == ReduceOp::kAvg) buf.div_(world_size_);
  if (up) t.copy_(buf);
}

void MpiCommunicator::broadcast(at::Tensor& t, int root) {
  check_cpu_contiguous(t, "broadcast", "t", rank_);
  if (root < 0 || root >= world_size_) {
    throw CollectiveError("broadcast on rank " + std::to_string(rank_) + ": root " +
                          std::to_string(root) + " is outside [0, world size)");
  }
  stats_.broadcast_calls++;
  stats_.broadcast_bytes += t.numel() * t.element_size();
  for (int64_t a = 0; a < t.numel(); a += max_count_) {  // one call unless above max_count_
    at::Tensor part = t.view({-1}).narrow(0, a, std::min(max_count_, t.numel() - a));
    MPI_Request req;
    check(MPI_Ibcast(part.data_ptr(), static_cast<int>(part.numel()), mpi_type(t.scalar_type()), root, comm_, &req),
          "MPI_Ibcast", root);
    wait_keeping({t}, [&] { wait(req, describe("broadcast", rank_, world_size_, t)); });
  }
}

void MpiCommunicator::barrier() {
  stats_.barrier_calls++;
  MPI_Request req;
  check(MPI_Ibarrier(comm_, &req), "MPI_Ibarrier");
  wait(req, "barrier (rank " + std::to_string(rank_) + " of " + std::to_string(world_size_) + ")");
}

void MpiCommunicator::poll() {
  int flag = 0;
  MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm_, &flag, MPI_STATUS_IGNORE);
}

}  // namespace shardgan
