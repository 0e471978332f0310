#include "shardgan/util/proc_status.h"

#include <fstream>
#include <string>

namespace shardgan {

int64_t proc_status_bytes(const char* field) {
  const std::string key = std::string(field) + ":";
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(key.size())) * 1024;  // kB
  }
  return -1;
}

}  // namespace shardgan
