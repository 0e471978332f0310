// Saving a sharded checkpoint: the synchronous save_checkpoint and the pieces the
// asynchronous save shares with it (save_parts.h).
#include "save_parts.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>

#include <torch/torch.h>

#include "shardgan/checkpoint/shard_io.h"
#include "shardgan/comm/communicator.h"
#include "shardgan/device/host_copy.h"
#include "shardgan/optim/optimizer.h"
#include "shardgan/sharding/sharded_model.h"
#include "shardgan/util/test_control.h"

namespace shardgan {
namespace fs = std::filesystem;
using ckpt::Manifest;

namespace ckpt_detail {

h5::DType h5_type(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return h5::DType::kF32;
    case at::kDouble: return h5::DType::kF64;
    case at::kLong: return h5::DType::kI64;
    case at::kByte: return h5::DType::kU8;
    default: throw CheckpointError(std::string("cannot store dtype ") + c10::toString(t));
  }
}

// Zero-padded to 8 digits, longer past step 99,999,999.
int64_t committed_step(const std::string& n) {
  if (n.size() < 13 || n.size() > 24 || n.rfind("step-", 0) != 0) return -1;
  if (!std::all_of(n.begin() + 5, n.end(), [](char c) { return c >= '0' && c <= '9'; })) return -1;
  return std::stoll(n.substr(5));
}

bool by_step(const std::string& a, const std::string& b) { return committed_step(a) < committed_step(b); }

// So a write error on one rank ends all of them at once, instead of leaving the others in
// the next collective until its timeout.
void agree_or_throw(Communicator& comm, const std::string& error, const std::string& what) {
  at::Tensor failed = torch::zeros({comm.world_size()}, torch::kDouble);
  if (!error.empty()) failed[comm.rank()] = 1.0;
  comm.all_reduce(failed, ReduceOp::kSum);
  if (failed.sum().item<double>() == 0) return;
  if (!error.empty()) throw CheckpointError(error);
  std::string ranks;
  for (int r = 0; r < comm.world_size(); ++r) {
    if (failed[r].item<double>() != 0) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  }
  throw CheckpointError(what + " failed on rank " + ranks + " (see its message); committed checkpoints are untouched");
}

namespace {

void write_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text << "\n";
    if (!out) throw CheckpointError("cannot write '" + tmp + "'");
  }
  h5::fsync_path(tmp);
  fs::rename(tmp, path);
}

// Every rank's string, on every rank (two all-gathers: lengths, then padded bytes).
std::vector<std::string> all_gather_strings(Communicator& comm, const std::string& s) {
  const int n = comm.world_size();
  at::Tensor len = torch::tensor({static_cast<int64_t>(s.size())}, torch::kLong);
  at::Tensor lens = torch::empty({n}, torch::kLong);
  comm.all_gather(lens, len);
  const int64_t max_len = std::max<int64_t>(1, lens.max().item<int64_t>());
  at::Tensor mine = torch::zeros({max_len}, torch::kUInt8);
  std::memcpy(mine.data_ptr(), s.data(), s.size());
  at::Tensor all = torch::empty({max_len * n}, torch::kUInt8);
  comm.all_gather(all, mine);
  std::vector<std::string> out;
  for (int r = 0; r < n; ++r) {
    out.emplace_back(reinterpret_cast<const char*>(all.data_ptr<uint8_t>()) + r * max_len,
                     static_cast<size_t>(lens[r].item<int64_t>()));
  }
  return out;
}

// Deleting old checkpoints (hundreds of MB) is done off the critical path: the doomed
// directories are renamed to *.del at once (so nothing ever mistakes them for committed
// checkpoints) and removed by a background task. The next save waits for it before it
// writes anything (prepare_tmp_dir), so that the disk never holds the rotated checkpoints
// and a new one at once (the disk pre-flight counts keep + 1); process exit (the future's
// destructor) waits for it too.
std::future<void>& pending_deletion() {
  static std::future<void> f;
  return f;
}

void delete_in_background(std::vector<fs::path> dirs) {
  if (pending_deletion().valid()) pending_deletion().get();
  if (dirs.empty()) return;
  pending_deletion() = std::async(std::launch::async, [dirs = std::move(dirs)] {
    for (const auto& d : dirs) {
      std::error_code ec;
      fs::remove_all(d, ec);  // best effort; a later save retries leftovers
    }
  });
}

// Rank 0: the index is written, then the directory is committed and old ones retired.
void write_index_and_commit(SaveParts& p, const std::vector<std::string>& records) {
  Manifest& m = p.index;
  // Models in the order their leaders' records list them (every rank holds every model,
  // led by rank 0, unless the placement is split); each model's entry comes from its
  // leader, the lowest rank holding it, and the other holders add their shards.
  for (size_t r = 0; r < records.size(); ++r) {
    Manifest rec = ckpt::manifest_from_json(records[r], "rank " + std::to_string(r) + "'s record");
    for (auto& me : rec.models) {
      auto it = std::find_if(m.models.begin(), m.models.end(), [&](const ckpt::ModelEntry& e) { return e.name == me.name; });
      if (it == m.models.end()) {
        if (me.dtype.empty() && !me.units.empty()) {
          throw CheckpointError("rank " + std::to_string(r) + " is the first to hold model '" + me.name +
                                "' but is not its leader");
        }
        m.models.push_back(std::move(me));
        continue;
      }
      if (it->units.size() != me.units.size()) {
        throw CheckpointError("rank " + std::to_string(r) + " holds " + std::to_string(me.units.size()) + " units of '" +
                              me.name + "', its leader " + std::to_string(it->units.size()));
      }
      for (size_t ui = 0; ui < me.units.size(); ++ui) {
        for (const auto& sh : me.units[ui].shards) it->units[ui].shards.push_back(sh);
      }
    }
    m.files.push_back(rec.files.at(0));
  }
  ckpt::write_index(p.tmp_dir, m);
  h5::fsync_path(p.tmp_dir);
  // Commit. Saving a step again (after a resume) swaps the old directory out first; a
  // crash between the two renames leaves older checkpoints for --resume to pick.
  const std::string old_dir = p.final_dir + ".old";
  if (fs::exists(p.final_dir)) {
    fs::remove_all(old_dir);
    fs::rename(p.final_dir, old_dir);
  }
  fs::rename(p.tmp_dir, p.final_dir);
  h5::fsync_path(p.root);
  write_atomically(p.root + "/latest", p.name);
  h5::fsync_path(p.root);
  if (pending_deletion().valid()) pending_deletion().get();  // it may be deleting in root
  std::vector<std::string> committed;
  std::vector<fs::path> doomed;
  for (auto& e : fs::directory_iterator(p.root)) {
    const std::string n = e.path().filename().string();
    if (!e.is_directory() || n.rfind("step-", 0) != 0) continue;
    if (committed_step(n) >= 0) {
      committed.push_back(n);
    } else {
      doomed.push_back(e.path());  // leftovers of interrupted saves (*.tmp, *.old, *.del)
    }
  }
  std::sort(committed.begin(), committed.end(), by_step);
  for (size_t i = 0; i + std::max(p.keep_last, 1) < committed.size(); ++i) {
    const std::string from = p.root + "/" + committed[i], to = from + ".del";
    fs::rename(from, to);
    doomed.emplace_back(to);
  }
  delete_in_background(std::move(doomed));
}

// The synchronous sink: each dataset goes to the file as it comes (device shards through
// the pinned staging buffers, offloaded state one unit at a time).
class FileSink : public RankFileSink {
 public:
  explicit FileSink(ckpt::RankFileWriter& w) : w_(w) {}
  void dataset(const std::string& path, const at::Tensor& t) override {
    at::Tensor c = host_copy(t);
    w_.write(path, h5_type(c.scalar_type()), c.sizes().vec(), c.data_ptr());
  }
  void attr(const std::string& obj, const std::string& name, int64_t v, bool if_exists) override {
    if (!if_exists || w_.file().exists(obj)) w_.file().set_attr(obj, name, v);
  }

 private:
  ckpt::RankFileWriter& w_;
};

}  // namespace

SaveParts plan_save(const std::string& run_dir, const TrainCounters& counters,
                    const std::vector<ModelAndOptimizer>& models, const std::string& config_yaml,
                    int rank, int world_size, int keep_last) {
  SaveParts p;
  p.root = run_dir + "/checkpoints";
  char name[32];
  std::snprintf(name, sizeof(name), "step-%08lld", static_cast<long long>(counters.step));
  p.name = name;
  p.final_dir = p.root + "/" + p.name;
  p.tmp_dir = p.final_dir + ".tmp";
  p.what = "checkpoint save of step " + std::to_string(counters.step) + " to '" + p.final_dir + "'";
  p.step = counters.step;
  p.world_size = world_size;
  p.keep_last = keep_last;
  p.mine.schema_version = kCheckpointSchemaVersion;
  p.mine.world_size = world_size;  // a record is a manifest: its reader checks ranks against it
  if (rank != 0) return p;
  Manifest& m = p.index;
  m.schema_version = kCheckpointSchemaVersion;
  m.world_size = world_size;
  m.step = counters.step;
  m.epoch = counters.epoch;
  m.batch_in_epoch = counters.batch_in_epoch;
  m.scalars = counters.scalars;
  m.config = config_yaml;
  return p;  // the models' entries come from their leaders' records (write_index_and_commit)
}

void visit_rank_file(SaveParts& parts, const TrainCounters& counters, const std::vector<ModelAndOptimizer>& models,
                     int rank, RankFileSink& sink) {
  sink.attr("/", "schema_version", kCheckpointSchemaVersion);
  sink.attr("/", "world_size", static_cast<int64_t>(parts.world_size));
  sink.attr("/", "rank", static_cast<int64_t>(rank));
  sink.attr("/", "step", counters.step);
  for (const auto& mo : models) {
    ShardedModel& m = *mo.model;
    ckpt::ModelEntry me;
    me.name = m.name();
    const bool leader = rank == mo.leader;
    if (leader) {  // the model's entry in the index: layout, dtypes, state names, buffers
      me.stage = m.config().stage;
      me.optim_step = mo.optim ? mo.optim->step_count() : 0;
      if (!m.units().empty()) {
        me.dtype = h5::dtype_name(h5_type(m.units()[0]->master_dtype()));
        if (mo.optim) {
          // Raw states (8-bit) are stored per parameter as held; the others as flat [S].
          for (const auto& rs : mo.optim->raw_states()) {
            me.raw_states.push_back(rs.name);
            me.raw_state_maps.push_back(rs.signed_map ? "signed" : "unsigned");
          }
          if (!me.raw_states.empty()) me.raw_state_block = mo.optim->raw_state_block();
          for (const auto& n : mo.optim->state_names()) {
            if (std::find(me.raw_states.begin(), me.raw_states.end(), n) == me.raw_states.end()) {
              me.optim_states.push_back(n);
            }
          }
        }
      }
      for (auto& kv : mo.extra) me.extras.push_back(kv.first);
      for (auto& [bname, buf] : m.named_buffers()) {
        me.buffers.push_back({bname, buf.sizes().vec(), h5::dtype_name(h5_type(buf.scalar_type())), rank});
      }
    }
    // At stage 0 every rank holds every element: the leader writes them once. Under hybrid
    // sharding every replica group holds the same shards: group 0 writes them.
    const bool writes_units = m.config().stage != 0 ? m.comm().replica_rank() == 0 : leader;
    for (size_t i = 0; i < m.units().size(); ++i) {
      ShardedUnit& u = *m.units()[i];
      ckpt::UnitEntry ue;
      ue.name = u.name();
      if (leader) {
        ue.numel = u.numel();
        ue.padded_numel = u.padded_numel();
        for (const auto& s : u.slots()) ue.params.push_back({s.name, s.shape, s.offset, s.numel});
      }
      if (writes_units) {
        const std::string g = m.name() + "/units/" + u.name();
        sink.dataset(g + "/param_shard", u.master_shard());  // transient when offloaded
        if (mo.optim) {
          std::vector<std::string> raw;
          for (const auto& rs : mo.optim->raw_states()) raw.push_back(rs.name);
          if (raw.size() < mo.optim->state_names().size()) {
            mo.optim->read_unit_state(i, [&](const std::string& sname, at::Tensor& st) {
              if (std::find(raw.begin(), raw.end(), sname) == raw.end()) sink.dataset(g + "/optim/" + sname, st);
            });
          }
          mo.optim->read_unit_raw(i, [&](const std::string& state, size_t k, const std::string& part,
                                         const at::Tensor& t) {
            sink.dataset(ckpt::raw_state_dataset(m.name(), u.name(), state, u.slots()[k].name, part), t);
          });
        }
        for (auto& [ename, fn] : mo.extra) sink.dataset(g + "/" + ename, fn(i));
        sink.attr(g, "numel", u.numel());
        sink.attr(g, "padded_numel", u.padded_numel());
        sink.attr(g, "shard_offset", u.shard_offset());
        ue.shards.push_back({rank, u.shard_offset(), u.shard_numel()});
      }
      me.units.push_back(std::move(ue));
    }
    if (leader) {
      // Flat, like every shard; the manifest keeps the shape and the index views it whole.
      for (auto& [bname, buf] : m.named_buffers()) sink.dataset(m.name() + "/buffers/" + bname, buf.reshape({-1}));
    }
    sink.attr(m.name(), "optim_step", mo.optim ? mo.optim->step_count() : int64_t{0}, /*if_exists=*/true);
    sink.attr(m.name(), "stage", static_cast<int64_t>(m.config().stage), /*if_exists=*/true);
    parts.mine.models.push_back(std::move(me));
  }
  sink.dataset("rng/noise", counters.noise_rng_state);
}

void prepare_tmp_dir(const SaveParts& p, Communicator& comm) {
  std::string error;
  if (comm.rank() == 0) {
    try {
      // The last save's rotated checkpoints go first: every rank writes only after the
      // agreement below, which waits for rank 0. Control "save_skips_deletion_wait"
      // (tests/test_disk_preflight.cpp) writes while they are still being deleted.
      if (!test_control("save_skips_deletion_wait")) wait_for_checkpoint_cleanup();
      fs::remove_all(p.tmp_dir);
      fs::create_directories(p.tmp_dir);
    } catch (const std::exception& e) {
      error = "rank 0: " + p.what + ": " + e.what();
    }
  }
  agree_or_throw(comm, error, p.what);
}

void commit_save(SaveParts& p, const std::string& write_error, Communicator& comm) {
  agree_or_throw(comm, write_error, p.what);
  const std::vector<std::string> records = all_gather_strings(comm, ckpt::to_json(p.mine));
  std::string error;
  if (comm.rank() == 0) {
    try {
      write_index_and_commit(p, records);
    } catch (const std::exception& e) {
      error = "rank 0: " + p.what + " (commit): " + e.what();
    }
  }
  agree_or_throw(comm, error, p.what);
}

}  // namespace ckpt_detail

using namespace ckpt_detail;

std::string save_checkpoint(const std::string& run_dir, const TrainCounters& counters,
                            const std::vector<ModelAndOptimizer>& models,
                            const std::string& config_yaml, Communicator& comm, int keep_last,
                            SaveStats* stats) {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  const int rank = comm.rank();
  SaveParts p = plan_save(run_dir, counters, models, config_yaml, rank, comm.world_size(), keep_last);
  prepare_tmp_dir(p, comm);
  std::string error;
  try {
    ckpt::RankFileWriter w(p.tmp_dir, rank);
    FileSink sink(w);
    visit_rank_file(p, counters, models, rank, sink);
    p.mine.files.push_back(w.finish());
    if (stats) {
      stats->bytes = p.mine.files.back().bytes;
      stats->write_s = std::chrono::duration<double>(clock::now() - t0).count();
    }
  } catch (const std::exception& e) {
    error = "rank " + std::to_string(rank) + ": " + p.what + ": " + e.what();
  }
  commit_save(p, error, comm);
  if (stats) stats->total_s = std::chrono::duration<double>(clock::now() - t0).count();
  return p.final_dir;
}

void wait_for_checkpoint_cleanup() {
  if (pending_deletion().valid()) pending_deletion().get();
}

}  // namespace shardgan
