#include "shardgan/checkpoint/offline.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>

#include "shardgan/checkpoint/shard_io.h"

namespace shardgan::ckpt {
namespace fs = std::filesystem;
namespace {

std::vector<double> as_double(const std::vector<char>& raw, const std::string& dtype, int64_t n) {
  std::vector<double> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const char* p = raw.data() + i * h5::dtype_bytes(parse_dtype(dtype));
    if (dtype == "float32") { float v; std::memcpy(&v, p, 4); out[i] = v; }
    else if (dtype == "float64") { std::memcpy(&out[i], p, 8); }
    else if (dtype == "int64") { int64_t v; std::memcpy(&v, p, 8); out[i] = static_cast<double>(v); }
    else { out[i] = static_cast<unsigned char>(*p); }
  }
  return out;
}

std::vector<char> read_raw(CheckpointReader& rd, const TensorRef& t) {
  std::vector<char> buf(static_cast<size_t>(t.numel() * h5::dtype_bytes(parse_dtype(t.dtype))));
  rd.read_tensor(t, buf.data());
  return buf;
}

void commit_dir(const std::string& tmp, const std::string& dst) {
  h5::fsync_path(tmp);
  fs::rename(tmp, dst);
  h5::fsync_path(fs::absolute(dst).parent_path().string());
}

}  // namespace

void consolidate(const std::string& ckpt_dir, const std::string& out_path) {
  CheckpointReader rd(ckpt_dir);
  const Manifest& m = rd.manifest();
  const std::string tmp = out_path + ".tmp";
  {
    h5::File f = h5::File::create(tmp);
    for (const TensorRef& t : rd.tensors()) {
      std::vector<char> buf = read_raw(rd, t);  // one tensor in memory at a time
      f.write(t.path, parse_dtype(t.dtype), t.shape, buf.data());
    }
    for (const ModelEntry& mo : m.models) {
      if (!f.exists(mo.name)) continue;
      f.set_attr(mo.name, "stage", static_cast<int64_t>(mo.stage));
      f.set_attr(mo.name, "optim_step", mo.optim_step);
    }
    write_root_attributes(f, m, "shardgan-consolidated");
    f.flush();
    f.close();
  }
  h5::fsync_path(tmp);
  fs::rename(tmp, out_path);
}

void reshard(const std::string& src, const std::string& dst, int world_size, int stage) {
  if (world_size < 1) throw CheckpointError("reshard: --world-size must be >= 1");
  if (stage > 3) throw CheckpointError("reshard: --stage must be 0, 1, 2 or 3");
  if (fs::exists(dst)) throw CheckpointError("reshard: '" + dst + "' exists; choose a new directory");
  CheckpointReader rd(src);
  const Manifest& old = rd.manifest();
  for (const ModelEntry& mo : old.models) {
    if (!mo.raw_states.empty()) {
      throw CheckpointError("reshard: '" + src + "' holds " + mo.name +
                            "'s 8-bit optimizer states per parameter, which this tool does not re-slice. Resume the "
                            "checkpoint directly at the new world size: loading reshards it, bit for bit");
    }
  }
  Manifest nm = old;
  nm.world_size = world_size;
  nm.files.clear();
  for (ModelEntry& mo : nm.models) {
    if (stage >= 0) mo.stage = stage;
    for (UnitEntry& u : mo.units) u.shards.clear();
    for (BufferEntry& b : mo.buffers) b.rank = 0;
  }
  const std::string tmp = dst + ".tmp";
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  std::vector<char> buf;
  for (int r = 0; r < world_size; ++r) {
    RankFileWriter w(tmp, r, nm.block_bytes);
    w.file().set_attr("/", "schema_version", nm.schema_version);
    w.file().set_attr("/", "world_size", static_cast<int64_t>(world_size));
    w.file().set_attr("/", "rank", static_cast<int64_t>(r));
    w.file().set_attr("/", "step", nm.step);
    for (size_t mi = 0; mi < nm.models.size(); ++mi) {
      ModelEntry& mo = nm.models[mi];
      const ModelEntry& om = old.models[mi];
      const h5::DType dt = parse_dtype(mo.dtype);
      const int64_t eb = h5::dtype_bytes(dt);
      for (size_t ui = 0; ui < mo.units.size(); ++ui) {
        UnitEntry& u = mo.units[ui];
        if (mo.stage == 0 && r != 0) continue;  // stage 0: rank 0 holds everything once
        const int64_t e = u.data_end();  // T, or more with aligned parameters
        const int64_t s = mo.stage == 0 ? e : (e + world_size - 1) / world_size;
        const int64_t off = mo.stage == 0 ? 0 : s * r, hi = std::min(off + s, e);
        u.padded_numel = mo.stage == 0 ? e : s * world_size;
        for (const std::string& kind : state_kinds(mo)) {
          buf.assign(static_cast<size_t>(s * eb), 0);  // padding stays zero
          if (hi > off) rd.read_flat(om, om.units[ui], kind, off, hi, buf.data());
          w.write(unit_dataset(mo.name, u.name, kind), dt, {s}, buf.data());
        }
        const std::string g = mo.name + "/units/" + u.name;
        w.file().set_attr(g, "numel", u.numel);
        w.file().set_attr(g, "padded_numel", u.padded_numel);
        w.file().set_attr(g, "shard_offset", off);
        u.shards.push_back({r, off, s});
      }
      if (r == 0) {
        for (size_t bi = 0; bi < mo.buffers.size(); ++bi) {
          const BufferEntry& ob = om.buffers[bi];
          int64_t n = 1;
          for (int64_t d : ob.shape) n *= d;
          buf.resize(static_cast<size_t>(n * h5::dtype_bytes(parse_dtype(ob.dtype))));
          rd.read_dataset(ob.rank, om.name + "/buffers/" + ob.name, buf.data(), n);
          w.write(mo.name + "/buffers/" + ob.name, parse_dtype(ob.dtype), ob.shape, buf.data());
        }
      }
      if (w.file().exists(mo.name)) {
        w.file().set_attr(mo.name, "optim_step", mo.optim_step);
        w.file().set_attr(mo.name, "stage", static_cast<int64_t>(mo.stage));
      }
    }
    const int from = r % static_cast<int>(old.world_size);
    const auto& ds = old.file(from).datasets;
    if (ds.count("rng/noise")) {
      const int64_t n = ds.at("rng/noise").numel;
      buf.resize(static_cast<size_t>(n));
      rd.read_dataset(from, "rng/noise", buf.data(), n);
      w.write("rng/noise", h5::DType::kU8, {n}, buf.data());
    }
    nm.files.push_back(w.finish());
  }
  write_index(tmp, nm);
  commit_dir(tmp, dst);
}

void compare_values(const std::vector<double>& a, const std::vector<double>& b, TensorDiff& d) {
  double scale = 0;
  bool nonfinite = false, both = false;
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = a[i], y = b[i];
    both = both || !std::isfinite(x) || !std::isfinite(y);
    double e;
    if (std::isnan(x) || std::isnan(y)) {
      e = std::isnan(x) && std::isnan(y) ? 0 : INFINITY;
    } else {
      e = x == y ? 0 : std::abs(x - y);  // equal infinities: 0; one infinite: inf
    }
    nonfinite = nonfinite || std::isinf(e);
    d.max_abs = std::max(d.max_abs, e);
    if (std::isfinite(y)) scale = std::max(scale, std::abs(y));
  }
  d.max_rel = d.max_abs == 0 ? 0 : d.max_abs / std::max(scale, 1e-300);
  if (nonfinite) {
    d.note += std::string(d.note.empty() ? "" : "; ") + "non-finite values differ";
  } else if (both) {
    d.note += std::string(d.note.empty() ? "" : "; ") + "non-finite values on both sides";
  }
}

std::vector<TensorDiff> diff(const std::string& a_dir, const std::string& b_dir) {
  CheckpointReader a(a_dir), b(b_dir);
  std::map<std::string, TensorRef> in_b;
  for (const TensorRef& t : b.tensors()) in_b[t.path] = t;
  std::vector<TensorDiff> out;
  for (const TensorRef& ta : a.tensors()) {
    TensorDiff d;
    d.path = ta.path;
    d.numel = ta.numel();
    auto it = in_b.find(ta.path);
    if (it == in_b.end()) {
      d.note = "only in A";
    } else if (it->second.shape != ta.shape) {
      d.note = "shape differs";
    } else {
      const std::vector<double> x = as_double(read_raw(a, ta), ta.dtype, ta.numel());
      const std::vector<double> y = as_double(read_raw(b, it->second), it->second.dtype, ta.numel());
      if (ta.dtype != it->second.dtype) d.note = "dtype " + ta.dtype + " vs " + it->second.dtype;
      compare_values(x, y, d);
    }
    if (it != in_b.end()) in_b.erase(it);
    out.push_back(std::move(d));
  }
  for (auto& [path, t] : in_b) out.push_back({path, t.numel(), 0, 0, "only in B"});
  return out;
}

}  // namespace shardgan::ckpt
