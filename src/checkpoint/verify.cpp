#include "shardgan/checkpoint/shard_io.h"

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "h5/inspect.h"
#include "shardgan/h5/probe.h"
#include "shardgan/util/isolate.h"
#include "index_layout.h"

// `shardgan-ckpt verify`: CheckpointReader::verify_all and what it checks beyond the
// checksums that every load checks (shard_io.cpp).

namespace shardgan::ckpt {
namespace fs = std::filesystem;
namespace {

std::string piece_text(const h5::File::VirtualPiece& p) {
  auto vec = [](const std::vector<int64_t>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
    return s + "]";
  };
  return "the box at " + vec(p.start) + " of extent " + vec(p.count) + " to " + p.src_file + ":/" + p.src_dataset +
         " from element " + std::to_string(p.src_start);
}

// The source's length is not compared: HDF5 does not keep it (the source dataset has it,
// and verify_all checks those lengths against the manifest).
bool same_piece(const h5::File::VirtualPiece& a, const h5::File::VirtualPiece& b) {
  return a.src_file == b.src_file && a.src_dataset == b.src_dataset && a.src_start == b.src_start &&
         a.start == b.start && a.count == b.count;
}

// What HDF5 readers (h5py, h5dump) see of the index: its attributes, and each virtual
// dataset's type, shape, attributes and mappings, against what the manifest implies. The
// loader never reads them, so without this a corrupted index would let h5py read wrong
// values (or none) from a checkpoint that verifies.
void check_index(const std::string& dir, const Manifest& m, std::vector<std::string>& problems) {
  const std::string path = dir + "/" + kIndexFile;
  auto problem = [&](const std::string& what) {
    problems.push_back("checkpoint '" + dir + "': " + kIndexFile + " is corrupted: " + what + "." + kDoWhat);
  };
  auto attempt = [&](auto&& fn) {
    try {
      fn();
    } catch (const std::exception& e) {
      problem(e.what());
    }
  };
  std::unique_ptr<h5::File> f;
  std::unique_ptr<h5::VirtualLayouts> vds;
  attempt([&] {
    f = std::make_unique<h5::File>(h5::File::open_read(path));
    vds = std::make_unique<h5::VirtualLayouts>(path);
  });
  if (!f || !vds) return;
  attempt([&] { h5::check_object_headers(path); });
  auto want_int = [&](const std::string& obj, const std::string& name, int64_t want) {
    attempt([&] {
      const int64_t got = f->attr_int(obj, name);
      if (got != want) {
        problem("attribute '" + name + "' of '" + obj + "' is " + std::to_string(got) + ", the manifest says " +
                std::to_string(want));
      }
    });
  };
  auto want_str = [&](const std::string& obj, const std::string& name, const std::string& want) {
    attempt([&] {
      if (f->attr_string(obj, name) != want) {
        problem("attribute '" + name + "' of '" + obj + "' differs from the manifest");
      }
    });
  };
  want_str("/", "format", kFormatName);
  want_int("/", "schema_version", m.schema_version);
  want_int("/", "world_size", m.world_size);
  want_int("/", "step", m.step);
  want_int("/", "epoch", m.epoch);
  want_int("/", "batch_in_epoch", m.batch_in_epoch);
  want_str("/", "config", m.config);
  for (const auto& [k, v] : m.scalars) {
    attempt([&] {
      const double got = f->attr_double("/", "scalar." + k);
      if (std::memcmp(&got, &v, sizeof(double)) != 0) {
        problem("attribute 'scalar." + k + "' of '/' differs from the manifest");
      }
    });
  }
  for (const ModelEntry& mo : m.models) {
    if (mo.units.empty() && mo.buffers.empty()) continue;  // no tensors: no group
    want_int(mo.name, "stage", mo.stage);
    want_int(mo.name, "optim_step", mo.optim_step);
    want_str(mo.name, "dtype", mo.dtype);
  }
  for (const IndexDataset& d : index_layout(m)) {
    attempt([&] {
      const std::string what = "virtual dataset '" + d.path + "'";
      if (f->shape(d.path) != d.shape) throw CheckpointError(what + " has another shape than the manifest's");
      if (f->dtype(d.path) != d.dt) throw CheckpointError(what + " has another type than the manifest's");
      const std::vector<h5::File::VirtualPiece> got = vds->pieces(d.path);
      if (got.size() != d.pieces.size()) {
        throw CheckpointError(what + " has " + std::to_string(got.size()) + " mappings, the manifest implies " +
                              std::to_string(d.pieces.size()));
      }
      for (size_t i = 0; i < got.size(); ++i) {
        if (!same_piece(got[i], d.pieces[i])) {
          throw CheckpointError(what + " maps " + piece_text(got[i]) + " where the manifest implies " +
                                piece_text(d.pieces[i]));
        }
      }
      if (d.is_param) {
        if (f->attr_string(d.path, "unit") != d.unit) throw CheckpointError(what + ": attribute 'unit' differs");
        if (f->attr_int(d.path, "flat_offset") != d.flat_offset) {
          throw CheckpointError(what + ": attribute 'flat_offset' differs");
        }
      }
    });
  }
}

template <typename Fn>
void attempt_into(std::vector<std::string>& problems, Fn&& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    problems.push_back(e.what());
  }
}

// Runs `fn`, which appends problems, in a child process (util/isolate.h), and appends what
// it found. HDF5 1.10 trusts its metadata more than a corrupted file deserves: for example,
// a virtual dataset whose global-heap reference points past the heap's objects makes
// H5Dopen read out of bounds and crash (SIGSEGV in H5HG_read), and a crafted selection can
// keep H5S_select_hyperslab busy for minutes. Isolated, such a crash or loop becomes one
// more problem naming the file (`what`); the child is killed after `deadline_s` seconds.
void isolated(std::vector<std::string>& problems, const std::string& what,
              const std::function<void(std::vector<std::string>&)>& fn, double deadline_s) {
  IsolatedResult r = run_isolated(what, fn, deadline_s);
  problems.insert(problems.end(), r.problems.begin(), r.problems.end());
  if (r.timed_out) {
    problems.push_back(what + ": checking it did not finish within " + std::to_string(static_cast<long long>(deadline_s)) +
                       " s, so its HDF5 metadata is corrupted (HDF5 loops on it) or the storage is very slow "
                       "(raise SHARDGAN_HDF5_PROBE_DEADLINE_S)." + kDoWhat);
  } else if (r.signal != 0) {
    problems.push_back(what + ": the HDF5 library " + r.failure() + " reading it, so its HDF5 metadata is corrupted." +
                       kDoWhat);
  } else if (r.exit_status != 0) {
    problems.push_back(what + ": checking it " + r.failure());
  }
}

}  // namespace

std::vector<std::string> CheckpointReader::verify_all() {
  std::vector<std::string> problems;
  // Every HDF5 read below runs in a child (isolated()), which is the probe's protection;
  // probing is back on when this returns or throws.
  probe_files_ = false;
  struct ProbeAgain {
    bool& flag;
    ~ProbeAgain() { flag = true; }
  } probe_again{probe_files_};
  // A rank file's child reads all of its data: its deadline adds 20 s per GB (50 MB/s).
  const double deadline_s = h5::probe_deadline_s();
  auto attempt = [&](auto&& fn) { attempt_into(problems, fn); };
  // Everything about one rank file (run in a child process, see isolated()).
  auto verify_file = [&](const FileEntry& fe, std::vector<std::string>& found) {
    auto note = [&](auto&& fn) { attempt_into(found, fn); };
    bool opened = false;
    note([&] {
      file(fe.rank);
      opened = true;
    });
    if (!opened) return;
    std::vector<char> buf;
    for (const auto& [path, de] : fe.datasets) {
      note([&] {
        h5::File& f = file(fe.rank);
        if (!f.exists(path)) fail_file(fe.rank, "dataset '" + path + "' is missing");
        const auto shape = f.shape(path);
        if (product(shape) != de.numel || f.dtype(path) != parse_dtype(de.dtype)) {
          fail_file(fe.rank, "dataset '" + path + "' has another size or type than the index records");
        }
        const int64_t eb = h5::dtype_bytes(parse_dtype(de.dtype)), be = m_.block_bytes / eb;
        for (int64_t s = 0; s < de.numel; s += be) {  // one block at a time: bounded memory
          const int64_t n = std::min(be, de.numel - s);
          buf.resize(static_cast<size_t>(n * eb));
          read_verified(fe.rank, path, s, n, buf.data());
        }
      });
    }
    // The file's own attributes (the loader does not need them, h5py shows them) must agree
    // with the index, and every object header must decode (h5py's visititems needs that).
    h5::File& f = file(fe.rank);
    auto want = [&](const std::string& obj, const std::string& name, int64_t v) {
      note([&] {
        const int64_t got = f.attr_int(obj, name);
        if (got != v) {
          fail_file(fe.rank, "attribute '" + name + "' of '" + obj + "' is " + std::to_string(got) +
                                 ", the index records " + std::to_string(v) + " (the file is corrupted)." + kDoWhat);
        }
      });
    };
    want("/", "schema_version", m_.schema_version);
    want("/", "world_size", m_.world_size);
    want("/", "rank", fe.rank);
    want("/", "step", m_.step);
    for (const ModelEntry& mo : m_.models) {
      bool holds = false;
      for (const BufferEntry& b : mo.buffers) holds = holds || b.rank == fe.rank;
      for (const UnitEntry& u : mo.units) {
        for (const ShardEntry& sh : u.shards) {
          if (sh.rank != fe.rank) continue;
          holds = true;
          const std::string g = mo.name + "/units/" + u.name;
          want(g, "numel", u.numel);
          want(g, "padded_numel", u.padded_numel);
          want(g, "shard_offset", sh.offset);
        }
      }
      if (holds) {
        want(mo.name, "optim_step", mo.optim_step);
        want(mo.name, "stage", mo.stage);
      }
    }
    note([&] {
      try {
        h5::check_object_headers(dir_ + "/" + fe.name);
      } catch (const std::exception& e) {
        fail_file(fe.rank, std::string(e.what()) + " (the file is corrupted)." + kDoWhat);
      }
    });
  };
  for (int r = 0; r < m_.world_size; ++r) {
    attempt([&] { m_.file(r); });
  }
  // Each file is checked in a child process (see isolated()).
  for (const FileEntry& fe : m_.files) {
    isolated(problems, "checkpoint '" + dir_ + "', rank " + std::to_string(fe.rank) + " file '" + fe.name + "'",
             [&](std::vector<std::string>& out) { verify_file(fe, out); },
             deadline_s + static_cast<double>(fe.bytes) / 50e6);
  }
  for (const ModelEntry& mo : m_.models) {
    for (const UnitEntry& u : mo.units) {
      attempt([&] {
        std::vector<std::pair<int64_t, int64_t>> ranges;
        for (const ShardEntry& sh : u.shards) {
          for (const std::string& kind : state_kinds(mo)) {
            const auto& ds = m_.file(sh.rank).datasets;
            auto it = ds.find(unit_dataset(mo.name, u.name, kind));
            if (it == ds.end() || it->second.numel != sh.numel) {
              fail_file(sh.rank, "holds no " + std::to_string(sh.numel) + "-element dataset '" +
                                     unit_dataset(mo.name, u.name, kind) + "' that the index maps");
            }
          }
          ranges.emplace_back(sh.offset, std::min(sh.offset + sh.numel, u.data_end()));
          // Raw (8-bit) states: for every parameter part the rank owns, its codes and
          // absmax, or its float32 values, each of the part's length.
          for (const std::string& state : mo.raw_states) {
            const auto& ds = m_.file(sh.rank).datasets;
            for (const ParamEntry& p : u.params) {
              const int64_t a = std::max(p.offset, sh.offset), b = std::min(p.offset + p.numel, sh.offset + sh.numel);
              if (a >= b) continue;
              auto numel = [&](const std::string& part) {
                auto it = ds.find(raw_state_dataset(mo.name, u.name, state, p.name, part));
                return it == ds.end() ? int64_t{-1} : it->second.numel;
              };
              const int64_t n = b - a, blocks = (n + mo.raw_state_block - 1) / mo.raw_state_block;
              const bool codes = numel("codes") == n && numel("absmax") == blocks && numel("float32") < 0;
              const bool values = numel("float32") == n && numel("codes") < 0 && numel("absmax") < 0;
              if (!codes && !values) {
                fail_file(sh.rank, "holds no " + std::to_string(n) + "-element parts of '" + p.name + "' for state '" +
                                       state + "' (codes and " + std::to_string(blocks) +
                                       " absmax values, or float32 values) that the index implies");
              }
            }
          }
        }
        std::sort(ranges.begin(), ranges.end());
        int64_t next = 0;
        for (auto [a, b] : ranges) {
          if (a != next) break;
          next = b;
        }
        if (next != u.data_end()) {
          throw CheckpointError("checkpoint '" + dir_ + "': " + mo.name + "/" + u.name + " elements [" +
                                std::to_string(next) + ", " + std::to_string(u.data_end()) +
                                ") are not held exactly once by the rank files (incomplete index)");
        }
      });
    }
  }
  isolated(problems, "checkpoint '" + dir_ + "': " + kIndexFile + " is corrupted",
           [&](std::vector<std::string>& out) { check_index(dir_, m_, out); }, deadline_s);
  return problems;
}

}  // namespace shardgan::ckpt
