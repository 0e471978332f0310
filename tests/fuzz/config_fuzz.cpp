// Fuzz target: the YAML config reader with `--set` overrides (parse_config,
// include/shardgan/train/config.h). The input is a YAML document, then optionally a NUL
// byte and up to 8 override lines "key=value" separated by '\n'. parse_config documents
// ConfigError (a std::runtime_error) for every bad config; anything else is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_common.h"
#include "shardgan/train/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  shardgan::fuzz::quiet_libraries();
  std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t nul = in.find('\0');
  const std::string yaml(in.substr(0, nul));
  std::vector<std::string> overrides;
  if (nul != std::string_view::npos) {
    std::string_view rest = in.substr(nul + 1);
    while (!rest.empty() && overrides.size() < 8) {
      const size_t nl = rest.find('\n');
      overrides.emplace_back(rest.substr(0, nl));
      if (nl == std::string_view::npos) break;
      rest.remove_prefix(nl + 1);
    }
  }
  shardgan::fuzz::run_reader("config_fuzz", [&] {
    const shardgan::TrainConfig c = shardgan::parse_config(yaml, "fuzz-config.yaml", overrides);
    // An accepted config prints (--print-config) as YAML that parses back to the same
    // resolved keys (config.h's promise); a break of it is a finding.
    std::string again;
    try {
      again = shardgan::parse_config(c.resolved_nested_yaml, "printed", {}).resolved_yaml;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "FINDING in config_fuzz: the printed config does not parse back: %s\n%s\n", e.what(),
                   c.resolved_nested_yaml.c_str());
      std::abort();
    }
    if (again != c.resolved_yaml) {
      std::fprintf(stderr, "FINDING in config_fuzz: the printed config parses to other values:\n%s\n---\n%s\n",
                   c.resolved_yaml.c_str(), again.c_str());
      std::abort();
    }
  });
  return 0;
}
