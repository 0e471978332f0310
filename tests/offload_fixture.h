#pragma once
// Shared by the offload tests (test_offload.cpp, test_offload_store.cpp): a temporary folder
// removed at exit, a disk-tier config with the smallest ring the config allows, and VmRSS.
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "shardgan/offload/offload_config.h"

namespace offload_fixture {

using namespace shardgan;

struct TempDir {
  TempDir() {
    char t[] = "/tmp/shardgan-offload.XXXXXX";
    path = ::mkdtemp(t);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string path;
};

inline OffloadConfig disk_config(const std::string& path, int64_t count = 4) {
  OffloadConfig c;
  c.optimizer = OffloadDevice::kDisk;
  c.path = path;
  c.buffer_bytes = int64_t{1} << 20;  // the smallest the config allows: many chunks per unit
  c.buffer_count = count;
  c.queue_depth = 8;
  return c;
}

inline int64_t vm_rss_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return -1;
}

}  // namespace offload_fixture
