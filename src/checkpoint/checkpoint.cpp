#include "shardgan/checkpoint/checkpoint.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>

#include <torch/torch.h>

#include "shardgan/h5/h5.h"
#include "shardgan/checkpoint/shard_io.h"
#include "shardgan/comm/communicator.h"
#include "shardgan/device/host_copy.h"
#include "shardgan/optim/optimizer.h"
#include "shardgan/sharding/sharded_model.h"

namespace shardgan {
namespace fs = std::filesystem;
using ckpt::Manifest;
namespace {

h5::DType h5_type(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return h5::DType::kF32;
    case at::kDouble: return h5::DType::kF64;
    case at::kLong: return h5::DType::kI64;
    case at::kByte: return h5::DType::kU8;
    default: throw CheckpointError(std::string("cannot store dtype ") + c10::toString(t));
  }
}

h5::DType h5_type(const at::Tensor& t) { return h5_type(t.scalar_type()); }

void put(ckpt::RankFileWriter& w, const std::string& path, const at::Tensor& t) {
  // Device shards come to the host through the pinned staging buffers, in chunks.
  at::Tensor c = host_copy(t);
  w.write(path, h5_type(c), c.sizes().vec(), c.data_ptr());
}

// The step of a committed checkpoint directory "step-" + at least 8 digits (zero-padded to 8,
// longer past step 99,999,999), or -1 for anything else (*.tmp, *.old, *.del leftovers).
int64_t committed_step(const std::string& n) {
  if (n.size() < 13 || n.size() > 24 || n.rfind("step-", 0) != 0) return -1;
  if (!std::all_of(n.begin() + 5, n.end(), [](char c) { return c >= '0' && c <= '9'; })) return -1;
  return std::stoll(n.substr(5));
}

// Orders committed directory names by step, not by string (step-100000000 after step-99999999).
bool by_step(const std::string& a, const std::string& b) { return committed_step(a) < committed_step(b); }

// Collective (one all-reduce). Every rank passes its own error ("" if none); if any rank
// failed, every rank throws: the failing ones their own message, the others one naming the
// failed ranks. So a write error on one rank ends all of them at once, instead of leaving
// the others in the next collective until its timeout.
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

void check_model_matches(const ckpt::ModelEntry& me, ShardedModel& m, const std::string& dir) {
  auto differ = [&](const std::string& what) {
    throw CheckpointError("checkpoint '" + dir + "': " + m.name() + " " + what +
                          ". Resume with the model config the checkpoint was written with "
                          "(`shardgan-ckpt info` prints it).");
  };
  if (me.units.size() != m.units().size()) {
    differ("has " + std::to_string(me.units.size()) + " units there, " + std::to_string(m.units().size()) + " here");
  }
  for (size_t i = 0; i < me.units.size(); ++i) {
    const ckpt::UnitEntry& ue = me.units[i];
    ShardedUnit& u = *m.units()[i];
    if (ue.name != u.name() || ue.numel != u.numel() || ue.params.size() != u.slots().size()) {
      differ("unit " + std::to_string(i) + " is '" + ue.name + "' with " + std::to_string(ue.numel) +
             " elements there, '" + u.name() + "' with " + std::to_string(u.numel()) + " here");
    }
    for (size_t p = 0; p < ue.params.size(); ++p) {
      const auto& s = u.slots()[p];
      if (ue.params[p].name != s.name || ue.params[p].shape != s.shape || ue.params[p].offset != s.offset) {
        differ("parameter '" + ue.name + "." + ue.params[p].name + "' differs in name, shape or position");
      }
    }
  }
  if (!m.units().empty() && me.dtype != h5::dtype_name(h5_type(m.units()[0]->master_dtype()))) {
    differ("was saved in " + me.dtype + ", this run's master dtype is " +
           std::string(c10::toString(m.units()[0]->master_dtype())));
  }
}

// Fills `t` (1-D, this rank's S elements) with global flat elements [lo, lo + S) of `kind`;
// elements at or past the unit's numel are padding and become 0.
void read_owned(ckpt::CheckpointReader& rd, const ckpt::ModelEntry& me, const ckpt::UnitEntry& ue,
                const std::string& kind, int64_t lo, at::Tensor t) {
  const int64_t s = t.numel(), hi = std::min(lo + s, ue.numel);
  // HDF5 reads into host memory; a device tensor is filled from a host copy in chunks.
  const bool direct = t.device().is_cpu() && t.is_contiguous();
  at::Tensor c = direct ? t : torch::empty({s}, t.options().device(at::kCPU));
  if (hi > lo) rd.read_flat(me, ue, kind, lo, hi, c.data_ptr());
  const int64_t got = std::max<int64_t>(0, hi - lo);
  if (got < s) c.narrow(0, got, s - got).zero_();
  if (direct) return;
  if (t.is_contiguous()) {
    copy_from_host(c, t);
  } else {
    t.copy_(c);
  }
}

void load_local(const std::string& dir, TrainCounters& counters, const std::vector<ModelAndOptimizer>& models,
                Communicator& comm) {
  ckpt::CheckpointReader rd(dir);
  const Manifest& m = rd.manifest();
  torch::NoGradGuard no_grad;
  for (const auto& mo : models) {
    ShardedModel& model = *mo.model;
    const ckpt::ModelEntry* me = m.model(model.name());
    if (!me) throw CheckpointError("checkpoint '" + dir + "' holds no model '" + model.name() + "'");
    check_model_matches(*me, model, dir);
    for (size_t i = 0; i < model.units().size(); ++i) {
      ShardedUnit& u = *model.units()[i];
      const ckpt::UnitEntry& ue = me->units[i];
      const int64_t lo = u.shard_offset();
      if (u.shard_offloaded()) {
        // Parameter offload: one unit's shard at a time, through a transient tensor.
        at::Tensor t = torch::empty({u.shard_numel()}, torch::TensorOptions().dtype(u.master_dtype()));
        read_owned(rd, *me, ue, "param_shard", lo, t);
        u.set_master_shard(t);
      } else {
        read_owned(rd, *me, ue, "param_shard", lo, u.shard());
      }
      if (mo.optim) {
        // Offloaded state is filled in a transient tensor and streamed to its tier.
        mo.optim->write_unit_state(i, [&](const std::string& sname, at::Tensor& st) {
          if (std::find(me->optim_states.begin(), me->optim_states.end(), sname) == me->optim_states.end()) {
            throw CheckpointError("checkpoint '" + dir + "' has no optimizer state '" + sname + "' for " +
                                  model.name() + " (saved with another optimizer?)");
          }
          read_owned(rd, *me, ue, "optim/" + sname, lo, st);
        });
      }
      for (auto& [ename, fn] : mo.extra) {
        if (std::find(me->extras.begin(), me->extras.end(), ename) == me->extras.end()) {
          throw CheckpointError("checkpoint '" + dir + "' has no '" + ename + "' state for " + model.name());
        }
        read_owned(rd, *me, ue, ename, lo, fn(i));
      }
    }
    for (auto& [bname, buf] : model.named_buffers()) {
      const ckpt::BufferEntry* be = nullptr;
      for (const auto& b : me->buffers) {
        if (b.name == bname) be = &b;
      }
      if (!be) throw CheckpointError("checkpoint '" + dir + "' has no buffer '" + model.name() + "." + bname + "'");
      if (be->dtype != h5::dtype_name(h5_type(buf))) {
        throw CheckpointError("checkpoint '" + dir + "': buffer '" + bname + "' is " + be->dtype + " there");
      }
      at::Tensor c = buf.device().is_cpu() ? buf.contiguous() : torch::empty(buf.sizes(), buf.options().device(at::kCPU));
      rd.read_dataset(be->rank, model.name() + "/buffers/" + bname, c.data_ptr(), c.numel());
      if (!c.is_same(buf)) buf.copy_(c);
    }
    if (mo.optim) mo.optim->set_step_count(me->optim_step);
  }
  counters.step = m.step;
  counters.epoch = m.epoch;
  counters.batch_in_epoch = m.batch_in_epoch;
  for (const auto& [k, v] : m.scalars) counters.scalars[k] = v;
  // The noise generator's state is global (identical on every rank); any file has it.
  const int src = comm.rank() % static_cast<int>(m.world_size);
  const auto& ds = m.file(src).datasets;
  auto it = ds.find("rng/noise");
  if (it == ds.end()) throw CheckpointError("checkpoint '" + dir + "': no rng/noise in rank " + std::to_string(src));
  counters.noise_rng_state = torch::empty({it->second.numel}, torch::kUInt8);
  rd.read_dataset(src, "rng/noise", counters.noise_rng_state.data_ptr(), it->second.numel);
}

// Deleting old checkpoints (hundreds of MB) is done off the critical path: the doomed
// directories are renamed to *.del at once (so nothing ever mistakes them for committed
// checkpoints) and removed by a background task. The next save, or process exit (the
// future's destructor), waits for it.
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

}  // namespace

std::string save_checkpoint(const std::string& run_dir, const TrainCounters& counters,
                            const std::vector<ModelAndOptimizer>& models,
                            const std::string& config_yaml, Communicator& comm, int keep_last,
                            SaveStats* stats) {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  const std::string root = run_dir + "/checkpoints";
  char name[32];
  std::snprintf(name, sizeof(name), "step-%08lld", static_cast<long long>(counters.step));
  const std::string final_dir = root + "/" + name, tmp_dir = final_dir + ".tmp";
  const int rank = comm.rank();
  const std::string what = "checkpoint save of step " + std::to_string(counters.step) + " to '" + final_dir + "'";
  std::string error;
  if (rank == 0) {
    try {
      fs::remove_all(tmp_dir);
      fs::create_directories(tmp_dir);
    } catch (const std::exception& e) {
      error = "rank 0: " + what + ": " + e.what();
    }
  }
  agree_or_throw(comm, error, what);

  // This rank's file, and a record of what it holds (its part of the manifest).
  Manifest mine;
  try {
    ckpt::RankFileWriter w(tmp_dir, rank);
    h5::File& f = w.file();
    f.set_attr("/", "schema_version", kCheckpointSchemaVersion);
    f.set_attr("/", "world_size", static_cast<int64_t>(comm.world_size()));
    f.set_attr("/", "rank", static_cast<int64_t>(rank));
    f.set_attr("/", "step", counters.step);
    for (const auto& mo : models) {
      ShardedModel& m = *mo.model;
      ckpt::ModelEntry me;
      me.name = m.name();
      // At stage 0 every rank holds every element: rank 0 writes them once. Under hybrid
      // sharding every replica group holds the same shards: group 0 writes them.
      const bool writes_units = m.config().stage != 0 ? m.comm().replica_rank() == 0 : rank == 0;
      for (size_t i = 0; i < m.units().size(); ++i) {
        ShardedUnit& u = *m.units()[i];
        ckpt::UnitEntry ue;
        ue.name = u.name();
        if (writes_units) {
          const std::string g = m.name() + "/units/" + u.name();
          put(w, g + "/param_shard", u.master_shard());  // transient when offloaded
          if (mo.optim) {
            mo.optim->read_unit_state(
                i, [&](const std::string& sname, at::Tensor& st) { put(w, g + "/optim/" + sname, st); });
          }
          for (auto& [ename, fn] : mo.extra) put(w, g + "/" + ename, fn(i));
          f.set_attr(g, "numel", u.numel());
          f.set_attr(g, "padded_numel", u.padded_numel());
          f.set_attr(g, "shard_offset", u.shard_offset());
          ue.shards.push_back({rank, u.shard_offset(), u.shard_numel()});
        }
        me.units.push_back(std::move(ue));
      }
      if (rank == 0) {
        // Flat, like every shard; the manifest keeps the shape and the index views it whole.
        for (auto& [bname, buf] : m.named_buffers()) put(w, m.name() + "/buffers/" + bname, buf.reshape({-1}));
      }
      if (f.exists(m.name())) {
        f.set_attr(m.name(), "optim_step", mo.optim ? mo.optim->step_count() : int64_t{0});
        f.set_attr(m.name(), "stage", static_cast<int64_t>(m.config().stage));
      }
      mine.models.push_back(std::move(me));
    }
    put(w, "rng/noise", counters.noise_rng_state);
    mine.files.push_back(w.finish());
    if (stats) {
      stats->bytes = mine.files.back().bytes;
      stats->write_s = std::chrono::duration<double>(clock::now() - t0).count();
    }
  } catch (const std::exception& e) {
    error = "rank " + std::to_string(rank) + ": " + what + ": " + e.what();
  }
  agree_or_throw(comm, error, what);
  mine.schema_version = kCheckpointSchemaVersion;
  const std::vector<std::string> records = all_gather_strings(comm, ckpt::to_json(mine));

  if (rank == 0) try {
    Manifest m;
    m.schema_version = kCheckpointSchemaVersion;
    m.world_size = comm.world_size();
    m.step = counters.step;
    m.epoch = counters.epoch;
    m.batch_in_epoch = counters.batch_in_epoch;
    m.scalars = counters.scalars;
    m.config = config_yaml;
    for (const auto& mo : models) {
      ShardedModel& model = *mo.model;
      ckpt::ModelEntry me;
      me.name = model.name();
      me.stage = model.config().stage;
      me.optim_step = mo.optim ? mo.optim->step_count() : 0;
      if (!model.units().empty()) {
        me.dtype = h5::dtype_name(h5_type(model.units()[0]->master_dtype()));
        if (mo.optim) {
          me.optim_states = mo.optim->state_names();
        }
      }
      for (auto& kv : mo.extra) me.extras.push_back(kv.first);
      for (auto& up : model.units()) {
        ckpt::UnitEntry ue;
        ue.name = up->name();
        ue.numel = up->numel();
        ue.padded_numel = up->padded_numel();
        for (const auto& s : up->slots()) ue.params.push_back({s.name, s.shape, s.offset, s.numel});
        me.units.push_back(std::move(ue));
      }
      for (auto& [bname, buf] : model.named_buffers()) {
        me.buffers.push_back({bname, buf.sizes().vec(), h5::dtype_name(h5_type(buf)), 0});
      }
      m.models.push_back(std::move(me));
    }
    for (int r = 0; r < comm.world_size(); ++r) {
      Manifest rec = ckpt::manifest_from_json(records[r], "rank " + std::to_string(r) + "'s record");
      for (size_t mi = 0; mi < m.models.size(); ++mi) {
        for (size_t ui = 0; ui < m.models[mi].units.size(); ++ui) {
          for (const auto& sh : rec.models.at(mi).units.at(ui).shards) m.models[mi].units[ui].shards.push_back(sh);
        }
      }
      m.files.push_back(rec.files.at(0));
    }
    ckpt::write_index(tmp_dir, m);
    h5::fsync_path(tmp_dir);
    // Commit. Saving a step again (after a resume) swaps the old directory out first; a
    // crash between the two renames leaves older checkpoints for --resume to pick.
    const std::string old_dir = final_dir + ".old";
    if (fs::exists(final_dir)) {
      fs::remove_all(old_dir);
      fs::rename(final_dir, old_dir);
    }
    fs::rename(tmp_dir, final_dir);
    h5::fsync_path(root);
    write_atomically(root + "/latest", name);
    h5::fsync_path(root);
    if (pending_deletion().valid()) pending_deletion().get();  // it may be deleting in root
    std::vector<std::string> committed;
    std::vector<fs::path> doomed;
    for (auto& e : fs::directory_iterator(root)) {
      const std::string n = e.path().filename().string();
      if (!e.is_directory() || n.rfind("step-", 0) != 0) continue;
      if (committed_step(n) >= 0) {
        committed.push_back(n);
      } else {
        doomed.push_back(e.path());  // leftovers of interrupted saves (*.tmp, *.old, *.del)
      }
    }
    std::sort(committed.begin(), committed.end(), by_step);
    for (size_t i = 0; i + std::max(keep_last, 1) < committed.size(); ++i) {
      const std::string from = root + "/" + committed[i], to = from + ".del";
      fs::rename(from, to);
      doomed.emplace_back(to);
    }
    delete_in_background(std::move(doomed));
  } catch (const std::exception& e) {
    error = "rank 0: " + what + " (commit): " + e.what();
  }
  agree_or_throw(comm, error, what);
  if (stats) stats->total_s = std::chrono::duration<double>(clock::now() - t0).count();
  return final_dir;
}

void wait_for_checkpoint_cleanup() {
  if (pending_deletion().valid()) pending_deletion().get();
}

std::string resolve_checkpoint_dir(const std::string& path, const std::string& what) {
  if (fs::exists(path + "/" + ckpt::kIndexFile) || fs::exists(path + "/" + ckpt::rank_file_name(0))) return path;
  for (const std::string& folder : {path, path + "/checkpoints"}) {
    if (!fs::is_directory(folder)) continue;
    std::vector<std::string> complete;
    bool any = false;
    for (auto& e : fs::directory_iterator(folder)) {
      const std::string n = e.path().filename().string();
      if (!e.is_directory() || n.rfind("step-", 0) != 0) continue;
      any = true;
      if (committed_step(n) >= 0 && fs::exists(e.path() / ckpt::kIndexFile)) complete.push_back(n);
    }
    if (!complete.empty()) return folder + "/" + *std::max_element(complete.begin(), complete.end(), by_step);
    if (any) {
      throw CheckpointError(what + " '" + path + "': '" + folder +
                            "' holds no complete checkpoint (only interrupted saves); start afresh");
    }
  }
  throw CheckpointError(what + " '" + path +
                        "': no checkpoint there (expected a directory with index.h5, or step-* "
                        "checkpoints in it or in its checkpoints/ folder)");
}

std::string agree_checkpoint_dir(const std::string& path, Communicator& comm, bool none_is_fresh) {
  // Rank 0 alone lists the folder: ranks listing it separately can see different steps
  // (a stale network-filesystem view), or one can start fresh while another loads.
  enum : int64_t { kFound = 0, kFresh = 1, kError = 2 };
  int64_t status = kFound;
  std::string text;
  if (comm.rank() == 0) {
    try {
      text = resolve_checkpoint_dir(path);
    } catch (const CheckpointError& e) {
      status = none_is_fresh ? kFresh : kError;
      text = e.what();
    }
  }
  at::Tensor head = torch::tensor({status, static_cast<int64_t>(text.size())}, torch::kLong);
  comm.broadcast(head, 0);
  status = head[0].item<int64_t>();
  at::Tensor bytes = torch::empty({head[1].item<int64_t>()}, torch::kByte);
  if (comm.rank() == 0 && !text.empty()) std::memcpy(bytes.data_ptr(), text.data(), text.size());
  if (bytes.numel() > 0) comm.broadcast(bytes, 0);
  text.assign(static_cast<const char*>(bytes.data_ptr()), static_cast<size_t>(bytes.numel()));
  if (status == kFresh) return {};
  if (status == kError) throw CheckpointError(text);
  // Every rank confirms that it sees rank 0's choice; any that does not is named.
  const bool visible = fs::is_regular_file(text + "/" + ckpt::kIndexFile) ||
                       fs::is_regular_file(text + "/" + ckpt::rank_file_name(0));
  at::Tensor blind = torch::zeros({comm.world_size()}, torch::kDouble);
  blind[comm.rank()] = visible ? 0.0 : 1.0;
  comm.all_reduce(blind, ReduceOp::kSum);
  std::string ranks;
  for (int r = 0; r < comm.world_size(); ++r) {
    if (blind[r].item<double>() != 0) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  }
  if (!ranks.empty()) {
    throw CheckpointError("--resume '" + path + "': rank 0 chose checkpoint '" + text + "', which rank(s) " + ranks +
                          " cannot see (no " + ckpt::kIndexFile + " there from their side: a stale network-filesystem "
                          "view, or a relative path from another working directory). Make the run directory the "
                          "same on every rank (an absolute path on a shared filesystem), then resume again");
  }
  return text;
}

void load_checkpoint(const std::string& ckpt_dir, TrainCounters& counters,
                     const std::vector<ModelAndOptimizer>& models, Communicator& comm) {
  std::string error;
  try {
    load_local(ckpt_dir, counters, models, comm);
  } catch (const std::exception& e) {
    error = e.what();
  }
  // Every rank learns whether any failed, so that all of them throw instead of hanging.
  at::Tensor failed = torch::tensor({error.empty() ? 0.0 : 1.0}, torch::kDouble);
  comm.all_reduce(failed, ReduceOp::kMax);
  if (failed.item<double>() != 0) {
    throw CheckpointError(error.empty() ? "checkpoint '" + ckpt_dir + "': another rank could not load it (see its message)"
                                        : error);
  }
  // Stages 1 and 2 keep full parameters beside the owned shard (and mixed precision a
  // compute copy): refresh them from the shards just written.
  for (const auto& mo : models) mo.model->after_optimizer_step();
}

}  // namespace shardgan
