#include "shardgan/util/test_control.h"

#include <cstdlib>
#include <string>
#include <vector>

namespace shardgan {

namespace {
std::vector<std::string> parse() {
  std::vector<std::string> out;
  const char* e = std::getenv("SHARDGAN_TEST_CONTROL");
  if (!e) return out;
  std::string s(e);
  size_t start = 0;
  while (start <= s.size()) {
    const size_t comma = s.find(',', start);
    const size_t end = comma == std::string::npos ? s.size() : comma;
    if (end > start) out.push_back(s.substr(start, end - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}
}  // namespace

bool test_control(std::string_view name) {
  static const std::vector<std::string> controls = parse();
  for (const auto& c : controls) {
    if (c == name) return true;
  }
  return false;
}

}  // namespace shardgan
