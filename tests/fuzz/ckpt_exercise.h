#pragma once
// What the checkpoint fuzz targets (ckpt_index_fuzz.cpp, ckpt_rankfile_fuzz.cpp) do with a
// checkpoint folder: everything a reader of a checkpoint does, in this process. It is what
// `shardgan-ckpt verify` checks (src/checkpoint/verify.cpp) without verify's forked child,
// so that a crash is seen here instead of being reported as a problem, plus what --resume
// and the tools read: every tensor through the index, with a buffer of the size the
// index's shape gives (as the tools allocate it).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "h5/inspect.h"
#include "shardgan/checkpoint/manifest.h"
#include "shardgan/checkpoint/shard_io.h"

namespace shardgan::fuzz {

/// Tensors above this many elements are not read (a crafted shape could ask for any size;
/// the trainer compares shapes with its model before reading).
inline constexpr int64_t kMaxTensorElements = int64_t{1} << 22;
inline constexpr size_t kCanaryBytes = 4096;
inline constexpr unsigned char kCanary = 0xA5;

/// Writes `dir`/index.h5 holding what CheckpointReader reads from an index: the
/// schema_version attribute, the manifest text and its checksum.
inline void write_minimal_index(const std::string& dir, const std::string& manifest_text) {
  h5::File f = h5::File::create(dir + "/" + ckpt::kIndexFile);
  f.set_attr("/", "schema_version", ckpt::kSchemaVersion);
  f.write_string("manifest.json", manifest_text);
  f.set_attr("/", "manifest_xxh3",
             static_cast<int64_t>(ckpt::xxh3(manifest_text.data(), static_cast<int64_t>(manifest_text.size()))));
  f.close();
}

/// Opens the checkpoint in `dir` and reads everything in it; each part that fails with a
/// clear error is skipped. The outcome (last_outcome()) is "accepted" only when every part
/// succeeded, else the first part's error. `check_index`: also the index's virtual datasets
/// and object headers (an index written by write_minimal_index has no virtual datasets).
/// Returns whether the checkpoint opened.
inline bool exercise_checkpoint(const char* target, const std::string& dir, bool check_index) {
  bool opened = false;
  std::string first_error;
  auto part = [&](auto&& fn) {
    std::string msg;
    if (!clear_error_or_ok(target, fn, &msg) && first_error.empty()) first_error = msg;
  };
  part([&] { (void)ckpt::checkpoint_schema_version(dir); });
  run_reader(target, [&] {
    ckpt::CheckpointReader r(dir);
    opened = true;
    const ckpt::Manifest& m = r.manifest();
    (void)ckpt::to_json(m);
    const std::vector<ckpt::TensorRef> tensors = r.tensors();
    // --resume and the tools: each tensor in full.
    for (const ckpt::TensorRef& t : tensors) {
      part([&] {
        (void)r.holders(t);
        const int64_t n = t.numel();
        if (n < 0 || n > kMaxTensorElements) return;
        // A canary after the tensor's bytes: a write past them is a finding in the gcc replay
        // too, where no ASan watches.
        const auto bytes = static_cast<size_t>(n * h5::dtype_bytes(ckpt::parse_dtype(t.dtype)));
        std::vector<unsigned char> buf(bytes + kCanaryBytes, kCanary);
        r.read_tensor(t, buf.data());
        for (size_t i = bytes; i < buf.size(); ++i) {
          if (buf[i] != kCanary) {
            std::fprintf(stderr, "FINDING in %s: read_tensor wrote past the %zu bytes of '%s'\n", target, bytes,
                         t.path.c_str());
            std::abort();
          }
        }
      });
    }
#ifdef SHARDGAN_FUZZ_REPLAY
    // The replay (ctest fuzz_regression) runs verify itself, which checks each file in a
    // forked child: a corpus entry on which Debian's HDF5 crashes must come out of it as a
    // reported problem, not a dead process.
    // Without check_index, the index is write_minimal_index's, whose missing virtual
    // datasets verify reports: those problems are not the input's.
    part([&] {
      for (const std::string& p : r.verify_all()) {
        if (check_index || p.find(ckpt::kIndexFile) == std::string::npos) throw std::runtime_error("verify: " + p);
      }
    });
#else
    // Under libFuzzer, verify's checks run in this process instead (a crash in a child
    // would be reported by verify as a problem and never seen here).
    // Its per-file checks: every dataset the index records, block by block, the
    // file's attributes and every object header.
    for (const ckpt::FileEntry& fe : m.files) {
      for (const auto& [path, de] : fe.datasets) {
        part([&, &path = path, &de = de] {
          const int64_t eb = h5::dtype_bytes(ckpt::parse_dtype(de.dtype)), be = m.block_bytes / eb;
          if (be <= 0 || de.numel > kMaxTensorElements) return;
          std::vector<char> buf;
          for (int64_t s = 0; s < de.numel; s += be) {
            const int64_t n = std::min(be, de.numel - s);
            buf.resize(static_cast<size_t>(n * eb));
            r.read_verified(fe.rank, path, s, n, buf.data());
          }
        });
      }
      part([&] {
        h5::File f = h5::File::open_read(dir + "/" + fe.name);
        for (const char* a : {"schema_version", "world_size", "rank", "step"}) (void)f.attr_int("/", a);
        for (const ckpt::ModelEntry& mo : m.models) {
          for (const ckpt::UnitEntry& u : mo.units) {
            const std::string g = mo.name + "/units/" + u.name;
            for (const char* a : {"numel", "padded_numel", "shard_offset"}) {
              part([&] { (void)f.attr_int(g, a); });
            }
          }
        }
      });
      part([&] { h5::check_object_headers(dir + "/" + fe.name); });
    }
    // verify's index checks: the virtual datasets' mappings and every object header.
    if (check_index) {
      part([&] {
        h5::VirtualLayouts v(dir + "/" + ckpt::kIndexFile);
        for (const ckpt::TensorRef& t : tensors) part([&] { (void)v.pieces(t.path); });
      });
      part([&] { h5::check_object_headers(dir + "/" + ckpt::kIndexFile); });
    }
#endif
    if (!first_error.empty()) throw std::runtime_error(first_error);
  });
  return opened;
}

}  // namespace shardgan::fuzz
