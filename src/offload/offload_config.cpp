#include "shardgan/offload/offload_config.h"

#include <stdexcept>

namespace shardgan {

const char* to_string(OffloadDevice d) {
  switch (d) {
    case OffloadDevice::kNone: return "none";
    case OffloadDevice::kCpu: return "cpu";
    case OffloadDevice::kDisk: return "disk";
  }
  return "?";
}

OffloadDevice parse_offload_device(const std::string& s) {
  for (auto d : {OffloadDevice::kNone, OffloadDevice::kCpu, OffloadDevice::kDisk}) {
    if (s == to_string(d)) return d;
  }
  throw std::invalid_argument("'" + s + "': expected none, cpu or disk");
}

}  // namespace shardgan
