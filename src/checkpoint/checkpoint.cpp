#include "shardgan/checkpoint/checkpoint.h"

#include "save_parts.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>

#include <spdlog/spdlog.h>
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
using namespace ckpt_detail;
namespace {

using ckpt_detail::h5_type;  // with the overload below, not hidden by it
h5::DType h5_type(const at::Tensor& t) { return h5_type(t.scalar_type()); }

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
      // Offsets may differ (a flat alignment on one side only, for 8-bit optimizer states):
      // read_owned maps each parameter from its place there to its place here.
      if (ue.params[p].name != s.name || ue.params[p].shape != s.shape) {
        differ("parameter '" + ue.name + "." + ue.params[p].name + "' differs in name or shape");
      }
    }
  }
  if (!m.units().empty() && me.dtype != h5::dtype_name(h5_type(m.units()[0]->master_dtype()))) {
    differ("was saved in " + me.dtype + ", this run's master dtype is " +
           std::string(c10::toString(m.units()[0]->master_dtype())));
  }
}

// Fills `t` (1-D, this rank's S elements) with global flat elements [lo, lo + S) of `kind`
// under this run's layout (`u`'s slots). Where the checkpoint laid the parameters out at
// the same offsets, that is one read of its elements [lo, lo + S); elements past its data
// are padding and become 0. Where the offsets differ (a flat alignment on one side only),
// each parameter's owned part is read from its place there, and the padding is 0.
void read_owned(ckpt::CheckpointReader& rd, const ckpt::ModelEntry& me, const ckpt::UnitEntry& ue,
                const ShardedUnit& u, const std::string& kind, int64_t lo, at::Tensor t) {
  const int64_t s = t.numel();
  // HDF5 reads into host memory; a device tensor is filled from a host copy in chunks.
  const bool direct = t.device().is_cpu() && t.is_contiguous();
  at::Tensor c = direct ? t : torch::empty({s}, t.options().device(at::kCPU));
  bool same = true;
  for (size_t k = 0; k < ue.params.size(); ++k) same &= ue.params[k].offset == u.slots()[k].offset;
  if (same) {
    const int64_t hi = std::min(lo + s, ue.data_end());
    if (hi > lo) rd.read_flat(me, ue, kind, lo, hi, c.data_ptr());
    const int64_t got = std::max<int64_t>(0, hi - lo);
    if (got < s) c.narrow(0, got, s - got).zero_();
  } else {
    c.zero_();
    const int64_t esize = c.element_size();
    for (size_t k = 0; k < ue.params.size(); ++k) {
      const int64_t d = u.slots()[k].offset, n = u.slots()[k].numel;
      const int64_t a = std::max(lo, d), b = std::min(lo + s, d + n);
      if (a >= b) continue;
      const int64_t from = ue.params[k].offset + (a - d);
      rd.read_flat(me, ue, kind, from, from + (b - a), static_cast<char*>(c.data_ptr()) + (a - lo) * esize);
    }
  }
  if (direct) return;
  if (t.is_contiguous()) {
    copy_from_host(c, t);
  } else {
    t.copy_(c);
  }
}

// The checkpoint's optimizer states of one unit, parameter by parameter.
class ParamStates final : public StateSource {
 public:
  ParamStates(ckpt::CheckpointReader& rd, const ckpt::ModelEntry& me, const ckpt::UnitEntry& ue)
      : rd_(rd), me_(me), ue_(ue) {}
  bool has(const std::string& name) const override {
    auto in = [&](const std::vector<std::string>& v) { return std::find(v.begin(), v.end(), name) != v.end(); };
    return in(me_.optim_states) || in(me_.raw_states);
  }
  int64_t block(const std::string& name, size_t param) override { return rd_.raw_block(me_, ue_, param, name); }
  void read_values(const std::string& name, size_t param, int64_t lo, int64_t hi, float* out) override {
    rd_.read_param_state(me_, ue_, param, name, lo, hi, out);
  }
  void read_raw(const std::string& name, size_t param, int64_t lo, int64_t hi, uint8_t* codes, float* absmax) override {
    rd_.read_param_raw(me_, ue_, param, name, lo, hi, codes, absmax);
  }

 private:
  ckpt::CheckpointReader& rd_;
  const ckpt::ModelEntry& me_;
  const ckpt::UnitEntry& ue_;
};

// A note when the checkpoint's states and this run's are held differently (float32 and
// 8-bit, or 8-bit in other blocks): the states go through float32 and are requantized.
void note_state_conversion(const ckpt::ModelEntry& me, ShardedModel& model, ShardedOptimizer& opt, int rank,
                           const std::string& dir) {
  const int64_t here = opt.raw_states().empty() ? 0 : opt.raw_state_block();
  const int64_t there = me.raw_states.empty() ? 0 : me.raw_state_block;
  if (here == there || rank != 0) return;
  auto what = [](int64_t b) { return b == 0 ? std::string("float32") : "8-bit (blocks of " + std::to_string(b) + ")"; };
  spdlog::info("checkpoint '{}': {}'s optimizer states were saved {} and are loaded {}: converted through float32, "
               "so this resume is not bit-exact with an uninterrupted run", dir, model.name(), what(there), what(here));
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
    if (mo.optim) note_state_conversion(*me, model, *mo.optim, comm.rank(), dir);
    for (size_t i = 0; i < model.units().size(); ++i) {
      ShardedUnit& u = *model.units()[i];
      const ckpt::UnitEntry& ue = me->units[i];
      const int64_t lo = u.shard_offset();
      if (u.shard_offloaded()) {
        // Parameter offload: one unit's shard at a time, through a transient tensor.
        at::Tensor t = torch::empty({u.shard_numel()}, torch::TensorOptions().dtype(u.master_dtype()));
        read_owned(rd, *me, ue, u, "param_shard", lo, t);
        u.set_master_shard(t);
      } else {
        read_owned(rd, *me, ue, u, "param_shard", lo, u.shard());
      }
      if (mo.optim && (!me->raw_states.empty() || !mo.optim->raw_states().empty())) {
        // 8-bit states on either side: parameter by parameter (the stored bits where both
        // sides hold them alike, float32 values otherwise).
        ParamStates src(rd, *me, ue);
        try {
          mo.optim->load_unit_state(i, src);
        } catch (const CheckpointError&) {
          throw;
        } catch (const std::runtime_error& e) {
          throw CheckpointError("checkpoint '" + dir + "', " + model.name() + " unit '" + u.name() + "': " + e.what());
        }
      } else if (mo.optim) {
        // Offloaded state is filled in a transient tensor and streamed to its tier.
        mo.optim->write_unit_state(i, [&](const std::string& sname, at::Tensor& st) {
          if (std::find(me->optim_states.begin(), me->optim_states.end(), sname) == me->optim_states.end()) {
            throw CheckpointError("checkpoint '" + dir + "' has no optimizer state '" + sname + "' for " +
                                  model.name() + " (saved with another optimizer?)");
          }
          read_owned(rd, *me, ue, u, "optim/" + sname, lo, st);
        });
      }
      for (auto& [ename, fn] : mo.extra) {
        if (std::find(me->extras.begin(), me->extras.end(), ename) == me->extras.end()) {
          throw CheckpointError("checkpoint '" + dir + "' has no '" + ename + "' state for " + model.name());
        }
        read_owned(rd, *me, ue, u, ename, lo, fn(i));
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

}  // namespace

int64_t committed_checkpoint_count(const std::string& folder) {
  std::error_code ec;
  int64_t n = 0;
  if (!fs::is_directory(folder, ec)) return 0;
  for (const auto& e : fs::directory_iterator(folder, ec)) {
    if (e.is_directory(ec) && committed_step(e.path().filename().string()) >= 0) ++n;
  }
  return n;
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
