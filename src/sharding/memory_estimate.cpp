#include "shardgan/sharding/memory_estimate.h"
#include "shardgan/sharding/flat_layout.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <sstream>
#include <stdexcept>

#include "shardgan/sharding/sharded_model.h"  // kMaxReducesInFlight

namespace shardgan {
namespace {

void check_bytes(const char* field, int v, std::initializer_list<int> ok) {
  if (std::find(ok.begin(), ok.end(), v) != ok.end()) return;
  std::string list;
  for (int o : ok) list += (list.empty() ? "" : ", ") + std::to_string(o);
  throw std::invalid_argument(std::string("memory estimate: ") + field + " = " + std::to_string(v) +
                              " (use " + list + ")");
}

void validate(const ModelMemorySpec& s) {
  if (s.stage < 0 || s.stage > 3) {
    throw std::invalid_argument("memory estimate: stage = " + std::to_string(s.stage) + " (use 0, 1, 2 or 3)");
  }
  if (s.world_size < 1) {
    throw std::invalid_argument("memory estimate: world_size = " + std::to_string(s.world_size) + " (must be >= 1)");
  }
  check_bytes("master_bytes", s.master_bytes, {4, 8});
  check_bytes("compute_bytes", s.compute_bytes, {2, 4, 8});
  check_bytes("reduce_bytes", s.reduce_bytes, {2, 4, 8});
  if (s.optimizer_states < 0) {
    throw std::invalid_argument("memory estimate: optimizer_states = " + std::to_string(s.optimizer_states) +
                                " (must be >= 0)");
  }
  if (s.hpz_partition_size < 1 || s.world_size % s.hpz_partition_size != 0) {
    throw std::invalid_argument("memory estimate: hpz_partition_size = " + std::to_string(s.hpz_partition_size) +
                                " (must be >= 1 and divide world_size " + std::to_string(s.world_size) + ")");
  }
  if (!s.unit_param_numels.empty() && s.unit_param_numels.size() != s.unit_numels.size()) {
    throw std::invalid_argument("memory estimate: unit_param_numels has " + std::to_string(s.unit_param_numels.size()) +
                                " units, unit_numels " + std::to_string(s.unit_numels.size()));
  }
  if (s.flat_align < 1) throw std::invalid_argument("memory estimate: flat_align must be >= 1");
  for (size_t i = 0; i < s.unit_numels.size(); ++i) {
    if (s.unit_numels[i] < 0) {
      throw std::invalid_argument("memory estimate: unit_numels[" + std::to_string(i) +
                                  "] = " + std::to_string(s.unit_numels[i]) + " (must be >= 0)");
    }
  }
}

std::string gib(int64_t b) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%lld B (%.3f GiB)", static_cast<long long>(b),
                static_cast<double>(b) / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

// "Key:   123 kB" -> bytes, for the first line starting with `key`; -1 if absent.
int64_t meminfo_field(const std::string& text, const std::string& key) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, key.size() + 1, key + ":") != 0) continue;
    std::istringstream ls(line.substr(key.size() + 1));
    long long v = -1;
    std::string unit;
    ls >> v >> unit;
    if (v < 0) return -1;
    return unit == "kB" ? static_cast<int64_t>(v) * 1024 : static_cast<int64_t>(v);
  }
  return -1;
}

// A non-negative integer read from a one-line file, or -1 (missing, "max", or garbage).
int64_t read_number(const std::string& path) {
  std::ifstream f(path);
  long long v = -1;
  if (!f || !(f >> v) || v < 0) return -1;
  return v;
}

}  // namespace

int optimizer_states(const std::string& type, double momentum, bool centered) {
  if (type == "adam" || type == "adamw") return 2;
  if (type == "sgd") return momentum != 0 ? 1 : 0;
  if (type == "rmsprop") return 1 + (momentum > 0 ? 1 : 0) + (centered ? 1 : 0);
  throw std::invalid_argument("memory estimate: unknown optimizer type '" + type +
                              "' (use adam, adamw, sgd or rmsprop)");
}

// Mirrors ShardedUnit's constructor (src/sharding/sharded_unit.cpp): per unit, full_ holds P
// compute elements at stages 0-2; shard_ is S master elements, a view of full_ when the
// compute and master dtypes agree at stages 0-2; grad_flat_ holds P reduce elements at
// stages 0-1; grad_shard_ is S master elements, a view of grad_flat_ when the reduce and
// master dtypes agree at stages 0-1. Optimizer states and the EMA are S master elements each.
ModelMemoryEstimate estimate_model_memory(const ModelMemorySpec& spec) {
  validate(spec);
  ModelMemoryEstimate e;
  e.stage = spec.stage;
  e.world_size = spec.world_size;
  const int64_t n = spec.world_size, mb = spec.master_bytes, cb = spec.compute_bytes, rb = spec.reduce_bytes;
  const bool shard_is_view = cb == mb && spec.stage <= 2;
  const bool grad_shard_is_view = rb == mb && spec.stage <= 1;
  const int64_t in_flight = static_cast<int64_t>(ShardedModel::kMaxReducesInFlight);
  const int64_t pending_writes = static_cast<int64_t>(ShardedModel::kMaxGradWritesPending);
  std::vector<int64_t> gathered;  // P * compute bytes per unit (stage 3)
  int64_t max_t = 0, max_p = 0, max_s = 0, max_ps = 0;
  const bool by_stage = spec.optimizer_state_bytes_by_stage.size() == 4;
  for (size_t ui = 0; ui < spec.unit_numels.size(); ++ui) {
    const int64_t t = spec.unit_numels[ui];
    const FlatLayout layout =
        make_flat_layout(spec.unit_param_numels.empty() ? std::vector<int64_t>{t} : spec.unit_param_numels.at(ui),
                         spec.flat_align, static_cast<int>(n), spec.stage);
    const int64_t s = layout.shard_numel;
    const int64_t p = layout.padded_numel;
    e.numel += t;
    e.padded_numel += p;
    e.shard_numel += s;
    e.param_bytes += (spec.stage <= 2 ? p * cb : 0) + (shard_is_view || (spec.offload_params_to_disk && spec.stage == 3) ? 0 : s * mb);
    const bool grad_off = spec.offload_grads_to_disk && spec.stage >= 2;
    e.grad_bytes += (spec.stage <= 1 ? p * rb : 0) + (grad_shard_is_view || grad_off ? 0 : s * mb);
    e.grad_released_bytes += grad_shard_is_view || grad_off ? 0 : s * mb;
    if (!spec.offload_to_disk && !by_stage) e.optimizer_state_bytes += spec.optimizer_states * s * mb;
    e.ema_bytes += spec.ema ? s * mb : 0;
    if (spec.stage == 3 && spec.hpz_partition_size > 1) e.secondary_param_bytes += p / spec.hpz_partition_size * cb;
    if (spec.stage == 3) gathered.push_back(p * cb);
    max_t = std::max(max_t, t);
    max_p = std::max(max_p, p);
    max_s = std::max(max_s, s);
    max_ps = std::max(max_ps, p + s);
  }
  e.padding_elements = e.padded_numel - e.numel;
  if (by_stage) e.optimizer_state_bytes += spec.optimizer_state_bytes_by_stage[spec.stage];
  if (spec.offload_ring_bytes > 0) e.optimizer_state_bytes += spec.offload_ring_bytes;

  if (spec.stage == 3 && !gathered.empty()) {
    std::sort(gathered.begin(), gathered.end(), std::greater<int64_t>());
    const bool whole = !spec.reshard_after_forward || spec.frozen_backward;
    e.gathered_units = whole ? static_cast<int>(gathered.size()) : std::min<int>(3, static_cast<int>(gathered.size()));
    e.gathered_unit_bytes = gathered.front();
    for (int i = 0; i < e.gathered_units; ++i) e.gathered_peak_bytes += gathered[i];
    for (int64_t b : gathered) e.whole_gathered_bytes += b;
  }
  const int64_t autograd_grad = max_t * cb;
  switch (spec.stage) {
    case 0:
      e.comm_buffer_bytes = 0;
      e.grad_transient_bytes = autograd_grad + (rb == mb ? 0 : max_t * mb);
      break;
    case 1:
      e.comm_buffer_bytes = max_s * rb;
      e.grad_transient_bytes = autograd_grad + in_flight * max_s * rb;
      break;
    default:
      e.comm_buffer_bytes = max_ps * rb;
      e.grad_write_pending_bytes = spec.offload_grads ? pending_writes * max_s * rb : 0;
      e.grad_transient_bytes = autograd_grad + max_p * rb + in_flight * max_ps * rb + e.grad_write_pending_bytes;
      break;
  }
  return e;
}

int64_t alive_bytes(const ModelMemoryEstimate& e, const ModelAlive& a) {
  if (!a.held) return 0;
  int64_t b = e.persistent_bytes() - e.grad_released_bytes + (a.grad_shard ? e.grad_released_bytes : 0);
  if (a.gathered == ModelAlive::Gathered::kWindow) b += e.gathered_peak_bytes;
  if (a.gathered == ModelAlive::Gathered::kWhole) b += e.whole_gathered_bytes;
  if (a.grad_buffers) b += e.grad_transient_bytes;
  return b;
}

int64_t gan_state_bytes(const ModelMemoryEstimate& g, const ModelMemoryEstimate& d) {
  return g.persistent_bytes() + d.persistent_bytes() - g.grad_released_bytes - d.grad_released_bytes +
         std::max(g.grad_released_bytes, d.grad_released_bytes);
}

int64_t gan_peak_bytes(const ModelMemoryEstimate& g, const ModelMemoryEstimate& d) {
  return gan_state_bytes(g, d) + g.transient_bytes() + d.transient_bytes();
}

std::array<ModelMemoryEstimate, 4> estimate_all_stages(const ModelMemorySpec& spec) {
  std::array<ModelMemoryEstimate, 4> all;
  ModelMemorySpec s = spec;
  for (int stage = 0; stage < 4; ++stage) {
    s.stage = stage;
    all[stage] = estimate_model_memory(s);
  }
  return all;
}

std::optional<int> lowest_fitting_stage(const ModelMemorySpec& spec, int64_t limit_bytes) {
  for (const ModelMemoryEstimate& e : estimate_all_stages(spec)) {
    if (e.peak_bytes() <= limit_bytes) return e.stage;
  }
  return std::nullopt;
}

std::string describe(const ModelMemoryEstimate& e) {
  std::ostringstream o;
  o << "stage " << e.stage << ", N=" << e.world_size << ", " << e.numel << " params ("
    << e.padding_elements << " padding): params " << gib(e.param_bytes) << ", grads " << gib(e.grad_bytes)
    << " (released after each step: " << gib(e.grad_released_bytes) << "), optimizer "
    << gib(e.optimizer_state_bytes) << ", ema " << gib(e.ema_bytes) << ", gathered "
    << gib(e.gathered_peak_bytes) << " (" << e.gathered_units << " units), grad buffers "
    << gib(e.grad_transient_bytes) << "; persistent " << gib(e.persistent_bytes()) << ", peak "
    << gib(e.peak_bytes()) << " per rank";
  return o.str();
}

HostMemory read_host_memory() { return read_host_memory("/proc/meminfo", "/sys/fs/cgroup/memory.max"); }

HostMemory read_host_memory(const std::string& meminfo, const std::string& cgroup_max) {
  std::ifstream f(meminfo);
  if (!f) throw std::runtime_error("cannot read host memory: " + meminfo + " cannot be opened");
  std::stringstream text;
  text << f.rdbuf();
  HostMemory h;
  h.total_bytes = meminfo_field(text.str(), "MemTotal");
  h.available_bytes = meminfo_field(text.str(), "MemAvailable");
  if (h.total_bytes < 0 || h.available_bytes < 0) {
    throw std::runtime_error("cannot read host memory: " + meminfo + " has no MemTotal or MemAvailable line");
  }
  const int64_t limit = read_number(cgroup_max);
  if (limit >= 0 && limit < h.total_bytes) {
    h.total_bytes = limit;
    const size_t slash = cgroup_max.find_last_of('/');
    const std::string dir = slash == std::string::npos ? std::string() : cgroup_max.substr(0, slash + 1);
    const int64_t used = read_number(dir + "memory.current");
    const int64_t headroom = used >= 0 ? std::max<int64_t>(0, limit - used) : limit;
    h.available_bytes = std::min(h.available_bytes, headroom);
  }
  h.available_bytes = std::min(h.available_bytes, h.total_bytes);
  return h;
}

}  // namespace shardgan
