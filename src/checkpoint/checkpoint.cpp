#include "shardgan/checkpoint/checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <torch/torch.h>

#include "shardgan/checkpoint/h5.h"
#include "shardgan/comm/communicator.h"
#include "shardgan/optim/optimizer.h"
#include "shardgan/sharding/sharded_model.h"

namespace shardgan {
namespace fs = std::filesystem;
namespace {

h5::DType h5_type(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return h5::DType::kF32;
    case at::kDouble: return h5::DType::kF64;
    case at::kLong: return h5::DType::kI64;
    case at::kByte: return h5::DType::kU8;
    default: throw CheckpointError(std::string("cannot store dtype ") + c10::toString(t.scalar_type()));
  }
}

void put(h5::File& f, const std::string& path, const at::Tensor& t) {
  at::Tensor c = t.contiguous();
  f.write(path, h5_type(c), c.sizes().vec(), c.data_ptr());
}

void get(const h5::File& f, const std::string& path, at::Tensor& t) {
  at::Tensor c = t.is_contiguous() ? t : t.contiguous();
  f.read(path, h5_type(c), c.data_ptr(), c.numel());
  if (!c.is_same(t)) t.copy_(c);
}

std::string rank_file(const std::string& dir, int rank) {
  char name[32];
  std::snprintf(name, sizeof(name), "rank-%05d.h5", rank);
  return dir + "/" + name;
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

}  // namespace

std::string save_checkpoint(const std::string& run_dir, const TrainCounters& counters,
                            const std::vector<ModelAndOptimizer>& models,
                            const std::string& config_yaml, Communicator& comm,
                            int keep_last) {
  const std::string root = run_dir + "/checkpoints";
  char name[32];
  std::snprintf(name, sizeof(name), "step-%08lld", static_cast<long long>(counters.step));
  const std::string final_dir = root + "/" + name, tmp_dir = final_dir + ".tmp";
  if (comm.rank() == 0) {
    fs::remove_all(tmp_dir);
    fs::create_directories(tmp_dir);
  }
  comm.barrier();
  {
    const std::string path = rank_file(tmp_dir, comm.rank());
    h5::File f = h5::File::create(path);
    f.set_attr("/", "schema_version", kCheckpointSchemaVersion);
    f.set_attr("/", "world_size", static_cast<int64_t>(comm.world_size()));
    f.set_attr("/", "rank", static_cast<int64_t>(comm.rank()));
    f.set_attr("/", "step", counters.step);
    f.set_attr("/", "epoch", counters.epoch);
    f.set_attr("/", "batch_in_epoch", counters.batch_in_epoch);
    f.set_attr("/", "config", config_yaml);
    for (const auto& mo : models) {
      ShardedModel& m = *mo.model;
      for (size_t i = 0; i < m.units().size(); ++i) {
        ShardedUnit& u = *m.units()[i];
        const std::string g = m.name() + "/units/" + u.name();
        put(f, g + "/param_shard", u.shard());
        for (auto& [sname, st] : mo.optim->unit_state(i)) put(f, g + "/optim/" + sname, st);
        for (auto& [ename, fn] : mo.extra) put(f, g + "/" + ename, fn(i));
        f.set_attr(g, "numel", u.numel());
        f.set_attr(g, "padded_numel", u.padded_numel());
        f.set_attr(g, "shard_offset", u.shard_offset());
      }
      for (auto& [bname, buf] : m.named_buffers()) put(f, m.name() + "/buffers/" + bname, buf);
      f.set_attr(m.name(), "optim_step", mo.optim->step_count());
      f.set_attr(m.name(), "stage", static_cast<int64_t>(m.config().stage));
    }
    put(f, "rng/noise", counters.noise_rng_state);
    for (auto& [k, v] : counters.scalars) f.set_attr("/", "scalar." + k, v);
    f.flush();
    f.close();
    h5::fsync_path(path);
  }
  comm.barrier();  // every rank's file is durable before the checkpoint is committed
  if (comm.rank() == 0) {
    if (fs::exists(final_dir)) fs::remove_all(final_dir);
    h5::fsync_path(tmp_dir);
    fs::rename(tmp_dir, final_dir);
    h5::fsync_path(root);
    write_atomically(root + "/latest", name);
    h5::fsync_path(root);
    std::vector<std::string> committed;
    for (auto& e : fs::directory_iterator(root)) {
      const std::string n = e.path().filename().string();
      if (e.is_directory() && n.rfind("step-", 0) == 0 && n.find(".tmp") == std::string::npos) committed.push_back(n);
    }
    std::sort(committed.begin(), committed.end());
    for (size_t i = 0; i + std::max(keep_last, 1) < committed.size(); ++i) fs::remove_all(root + "/" + committed[i]);
  }
  comm.barrier();
  return final_dir;
}

std::string resolve_checkpoint_dir(const std::string& path) {
  if (fs::exists(rank_file(path, 0))) return path;
  for (const std::string& folder : {path, path + "/checkpoints"}) {
    std::ifstream latest(folder + "/latest");
    std::string name;
    if (latest >> name) {
      const std::string dir = folder + "/" + name;
      if (!fs::exists(rank_file(dir, 0))) {
        throw CheckpointError("'" + folder + "/latest' names '" + name +
                              "', which holds no rank-00000.h5");
      }
      return dir;
    }
  }
  throw CheckpointError("--resume '" + path +
                        "': no checkpoint there (expected rank-*.h5 files, or a 'latest' file "
                        "in it or in its checkpoints/ folder)");
}

void load_checkpoint(const std::string& ckpt_dir, TrainCounters& counters,
                     const std::vector<ModelAndOptimizer>& models, Communicator& comm) {
  const std::string path = rank_file(ckpt_dir, comm.rank());
  if (!fs::exists(path)) {
    throw CheckpointError("checkpoint '" + ckpt_dir + "' has no file for rank " +
                          std::to_string(comm.rank()) + " ('" + path + "')");
  }
  h5::File f = h5::File::open_read(path);
  const int64_t schema = f.attr_int("/", "schema_version");
  if (schema != kCheckpointSchemaVersion) {
    throw CheckpointError(path + ": schema version " + std::to_string(schema) +
                          ", this build reads " + std::to_string(kCheckpointSchemaVersion));
  }
  const int64_t world = f.attr_int("/", "world_size");
  if (world != comm.world_size()) {
    throw CheckpointError(path + ": written by " + std::to_string(world) +
                          " ranks; this run has " + std::to_string(comm.world_size()) +
                          ". Resume with the same world size (resharding is not supported yet)");
  }
  counters.step = f.attr_int("/", "step");
  counters.epoch = f.attr_int("/", "epoch");
  counters.batch_in_epoch = f.attr_int("/", "batch_in_epoch");
  for (auto& [k, v] : counters.scalars) v = f.attr_double("/", "scalar." + k);
  torch::NoGradGuard no_grad;
  for (const auto& mo : models) {
    ShardedModel& m = *mo.model;
    const int64_t stage = f.attr_int(m.name(), "stage");
    if (stage != m.config().stage) {
      throw CheckpointError(path + ": " + m.name() + " was saved at ZeRO stage " +
                            std::to_string(stage) + ", this run uses stage " +
                            std::to_string(m.config().stage) + " (resharding is not supported yet)");
    }
    for (size_t i = 0; i < m.units().size(); ++i) {
      ShardedUnit& u = *m.units()[i];
      const std::string g = m.name() + "/units/" + u.name();
      get(f, g + "/param_shard", u.shard());
      for (auto& [sname, st] : mo.optim->unit_state(i)) get(f, g + "/optim/" + sname, st);
      for (auto& [ename, fn] : mo.extra) {
        at::Tensor t = fn(i);
        get(f, g + "/" + ename, t);
      }
    }
    for (auto& [bname, buf] : m.named_buffers()) get(f, m.name() + "/buffers/" + bname, buf);
    mo.optim->set_step_count(f.attr_int(m.name(), "optim_step"));
  }
  const auto rng_shape = f.shape("rng/noise");
  counters.noise_rng_state = torch::empty({rng_shape.at(0)}, torch::kUInt8);
  get(f, "rng/noise", counters.noise_rng_state);
  comm.barrier();
}

}  // namespace shardgan
