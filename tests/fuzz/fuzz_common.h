#pragma once
// Shared helpers of the fuzz targets (tests/fuzz/*_fuzz.cpp), header-only so that each
// target is one translation unit for both builds: clang + libFuzzer (scripts/fuzz.sh,
// tests/fuzz/fuzz_targets.cmake) and gcc + driver_main.cpp (ctest fuzz_regression,
// tests/fuzz_tests.cmake).
//
// What counts as a finding: a crash, an abort, a hang, a sanitizer report, or an exception
// of a type the reader does not document. `run_reader` catches the documented ones (every
// shardgan error class derives from std::runtime_error; std::invalid_argument and
// std::out_of_range where the header names them) and records the outcome; any other
// exception is reported and aborts, so that libFuzzer (and the replay driver) sees it.
#include <hdf5.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <typeinfo>
#include <vector>

#include "shardgan/h5/probe.h"

namespace shardgan::fuzz {

/// How the last input went: accepted by the reader, or refused with a clear error.
struct Outcome {
  bool accepted = false;
  std::string message;  ///< the error's text when refused
};
inline Outcome& last_outcome() {
  static Outcome o;
  return o;
}

/// Silences HDF5's automatic error-stack printing and spdlog (the readers' messages are in
/// their exceptions), and under libFuzzer turns the forked HDF5 probe off; idempotent.
inline void quiet_libraries() {
  static const bool done = [] {
#ifndef SHARDGAN_FUZZ_REPLAY
    // Under libFuzzer, a reader's HDF5 calls run in this process, not first in the forked
    // probe (include/shardgan/h5/probe.h), whose coverage and crashes libFuzzer cannot see.
    // The replay keeps the probe: it is what protects the product from the library-crash
    // entries of the corpus.
    h5::set_probing(false);
#endif
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    spdlog::set_level(spdlog::level::off);
    return true;
  }();
  (void)done;
}

/// A per-process scratch folder: $SHARDGAN_FUZZ_TMP, else /dev/shm when it exists, else
/// $TMPDIR or /tmp; named after the target and the pid, created once, removed at exit.
inline const std::string& scratch_dir(const char* target) {
  static const std::string dir = [target] {
    namespace fs = std::filesystem;
    std::string base;
    if (const char* e = std::getenv("SHARDGAN_FUZZ_TMP"); e && *e) {
      base = e;
    } else if (fs::is_directory("/dev/shm")) {
      base = "/dev/shm";
    } else if (const char* t = std::getenv("TMPDIR"); t && *t) {
      base = t;
    } else {
      base = "/tmp";
    }
    std::string d = base + "/shardgan-fuzz-" + target + "-" + std::to_string(::getpid());
    fs::create_directories(d);
    static struct Cleanup {
      std::string path;
      ~Cleanup() {
        std::error_code ec;
        std::filesystem::remove_all(path, ec);
      }
    } cleanup{d};
    return d;
  }();
  return dir;
}

/// Empties `dir` (keeps the folder itself).
inline void clear_dir(const std::string& dir) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) std::filesystem::remove_all(e.path(), ec);
}

inline void write_file(const std::string& path, const void* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!out) {
    std::fprintf(stderr, "fuzz harness: cannot write %s\n", path.c_str());
    std::abort();  // the harness's own failure, not the reader's: stop loudly
  }
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "fuzz harness: cannot read %s\n", path.c_str());
    std::abort();
  }
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

/// The separator of the small multi-file container some targets decode: the fuzz input is
/// `header` followed by entries separated by this marker.
inline constexpr std::string_view kFileSeparator = "@@FILE@@";

/// Splits `data` at kFileSeparator into at most `max_parts` parts (the last keeps the rest).
inline std::vector<std::string_view> split_parts(std::string_view data, size_t max_parts) {
  std::vector<std::string_view> parts;
  while (parts.size() + 1 < max_parts) {
    const size_t at = data.find(kFileSeparator);
    if (at == std::string_view::npos) break;
    parts.push_back(data.substr(0, at));
    data.remove_prefix(at + kFileSeparator.size());
  }
  parts.push_back(data);
  return parts;
}

/// Runs `fn`; returns true when it returned, false when it threw a clear error (its text
/// in `*message` if given). The clear errors: std::runtime_error (every shardgan error
/// class, h5::H5Error, yaml-cpp's and nlohmann::json's are std::runtime_error or are
/// wrapped in one), std::invalid_argument and std::out_of_range (documented by
/// Manifest::file and Hdf5Dataset::read). Anything else escaping the reader is a finding:
/// printed, then abort().
template <typename Fn>
bool clear_error_or_ok(const char* target, Fn&& fn, std::string* message = nullptr) {
  try {
    fn();
    return true;
  } catch (const std::runtime_error& e) {
    if (message) *message = e.what();
  } catch (const std::invalid_argument& e) {
    if (message) *message = e.what();
  } catch (const std::out_of_range& e) {
    if (message) *message = e.what();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "FINDING in %s: undocumented exception %s: %s\n", target, typeid(e).name(), e.what());
    std::abort();
  } catch (...) {
    std::fprintf(stderr, "FINDING in %s: a non-std exception escaped the reader\n", target);
    std::abort();
  }
  return false;
}

/// After an input, no HDF5 object may be left open: a leaked file id keeps HDF5's cached
/// view of a file that the next input replaces (same path, same tmpfs inode), and an
/// error path that leaks ids leaks them in a long run too. A finding otherwise.
inline void check_no_open_hdf5_objects(const char* target) {
  const ssize_t n = H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL);
  if (n <= 0) return;
  std::fprintf(stderr, "FINDING in %s: %zd HDF5 objects left open after the input:", target, static_cast<ssize_t>(n));
  std::vector<hid_t> ids(static_cast<size_t>(n));
  const ssize_t got = H5Fget_obj_ids(H5F_OBJ_ALL, H5F_OBJ_ALL, ids.size(), ids.data());
  for (ssize_t i = 0; i < got; ++i) {
    char name[512] = "?";
    if (H5Iget_type(ids[i]) == H5I_FILE) {
      H5Fget_name(ids[i], name, sizeof(name));
    } else {
      H5Iget_name(ids[i], name, sizeof(name));
    }
    std::fprintf(stderr, " [type %d: %s]", static_cast<int>(H5Iget_type(ids[i])), name);
  }
  std::fprintf(stderr, "\n");
  std::abort();
}

/// clear_error_or_ok, recording the outcome in last_outcome() (one read of the input).
template <typename Fn>
void run_reader(const char* target, Fn&& fn) {
  Outcome& o = last_outcome();
  o = {};
  o.accepted = clear_error_or_ok(target, fn, &o.message);
  check_no_open_hdf5_objects(target);
}

}  // namespace shardgan::fuzz
