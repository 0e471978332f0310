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

const char* to_string(OffloadGradDtype d) { return d == OffloadGradDtype::kBFloat16 ? "bfloat16" : "master"; }

OffloadGradDtype parse_offload_grad_dtype(const std::string& s) {
  if (s == "master" || s == "float32") return OffloadGradDtype::kMaster;
  if (s == "bfloat16") return OffloadGradDtype::kBFloat16;
  throw std::invalid_argument("'" + s + "': expected master (the shards' dtype, also written float32) or bfloat16");
}

}  // namespace shardgan
