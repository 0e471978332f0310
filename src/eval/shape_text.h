#pragma once
// A tensor shape as text for error messages, "[N, F]" (the eval files' refusals name shapes).
#include <string>

#include <c10/util/ArrayRef.h>

namespace shardgan::eval::detail {

inline std::string shape_str(c10::IntArrayRef s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

}  // namespace shardgan::eval::detail
