// The offload store (src/offload: OffloadStore over DirectFile): the streamed store equals
// in-memory arithmetic for every ring size, arrays of mixed element sizes round-trip, the
// disk tier's RAM stays within its ring (VmRSS measured), and every failure names the path:
// a missing or unwritable offload.path, a leftover or live file, a filesystem without
// O_DIRECT (ramfs: buffered fallback), a disk too small (tmpfs).
#include <sys/mount.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "offload_fixture.h"
#include "shardgan/offload/direct_file.h"
#include "shardgan/offload/state_store.h"

// The gtest files compile together in batches (tests/CMakeLists.txt): this file's names
// live in a namespace of its own.
namespace SHARDGAN_UNITY_ID {

using namespace shardgan;
using namespace offload_fixture;
namespace fs = std::filesystem;

namespace {

// Streams y = 3*x + unit + chunk-offset through the store, with x the store's array 0 and a
// staging copy in scratch 0; checks it against the same arithmetic on in-memory tensors.
void check_store_arithmetic(OffloadDevice dev, int64_t count, const std::vector<int64_t>& sizes) {
  TempDir dir;
  OffloadConfig cfg = disk_config(dir.path, count);
  OffloadStore store(dev, cfg, "t", sizes, 2, 1, 4);
  std::vector<at::Tensor> ref_a, ref_b;
  for (int64_t n : sizes) {
    ref_a.push_back(torch::zeros({n}));
    ref_b.push_back(torch::zeros({n}));
  }
  std::vector<size_t> units(sizes.size());
  for (size_t i = 0; i < units.size(); ++i) units[i] = i;
  for (int round = 0; round < 3; ++round) {
    store.stream(units, OffloadStore::Mode::kUpdate, [&](const OffloadStore::Chunk& c) {
      auto a = torch::from_blob(c.data[0], {c.numel}), b = torch::from_blob(c.data[1], {c.numel});
      auto s = torch::from_blob(c.scratch[0], {c.numel});
      s.copy_(a);
      a.copy_(s * 3 + static_cast<double>(c.unit) + torch::arange(c.offset, c.offset + c.numel).to(torch::kFloat) * 1e-3);
      b.add_(a);
    });
    for (size_t u = 0; u < sizes.size(); ++u) {
      ref_a[u] = ref_a[u] * 3 + static_cast<double>(u) + torch::arange(0, sizes[u]).to(torch::kFloat) * 1e-3;
      ref_b[u].add_(ref_a[u]);
    }
  }
  int64_t seen = 0;
  store.stream(units, OffloadStore::Mode::kRead, [&](const OffloadStore::Chunk& c) {
    auto a = torch::from_blob(c.data[0], {c.numel}), b = torch::from_blob(c.data[1], {c.numel});
    EXPECT_TRUE(torch::equal(a, ref_a[c.unit].narrow(0, c.offset, c.numel))) << "unit " << c.unit << " at " << c.offset;
    EXPECT_TRUE(torch::equal(b, ref_b[c.unit].narrow(0, c.offset, c.numel))) << "unit " << c.unit << " at " << c.offset;
    seen += c.numel;
  });
  int64_t total = 0;
  for (int64_t n : sizes) total += n;
  EXPECT_EQ(seen, total);
}

TEST(OffloadStore, StreamedArithmeticEqualsInMemoryForEveryRingSize) {
  // Units smaller than a chunk, exactly one chunk (87040 floats for 3 slices of 1 MiB),
  // several chunks with a partial tail, and an empty one.
  const std::vector<int64_t> sizes = {1000, 87040, 300001, 0, 5};
  for (int64_t count : {2, 3, 4, 7}) {
    SCOPED_TRACE("buffer_count " + std::to_string(count));
    check_store_arithmetic(OffloadDevice::kDisk, count, sizes);
    check_store_arithmetic(OffloadDevice::kCpu, count, sizes);
  }
}

// Arrays of different element sizes (a float32 master 4, 8-bit codes 1, a bfloat16
// gradient 2) and a chunk multiple (an 8-bit block of 256): every chunk's element count is
// a multiple of both the block and 4096 (the 1-byte array's slice is then whole 4096-byte
// blocks), and each array's bytes written through the ring read back unchanged, on cpu and disk.
TEST(OffloadStore, MixedElementSizesRoundTrip) {
  const std::vector<int64_t> sizes = {5000, 70000, 256, 0};
  for (auto dev : {OffloadDevice::kCpu, OffloadDevice::kDisk}) {
    SCOPED_TRACE(to_string(dev));
    TempDir dir;
    OffloadConfig cfg = disk_config(dir.path, 3);
    cfg.buffer_bytes = 256 << 10;
    OffloadStore store(dev, cfg, "mixed", sizes, {4, 1, 2}, {4}, 256);
    EXPECT_EQ(store.chunk_numel() % 4096, 0);
    EXPECT_LT(store.chunk_numel(), 70000);  // the 70000-element unit spans several chunks
    EXPECT_EQ(store.array_bytes(1), 1);
    EXPECT_EQ(store.scratch_bytes(0), 4);
    auto byte = [](size_t u, int a, int64_t i, int64_t k) { return static_cast<uint8_t>((u * 31 + a * 7 + i + k) & 0xff); };
    const std::vector<size_t> units = {0, 1, 2, 3};
    store.stream(units, OffloadStore::Mode::kWrite, [&](const OffloadStore::Chunk& c) {
      EXPECT_EQ(c.offset % 256, 0);
      for (int a = 0; a < 3; ++a) {
        auto* p = static_cast<uint8_t*>(c.data[a]);
        const int64_t e = store.array_bytes(a);
        for (int64_t i = 0; i < c.numel * e; ++i) p[i] = byte(c.unit, a, c.offset * e + i, 0);
      }
    });
    int64_t bad = 0;
    store.stream(units, OffloadStore::Mode::kRead, [&](const OffloadStore::Chunk& c) {
      for (int a = 0; a < 3; ++a) {
        const auto* p = static_cast<const uint8_t*>(c.data[a]);
        const int64_t e = store.array_bytes(a);
        for (int64_t i = 0; i < c.numel * e; ++i) bad += p[i] != byte(c.unit, a, c.offset * e + i, 0);
      }
    });
    EXPECT_EQ(bad, 0);
    EXPECT_EQ(store.state_bytes(), (5000 + 70000 + 256) * 7);
  }
}

TEST(OffloadStore, DiskTierRamStaysWithinTheRing) {
  TempDir dir;
  OffloadConfig cfg = disk_config(dir.path, 4);
  // 2 arrays x 48M floats = 384 MiB of state through a 4 MiB ring.
  const int64_t n = 48LL << 20;
  const int64_t rss0 = vm_rss_bytes();
  OffloadStore store(OffloadDevice::kDisk, cfg, "rss", {n}, 2, 1, 4);
  int64_t peak = 0;
  store.stream({0}, OffloadStore::Mode::kUpdate, [&](const OffloadStore::Chunk& c) {
    std::fill_n(static_cast<float*>(c.data[0]), c.numel, 1.0f);
    std::fill_n(static_cast<float*>(c.data[1]), c.numel, 2.0f);
    peak = std::max(peak, vm_rss_bytes());
  });
  const int64_t growth = peak - rss0;
  std::printf("[ offload ] state %lld B through a ring of %lld B: VmRSS grew %lld B (O_DIRECT %s)\n",
              static_cast<long long>(store.state_bytes()), static_cast<long long>(store.ram_bytes()),
              static_cast<long long>(growth), store.direct() ? "on" : "off");
  EXPECT_TRUE(store.direct());
  EXPECT_EQ(store.bytes_written(), store.state_bytes());
  EXPECT_LE(store.ram_bytes(), cfg.buffer_count * cfg.buffer_bytes);
  // The ring plus 8 MiB for the allocator and the test's own pages: far below the state.
  // Not under scripts/sanitize.sh: ASan's quarantine and TSan's shadow memory count in VmRSS.
  if (std::getenv("SHARDGAN_SANITIZE") == nullptr) EXPECT_LE(growth, store.ram_bytes() + (8 << 20));
  EXPECT_GE(store.state_bytes(), 40 * store.ram_bytes());
  // The measurement sees state held in RAM: the cpu tier of the same size grows VmRSS by
  // at least the state (a disk tier that kept its state in memory would fail above).
  const int64_t rss1 = vm_rss_bytes();
  OffloadStore cpu(OffloadDevice::kCpu, cfg, "rss", {n}, 2, 1, 4);
  EXPECT_GE(vm_rss_bytes() - rss1, cpu.state_bytes());
}

TEST(OffloadStore, MissingOrUnwritablePathIsAnErrorNamingIt) {
  OffloadConfig cfg = disk_config("/nonexistent/shardgan-offload");
  try {
    OffloadStore s(OffloadDevice::kDisk, cfg, "x", {10}, 2, 0, 4);
    FAIL() << "no error for a missing folder";
  } catch (const OffloadError& e) {
    EXPECT_NE(std::string(e.what()).find("'/nonexistent/shardgan-offload' does not exist"), std::string::npos) << e.what();
  }
  cfg.path = "/proc";  // a folder nobody, root included, can create files in
  try {
    OffloadStore s(OffloadDevice::kDisk, cfg, "x", {10}, 2, 0, 4);
    FAIL() << "no error for an unwritable folder";
  } catch (const OffloadError& e) {
    EXPECT_NE(std::string(e.what()).find("/proc/x.offload"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("cannot create it"), std::string::npos) << e.what();
  }
}

TEST(OffloadStore, LeftoverFileIsReplacedAndALiveOneRefused) {
  TempDir dir;
  const std::string f = dir.path + "/g.offload";
  {
    std::ofstream junk(f);
    junk << std::string(8192, '\x7f');  // a killed run's file: must not be read as state
  }
  OffloadStore s(OffloadDevice::kDisk, disk_config(dir.path), "g", {2048}, 2, 0, 4);
  s.stream({0}, OffloadStore::Mode::kRead, [&](const OffloadStore::Chunk& c) {
    EXPECT_TRUE(torch::equal(torch::from_blob(c.data[0], {c.numel}), torch::zeros({c.numel})));
  });
  // A second store on the same file (another run with the same offload.path) is refused.
  try {
    OffloadStore t(OffloadDevice::kDisk, disk_config(dir.path), "g", {2048}, 2, 0, 4);
    FAIL() << "no error for a file in use";
  } catch (const OffloadError& e) {
    EXPECT_NE(std::string(e.what()).find("locked by another process"), std::string::npos) << e.what();
  }
  // ... and it left the live store's file as it was.
  EXPECT_EQ(static_cast<int64_t>(fs::file_size(f)), s.disk_bytes());
}

TEST(OffloadStore, FileIsRemovedAtExit) {
  TempDir dir;
  {
    OffloadStore s(OffloadDevice::kDisk, disk_config(dir.path), "g", {2048}, 2, 0, 4);
    EXPECT_TRUE(fs::exists(dir.path + "/g.offload"));
  }
  EXPECT_FALSE(fs::exists(dir.path + "/g.offload"));
}

// Mounts a small filesystem (root only; skipped elsewhere, with the reason).
struct Mount {
  Mount(const std::string& type, const std::string& opts) {
    char t[] = "/tmp/shardgan-mnt.XXXXXX";
    path = ::mkdtemp(t);
    ok = ::mount(type.c_str(), path.c_str(), type.c_str(), 0, opts.c_str()) == 0;
  }
  ~Mount() {
    if (ok) ::umount(path.c_str());
    ::rmdir(path.c_str());
  }
  std::string path;
  bool ok = false;
};

TEST(OffloadStore, RamfsRefusesODirectAndFallsBackToBufferedIo) {
  Mount m("ramfs", "");
  if (!m.ok) GTEST_SKIP() << "cannot mount ramfs here (needs root): the O_DIRECT fallback is not exercised";
  OffloadStore s(OffloadDevice::kDisk, disk_config(m.path), "g", {100000}, 2, 1, 4);
  EXPECT_FALSE(s.direct());
  s.stream({0}, OffloadStore::Mode::kUpdate, [&](const OffloadStore::Chunk& c) {
    std::fill_n(static_cast<float*>(c.data[0]), c.numel, 4.0f);
  });
  s.stream({0}, OffloadStore::Mode::kRead, [&](const OffloadStore::Chunk& c) {
    EXPECT_EQ(static_cast<float*>(c.data[0])[c.numel - 1], 4.0f);
  });
}

TEST(OffloadStore, DiskTooSmallFailsAtStartNamingThePath) {
  Mount m("tmpfs", "size=4m");
  if (!m.ok) GTEST_SKIP() << "cannot mount a tmpfs here (needs root): disk full is not exercised";
  try {
    OffloadStore s(OffloadDevice::kDisk, disk_config(m.path), "g", {8 << 20}, 2, 0, 4);  // 64 MiB
    FAIL() << "no error for a 64 MiB state on a 4 MiB disk";
  } catch (const OffloadError& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find(m.path + "/g.offload"), std::string::npos) << w;
    EXPECT_NE(w.find("disk is too small"), std::string::npos) << w;
  }
  EXPECT_FALSE(fs::exists(m.path + "/g.offload"));  // nothing left behind
}

}  // namespace

}  // namespace SHARDGAN_UNITY_ID
