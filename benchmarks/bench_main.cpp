// main() of shardgan_benchmarks: runs the benchmark named by the program's name
// (build/benchmarks/bench_x is a link to the executable), or by the first argument when the
// executable is called by its own name. benchmarks/registry.h says why it is one executable.
#include <cstdio>
#include <map>
#include <string>

#include "registry.h"

namespace shardgan::bench {
namespace {

std::map<std::string, BenchMain>& table() {
  static std::map<std::string, BenchMain> t;
  return t;
}

}  // namespace

bool register_benchmark(const char* name, BenchMain fn) {
  table()[name] = fn;
  return true;
}

}  // namespace shardgan::bench

int main(int argc, char** argv) {
  const auto& table = shardgan::bench::table();
  std::string name = argv[0];
  name = name.substr(name.find_last_of('/') + 1);
  if (table.count(name) == 0 && argc > 1 && table.count(argv[1]) != 0) {  // shardgan_benchmarks bench_x ARGS
    name = argv[1];
    --argc;
    ++argv;
  }
  const auto it = table.find(name);
  if (it == table.end()) {
    std::fprintf(stderr, "shardgan_benchmarks: no benchmark called '%s'; run one of:", name.c_str());
    for (const auto& [known, fn] : table) std::fprintf(stderr, " %s", known.c_str());
    std::fprintf(stderr, "\n(build/benchmarks/NAME ARGS, or shardgan_benchmarks NAME ARGS)\n");
    return 2;
  }
  return it->second(argc, argv);
}
