// A plain main() for the fuzz targets (no libFuzzer, any compiler): replays inputs through
// LLVMFuzzerTestOneInput, one line per input and a summary, for ctest's fuzz_regression
// (tests/fuzz_tests.cmake) and for reproducing a finding in a gcc build.
//
//   fuzz_replay_<target> [--min-accepted N] PATH...
// Each PATH is a file or a folder (every regular file in it, sorted by name, not
// recursive). Prints "ok" or "refused: <error>" per input. Exits 0 when every input ran
// (a crash, abort or sanitizer report ends the process instead), 1 when fewer than N
// inputs were accepted (a corpus whose seeds no longer reach the reader), 2 on bad use.
//
// Negative control (test_control "fuzz_planted_crash"): an input that starts with
// "PLANTED" aborts here as a crash in the reader would, so that ctest's
// fuzz_regression_control shows that a crashing corpus entry fails the replay.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "shardgan/util/test_control.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  int64_t min_accepted = 0;
  std::vector<std::string> inputs;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--min-accepted" && i + 1 < argc) {
      min_accepted = std::atoll(argv[++i]);
    } else if (fs::is_directory(a)) {
      std::vector<std::string> files;
      for (const auto& e : fs::directory_iterator(a)) {
        if (e.is_regular_file()) files.push_back(e.path().string());
      }
      std::sort(files.begin(), files.end());
      inputs.insert(inputs.end(), files.begin(), files.end());
    } else if (fs::is_regular_file(a)) {
      inputs.push_back(a);
    } else {
      std::fprintf(stderr, "usage: %s [--min-accepted N] FILE_OR_FOLDER...: '%s' is neither\n", argv[0], a.c_str());
      return 2;
    }
  }
  if (inputs.empty()) {
    std::fprintf(stderr, "%s: no inputs\n", argv[0]);
    return 2;
  }
  int64_t accepted = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (const std::string& path : inputs) {
    const std::string bytes = shardgan::fuzz::read_file(path);
    std::printf("%s: ", path.c_str());
    std::fflush(stdout);
    // Control fuzz_planted_crash: a planted crash on inputs starting with "PLANTED".
    if (shardgan::test_control("fuzz_planted_crash") && bytes.rfind("PLANTED", 0) == 0) {
      std::fprintf(stderr, "planted crash (control fuzz_planted_crash)\n");
      std::abort();
    }
    const auto s = std::chrono::steady_clock::now();
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s).count();
    const auto& o = shardgan::fuzz::last_outcome();
    if (o.accepted) ++accepted;
    std::string msg = o.message.substr(0, 160);
    std::replace(msg.begin(), msg.end(), '\n', ' ');
    std::printf("%s%s (%.1f ms)\n", o.accepted ? "ok" : "refused: ", msg.c_str(), ms);
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%zu inputs replayed in %.2f s: %lld accepted, %lld refused with a clear error, 0 crashes\n",
              inputs.size(), s, static_cast<long long>(accepted), static_cast<long long>(inputs.size()) - accepted);
  if (accepted < min_accepted) {
    std::printf("FAIL: %lld inputs accepted, at least %lld expected (do the seeds still reach the reader?)\n",
                static_cast<long long>(accepted), static_cast<long long>(min_accepted));
    return 1;
  }
  return 0;
}
