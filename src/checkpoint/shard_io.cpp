#include "shardgan/checkpoint/shard_io.h"

#include "shardgan/optim/blockwise_quant.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <functional>
#include <mutex>
#include <thread>

#include "index_layout.h"
#include "shardgan/h5/probe.h"

namespace shardgan::ckpt {
namespace fs = std::filesystem;
namespace {

// Loads read a range in pieces of this many checksum blocks (8 MiB by default): a piece
// is hashed on a second thread while the next one is read, and it is still in the CPU's
// cache when it is hashed.
constexpr int64_t kPieceBlocks = 8;

// Checks pieces 0, 1, 2, ... in order as they are pushed: on a thread of its own when
// `threaded`, else inline in push(). `check(i)` returns the first bad block of piece i, or
// -1. finish() waits for every pushed piece and returns the first bad block, or -1.
class Verifier {
 public:
  Verifier(std::function<int64_t(size_t)> check, bool threaded) : check_(std::move(check)) {
    if (threaded) worker_ = std::thread([this] { run(); });
  }
  Verifier(const Verifier&) = delete;
  ~Verifier() { finish(); }

  void push(size_t i) {
    if (!worker_.joinable()) {
      if (bad_ < 0) bad_ = check_(i);
      return;
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      ready_ = i + 1;
    }
    cv_.notify_one();
  }
  /// True once a checked piece has failed (the reader can stop early).
  bool failed() const { return bad_ >= 0; }
  int64_t finish() {
    if (worker_.joinable()) {
      {
        std::lock_guard<std::mutex> lk(mu_);
        stop_ = true;
      }
      cv_.notify_one();
      worker_.join();
    }
    return bad_;
  }

 private:
  void run() {
    size_t next = 0;
    std::unique_lock<std::mutex> lk(mu_);
    while (true) {
      cv_.wait(lk, [&] { return stop_ || next < ready_; });
      if (next >= ready_) return;  // stopped, and every pushed piece is checked
      const size_t last = ready_;
      lk.unlock();
      for (; next < last; ++next) {
        if (bad_ < 0) {
          const int64_t b = check_(next);
          if (b >= 0) bad_ = b;
        }
      }
      lk.lock();
    }
  }

  std::function<int64_t(size_t)> check_;
  std::atomic<int64_t> bad_{-1};
  std::mutex mu_;
  std::condition_variable cv_;
  size_t ready_ = 0;
  bool stop_ = false;
  std::thread worker_;
};

struct StopReading {};  // thrown out of a read_ranges callback once a checksum has failed

// The counts, offsets and ranks of an index that the reads compute with, checked before any
// is used (found by ckpt_index_fuzz: a crafted index whose parameter numel exceeded its
// shape made read_tensor write past the buffer the tools size from the shape). Bounded by
// 2^62 so that a sum of two cannot overflow. Throws std::runtime_error naming the entry.
void check_manifest(const Manifest& m) {
  constexpr int64_t kMaxCount = int64_t{1} << 62;
  auto count = [&](int64_t v, const std::string& what) {
    if (v < 0 || v >= kMaxCount) throw std::runtime_error(what + " is " + std::to_string(v));
  };
  auto rank = [&](int64_t r, const std::string& what) {
    if (r < 0 || r >= m.world_size) throw std::runtime_error(what + ": rank " + std::to_string(r) + " is outside the world");
  };
  auto elements = [&](const std::vector<int64_t>& shape, const std::string& what) {
    int64_t n = 1;
    for (int64_t d : shape) {
      count(d, what + ": a dimension");
      if (__builtin_mul_overflow(n, d, &n) || n >= kMaxCount) throw std::runtime_error(what + ": shape too large");
    }
    return n;
  };
  for (const ModelEntry& mo : m.models) {
    for (const UnitEntry& u : mo.units) {
      const std::string where = mo.name + "/" + u.name;
      count(u.numel, where + ": numel");
      count(u.padded_numel, where + ": padded_numel");
      for (const ParamEntry& p : u.params) {
        const int64_t n = elements(p.shape, where + "." + p.name);
        count(p.offset, where + "." + p.name + ": offset");
        // Aligned parameters leave gaps: a parameter ends within the padded flat parameter.
        const int64_t room = std::max(u.numel, u.padded_numel);
        if (p.numel != n || p.offset + p.numel > room) {
          throw std::runtime_error(where + "." + p.name + ": elements [" + std::to_string(p.offset) + ", +" +
                                   std::to_string(p.numel) + ") do not fit its shape (" + std::to_string(n) +
                                   " elements) or its unit's " + std::to_string(room) + " elements");
        }
      }
      for (const ShardEntry& sh : u.shards) {
        rank(sh.rank, where + ": a shard");
        count(sh.offset, where + ": a shard's offset");
        count(sh.numel, where + ": a shard's numel");
      }
    }
    for (const BufferEntry& b : mo.buffers) {
      rank(b.rank, mo.name + "/" + b.name);
      elements(b.shape, mo.name + "/" + b.name);
    }
  }
  for (const FileEntry& f : m.files) {
    rank(f.rank, "file '" + f.name + "'");
    count(f.bytes, "file '" + f.name + "': bytes");
    for (const auto& [path, d] : f.datasets) count(d.numel, "file '" + f.name + "', dataset '" + path + "': numel");
  }
}

}  // namespace

h5::DType parse_dtype(const std::string& name) {
  for (h5::DType t : {h5::DType::kF32, h5::DType::kF64, h5::DType::kI64, h5::DType::kU8}) {
    if (name == h5::dtype_name(t)) return t;
  }
  throw CheckpointError("unknown dtype '" + name + "' in a checkpoint index");
}

int64_t TensorRef::numel() const { return product(shape); }

// ---------------------------------------------------------------------------- writing

RankFileWriter::RankFileWriter(const std::string& dir, int rank, int64_t block_bytes)
    : dir_(dir), block_bytes_(block_bytes), file_(h5::File::create(dir + "/" + rank_file_name(rank))) {
  entry_.rank = rank;
  entry_.name = rank_file_name(rank);
}

void RankFileWriter::write(const std::string& path, h5::DType dt, const std::vector<int64_t>& shape,
                           const void* data) {
  file_.write(path, dt, shape, data);
  const int64_t n = product(shape);
  entry_.datasets[path] = {h5::dtype_name(dt), n, block_hashes(data, n * h5::dtype_bytes(dt), block_bytes_)};
}

FileEntry RankFileWriter::finish() {
  file_.flush();
  file_.close();
  const std::string path = dir_ + "/" + entry_.name;
  h5::fsync_path(path);
  entry_.bytes = static_cast<int64_t>(fs::file_size(path));
  return entry_;
}

void write_root_attributes(h5::File& f, const Manifest& m, const std::string& format) {
  f.set_attr("/", "format", format);
  f.set_attr("/", "schema_version", m.schema_version);
  f.set_attr("/", "world_size", m.world_size);
  f.set_attr("/", "step", m.step);
  f.set_attr("/", "epoch", m.epoch);
  f.set_attr("/", "batch_in_epoch", m.batch_in_epoch);
  f.set_attr("/", "config", m.config);
  for (const auto& [k, v] : m.scalars) f.set_attr("/", "scalar." + k, v);
}


void write_index(const std::string& dir, const Manifest& m) {
  const std::string path = dir + "/" + kIndexFile;
  h5::File f = h5::File::create(path);
  for (const IndexDataset& d : index_layout(m)) {
    f.write_virtual(d.path, d.dt, d.shape, d.pieces);
    if (d.is_param) {
      f.set_attr(d.path, "unit", d.unit);
      f.set_attr(d.path, "flat_offset", d.flat_offset);
    }
  }
  for (const ModelEntry& mo : m.models) {
    if (f.exists(mo.name)) {
      f.set_attr(mo.name, "stage", static_cast<int64_t>(mo.stage));
      f.set_attr(mo.name, "optim_step", mo.optim_step);
      f.set_attr(mo.name, "dtype", mo.dtype);
    }
  }
  write_root_attributes(f, m, kFormatName);
  const std::string text = to_json(m);
  f.write_string("manifest.json", text);
  f.set_attr("/", "manifest_xxh3", static_cast<int64_t>(xxh3(text.data(), static_cast<int64_t>(text.size()))));
  f.flush();
  f.close();
  h5::fsync_path(path);
}

// ---------------------------------------------------------------------------- reading

int64_t checkpoint_schema_version(const std::string& dir) {
  for (const std::string& name : {std::string(kIndexFile), rank_file_name(0)}) {
    try {
      if (!fs::exists(dir + "/" + name)) continue;
      return h5::File::open_read(dir + "/" + name).attr_int("/", "schema_version");
    } catch (const std::exception&) {
    }
  }
  return -1;
}

CheckpointReader::CheckpointReader(std::string dir) : dir_(std::move(dir)) {
  const std::string path = dir_ + "/" + kIndexFile;
  if (!fs::exists(path)) {
    if (fs::exists(dir_ + "/" + rank_file_name(0))) {
      const int64_t v = checkpoint_schema_version(dir_);
      throw CheckpointError("checkpoint '" + dir_ + "' has rank files but no " + kIndexFile +
                            " (schema version " + std::to_string(v) + "; this build reads schema " +
                            std::to_string(kSchemaVersion) +
                            " checkpoints). Load it with the shardgan build that wrote it.");
    }
    throw CheckpointError("'" + dir_ + "' is not a checkpoint: it has no " + kIndexFile);
  }
  if (const std::string why = h5::probe_isolated(path, {"manifest.json"}); !why.empty()) {
    throw CheckpointError("checkpoint '" + dir_ + "': " + kIndexFile + " cannot be read: " + why + "." + kDoWhat);
  }
  try {
    h5::File f = h5::File::open_read(path);
    const int64_t v = f.attr_int("/", "schema_version");
    if (v != kSchemaVersion) {
      throw CheckpointError("checkpoint '" + dir_ + "': " + kIndexFile + " has schema version " +
                            std::to_string(v) + ", this build reads schema " +
                            std::to_string(kSchemaVersion) +
                            ". Use the shardgan build that wrote it (or convert it with that build's "
                            "shardgan-ckpt consolidate).");
    }
    const std::string text = f.read_string("manifest.json");
    const int64_t want = f.attr_int("/", "manifest_xxh3");
    if (static_cast<int64_t>(xxh3(text.data(), static_cast<int64_t>(text.size()))) != want) {
      throw CheckpointError("checkpoint '" + dir_ + "': " + kIndexFile +
                            " fails its manifest checksum: the index is corrupted." + kDoWhat);
    }
    m_ = manifest_from_json(text, path);
  } catch (const CheckpointError&) {
    throw;
  } catch (const std::exception& e) {
    throw CheckpointError("checkpoint '" + dir_ + "': cannot read " + kIndexFile +
                          " (truncated or corrupted?): " + e.what() + "." + kDoWhat);
  }
  if (m_.schema_version != kSchemaVersion || static_cast<int64_t>(m_.files.size()) != m_.world_size) {
    throw CheckpointError("checkpoint '" + dir_ + "': the index lists " + std::to_string(m_.files.size()) +
                          " rank files for world size " + std::to_string(m_.world_size) + "." + kDoWhat);
  }
  try {
    check_manifest(m_);
  } catch (const std::exception& e) {
    throw CheckpointError("checkpoint '" + dir_ + "': " + kIndexFile + " holds an inconsistent manifest: " + e.what() +
                          "." + kDoWhat);
  }
}

CheckpointReader::~CheckpointReader() = default;

void CheckpointReader::fail_file(int rank, const std::string& what) const {
  std::string name = rank_file_name(rank);
  throw CheckpointError("checkpoint '" + dir_ + "', rank " + std::to_string(rank) + " file '" + name +
                        "': " + what);
}

h5::File& CheckpointReader::file(int rank) {
  auto it = files_.find(rank);
  if (it != files_.end()) return *it->second;
  const FileEntry* fe = nullptr;
  for (const auto& f : m_.files) {
    if (f.rank == rank) fe = &f;
  }
  if (!fe) fail_file(rank, "not listed in the index");
  const std::string path = dir_ + "/" + fe->name;
  if (!fs::exists(path)) fail_file(rank, "is missing; the checkpoint is incomplete." + kDoWhat);
  const auto bytes = static_cast<int64_t>(fs::file_size(path));
  if (bytes != fe->bytes) {
    fail_file(rank, "is " + std::to_string(bytes) + " bytes, but was committed with " +
                        std::to_string(fe->bytes) + " (truncated or overwritten)." + kDoWhat);
  }
  if (probe_files_) {
    std::vector<std::string> named;
    for (const auto& kv : fe->datasets) named.push_back(kv.first);
    if (const std::string why = h5::probe_isolated(path, named); !why.empty()) {
      fail_file(rank, "cannot be read: " + why + "." + kDoWhat);
    }
  }
  try {
    auto f = std::make_unique<h5::File>(h5::File::open_read(path));
    f->advise_sequential();
    return *files_.emplace(rank, std::move(f)).first->second;
  } catch (const std::exception& e) {
    fail_file(rank, std::string("cannot be opened: ") + e.what() + "." + kDoWhat);
  }
}

void CheckpointReader::read_verified(int rank, const std::string& path, int64_t start, int64_t count,
                                     void* out) {
  const FileEntry& fe = m_.file(rank);
  auto it = fe.datasets.find(path);
  if (it == fe.datasets.end()) fail_file(rank, "the index records no dataset '" + path + "'");
  const DatasetEntry& de = it->second;
  const h5::DType dt = parse_dtype(de.dtype);
  const int64_t eb = h5::dtype_bytes(dt), be = m_.block_bytes / eb;
  if (start < 0 || count < 0 || start + count > de.numel) {
    fail_file(rank, "dataset '" + path + "' has " + std::to_string(de.numel) + " elements; asked for [" +
                        std::to_string(start) + ", " + std::to_string(start + count) + ")");
  }
  if (count == 0) return;
  const int64_t nblocks = (de.numel + be - 1) / be;
  if (static_cast<int64_t>(de.xxh3.size()) != nblocks) fail_file(rank, "dataset '" + path + "': checksum list has the wrong length");
  // Whole checksum blocks are read and hashed. Blocks the request covers entirely are read
  // straight into `out`; the first and the last block, where it covers only part of them,
  // go through a scratch buffer. Nothing is returned before every block read has matched
  // its checksum.
  const int64_t end = start + count, b0 = start / be, b1 = (end + be - 1) / be;
  auto blo = [&](int64_t b) { return b * be; };
  auto bhi = [&](int64_t b) { return std::min((b + 1) * be, de.numel); };
  char* const dst = static_cast<char*>(out);
  struct Piece {
    int64_t b_first, b_last;  // blocks [b_first, b_last)
    char* buf;
  };
  std::vector<Piece> pieces;
  std::vector<char> head, tail;
  int64_t m0 = b0, m1 = b1;  // blocks read straight into `out`
  if (blo(b0) != start || bhi(b0) > end) {
    head.resize(static_cast<size_t>((bhi(b0) - blo(b0)) * eb));
    pieces.push_back({b0, b0 + 1, head.data()});
    m0 = b0 + 1;
  }
  const bool tail_partial = b1 - 1 >= m0 && bhi(b1 - 1) > end;
  if (tail_partial) m1 = b1 - 1;
  for (int64_t b = m0; b < m1; b += kPieceBlocks) {
    pieces.push_back({b, std::min(b + kPieceBlocks, m1), dst + (blo(b) - start) * eb});
  }
  if (tail_partial) {
    tail.resize(static_cast<size_t>((bhi(b1 - 1) - blo(b1 - 1)) * eb));
    pieces.push_back({b1 - 1, b1, tail.data()});
  }
  std::vector<h5::File::Range> ranges;
  for (const Piece& p : pieces) ranges.push_back({blo(p.b_first), bhi(p.b_last - 1) - blo(p.b_first), p.buf});
  auto check = [&](size_t i) -> int64_t {
    const Piece& p = pieces[i];
    for (int64_t b = p.b_first; b < p.b_last; ++b) {
      if (xxh3(p.buf + (blo(b) - blo(p.b_first)) * eb, (bhi(b) - blo(b)) * eb) != de.xxh3[static_cast<size_t>(b)]) {
        return b;
      }
    }
    return -1;
  };
  h5::File& f = file(rank);
  int64_t bad = -1;
  {
    Verifier v(check, pieces.size() > 1);
    try {
      f.read_ranges(path, dt, ranges, [&](size_t i) {
        v.push(i);
        if (v.failed()) throw StopReading{};
      });
    } catch (const StopReading&) {
    } catch (const std::exception& e) {
      v.finish();
      fail_file(rank, std::string(e.what()) + "." + kDoWhat);
    }
    bad = v.finish();
  }
  if (bad >= 0) {
    const int64_t n = bhi(bad) - blo(bad);
    fail_file(rank, "dataset '" + path + "' fails its checksum in block " + std::to_string(bad) + " of " +
                        std::to_string(nblocks) + " (elements " + std::to_string(blo(bad)) + " to " +
                        std::to_string(blo(bad) + n - 1) + "): the file is corrupted." + kDoWhat);
  }
  if (!head.empty()) {
    std::memcpy(dst, head.data() + (start - blo(b0)) * eb, static_cast<size_t>((std::min(end, bhi(b0)) - start) * eb));
  }
  if (!tail.empty()) {
    std::memcpy(dst + (blo(b1 - 1) - start) * eb, tail.data(), static_cast<size_t>((end - blo(b1 - 1)) * eb));
  }
}

void CheckpointReader::read_dataset(int rank, const std::string& path, void* out, int64_t numel) {
  auto it = m_.file(rank).datasets.find(path);
  if (it == m_.file(rank).datasets.end()) fail_file(rank, "the index records no dataset '" + path + "'");
  if (it->second.numel != numel) {
    fail_file(rank, "dataset '" + path + "' has " + std::to_string(it->second.numel) +
                        " elements, this model needs " + std::to_string(numel) +
                        " (a checkpoint of a different model or config?)");
  }
  read_verified(rank, path, 0, numel, out);
}

void CheckpointReader::read_flat(const ModelEntry& model, const UnitEntry& unit, const std::string& kind,
                                 int64_t lo, int64_t hi, void* out) {
  const int64_t eb = h5::dtype_bytes(parse_dtype(model.dtype));
  const std::string path = unit_dataset(model.name, unit.name, kind);
  int64_t covered = 0;
  for (const ShardEntry& sh : unit.shards) {
    const int64_t a = std::max(lo, sh.offset);
    const int64_t b = std::min({hi, sh.offset + sh.numel, unit.data_end()});
    if (a >= b) continue;
    read_verified(sh.rank, path, a - sh.offset, b - a, static_cast<char*>(out) + (a - lo) * eb);
    covered += b - a;
  }
  if (covered != hi - lo) {
    throw CheckpointError("checkpoint '" + dir_ + "': the index's shards of " + model.name + "/" + unit.name +
                          " do not cover elements [" + std::to_string(lo) + ", " + std::to_string(hi) +
                          ") exactly." + kDoWhat);
  }
}

namespace {

bool is_raw(const ModelEntry& model, const std::string& state) {
  return std::find(model.raw_states.begin(), model.raw_states.end(), state) != model.raw_states.end();
}

// The ranks holding parameter `param` of `unit` and which of its elements, [lo, hi) in the
// parameter's own order, each holds.
struct Part {
  int rank;
  int64_t lo, hi;
};
std::vector<Part> param_parts(const UnitEntry& unit, size_t param) {
  const ParamEntry& p = unit.params.at(param);
  std::vector<Part> out;
  for (const ShardEntry& sh : unit.shards) {
    const int64_t a = std::max(p.offset, sh.offset), b = std::min(p.offset + p.numel, sh.offset + sh.numel);
    if (a < b) out.push_back({sh.rank, a - p.offset, b - p.offset});
  }
  return out;
}

// Calls fn(rank, a, b, pa) for each rank's part [a, b) of parameter elements [lo, hi)
// (pa: the first element that rank's datasets hold); throws unless the parts cover it.
template <typename Fn>
void for_each_part(const std::string& dir, const ModelEntry& model, const UnitEntry& unit, size_t param,
                   const std::string& state, int64_t lo, int64_t hi, Fn&& fn) {
  int64_t covered = 0;
  for (const Part& part : param_parts(unit, param)) {
    const int64_t a = std::max(lo, part.lo), b = std::min(hi, part.hi);
    if (a >= b) continue;
    fn(part.rank, a, b, part.lo);
    covered += b - a;
  }
  if (covered != hi - lo) {
    throw CheckpointError("checkpoint '" + dir + "': the rank files do not hold all of " + model.name + "/" + unit.name +
                          "." + unit.params.at(param).name + "'s optimizer state '" + state + "'." + kDoWhat);
  }
}

}  // namespace

std::vector<TensorRef> CheckpointReader::tensors() const {
  std::vector<TensorRef> out;
  for (const ModelEntry& mo : m_.models) {
    // Flat kinds in the model's dtype, then raw states, which read_tensor dequantizes.
    std::vector<std::pair<std::string, std::string>> kinds;
    for (const std::string& kind : state_kinds(mo)) kinds.emplace_back(kind, mo.dtype);
    for (const std::string& state : mo.raw_states) kinds.emplace_back("optim/" + state, "float32");
    for (const auto& [kind, dtype] : kinds) {
      for (size_t ui = 0; ui < mo.units.size(); ++ui) {
        const UnitEntry& u = mo.units[ui];
        for (size_t pi = 0; pi < u.params.size(); ++pi) {
          const ParamEntry& p = u.params[pi];
          out.push_back({&mo, kind, ui, pi, index_path(mo.name, kind, u.name + "." + p.name),
                         p.shape.empty() ? std::vector<int64_t>{1} : p.shape, dtype});
        }
      }
    }
    for (size_t bi = 0; bi < mo.buffers.size(); ++bi) {
      const BufferEntry& b = mo.buffers[bi];
      out.push_back({&mo, "buffer", 0, bi, mo.name + "/buffers/" + b.name,
                     b.shape.empty() ? std::vector<int64_t>{1} : b.shape, b.dtype});
    }
  }
  return out;
}

std::vector<std::tuple<int, int64_t, int64_t>> CheckpointReader::holders(const TensorRef& t) const {
  if (t.kind == "buffer") return {{t.model->buffers[t.item].rank, 0, t.numel()}};
  std::vector<std::tuple<int, int64_t, int64_t>> out;
  for (const Part& part : param_parts(t.model->units[t.unit], t.item)) out.emplace_back(part.rank, part.lo, part.hi);
  return out;
}

void CheckpointReader::read_tensor(const TensorRef& t, void* out) {
  if (t.kind == "buffer") {
    const BufferEntry& b = t.model->buffers[t.item];
    read_dataset(b.rank, t.model->name + "/buffers/" + b.name, out, t.numel());
    return;
  }
  const UnitEntry& u = t.model->units[t.unit];
  const ParamEntry& p = u.params[t.item];
  if (t.kind.rfind("optim/", 0) == 0 && is_raw(*t.model, t.kind.substr(6))) {
    read_param_state(*t.model, u, t.item, t.kind.substr(6), 0, p.numel, static_cast<float*>(out));
    return;
  }
  read_flat(*t.model, u, t.kind, p.offset, p.offset + p.numel, out);
}

int64_t CheckpointReader::raw_block(const ModelEntry& model, const UnitEntry& unit, size_t param,
                                    const std::string& state) {
  if (!is_raw(model, state)) return 0;
  const auto parts = param_parts(unit, param);
  if (parts.empty()) return 0;
  const auto& ds = m_.file(parts.front().rank).datasets;
  const std::string codes = raw_state_dataset(model.name, unit.name, state, unit.params.at(param).name, "codes");
  return ds.count(codes) ? model.raw_state_block : 0;
}

void CheckpointReader::read_param_state(const ModelEntry& model, const UnitEntry& unit, size_t param,
                                        const std::string& state, int64_t lo, int64_t hi, float* out) {
  const ParamEntry& p = unit.params.at(param);
  if (!is_raw(model, state)) {
    if (model.dtype != "float32") {
      throw CheckpointError("checkpoint '" + dir_ + "': " + model.name + " states are " + model.dtype +
                            ", not float32");
    }
    read_flat(model, unit, "optim/" + state, p.offset + lo, p.offset + hi, out);
    return;
  }
  const int64_t block = raw_block(model, unit, param, state);
  if (block > 0) {  // the codes and absmax, as stored, then dequantized
    const int64_t b0 = lo / block * block;  // from the first block's start
    std::vector<uint8_t> codes(static_cast<size_t>(hi - b0));
    std::vector<float> absmax(static_cast<size_t>((hi - b0 + block - 1) / block));
    read_param_raw(model, unit, param, state, b0, hi, codes.data(), absmax.data());
    const size_t si = static_cast<size_t>(std::find(model.raw_states.begin(), model.raw_states.end(), state) -
                                          model.raw_states.begin());
    const auto& map = code_map(model.raw_state_maps.at(si) == "unsigned" ? CodeMap::kUnsigned : CodeMap::kSigned);
    for (int64_t i = lo; i < hi; ++i) {
      out[i - lo] = map[codes[static_cast<size_t>(i - b0)]] * absmax[static_cast<size_t>((i - b0) / block)];
    }
    return;
  }
  for_each_part(dir_, model, unit, param, state, lo, hi, [&](int rank, int64_t a, int64_t b, int64_t pa) {
    read_verified(rank, raw_state_dataset(model.name, unit.name, state, p.name, "float32"), a - pa, b - a,
                  out + (a - lo));
  });
}

void CheckpointReader::read_param_raw(const ModelEntry& model, const UnitEntry& unit, size_t param,
                                      const std::string& state, int64_t lo, int64_t hi, uint8_t* codes, float* absmax) {
  const ParamEntry& p = unit.params.at(param);
  const int64_t block = raw_block(model, unit, param, state);
  if (block == 0 || lo % block != 0) {
    throw CheckpointError("checkpoint '" + dir_ + "': " + model.name + "/" + unit.name + "." + p.name + "'s state '" +
                          state + "' has no 8-bit blocks starting at element " + std::to_string(lo));
  }
  for_each_part(dir_, model, unit, param, state, lo, hi, [&](int rank, int64_t a, int64_t b, int64_t pa) {
    if (pa % block != 0) fail_file(rank, "holds a part of '" + p.name + "' that does not start on a block");
    read_verified(rank, raw_state_dataset(model.name, unit.name, state, p.name, "codes"), a - pa, b - a,
                  codes + (a - lo));
    read_verified(rank, raw_state_dataset(model.name, unit.name, state, p.name, "absmax"), (a - pa) / block,
                  (b - a + block - 1) / block, absmax + (a - lo) / block);
  });
}

}  // namespace shardgan::ckpt
