// Isolated reads (include/shardgan/util/isolate.h, include/shardgan/h5/probe.h): a forked
// child with a deadline, and the HDF5 probe that the dataset reader, the FID classifier
// loader and the checkpoint reader run before HDF5 reads a file in-process. The crafted
// files are fuzzing finds (tests/fuzz/corpus/*/finding-hdf5-*) on which Debian's libhdf5
// 1.10 crashes or spins. Plain gtest, no MPI (the cases fork).
#include <gtest/gtest.h>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "shardgan/checkpoint/manifest.h"
#include "shardgan/checkpoint/shard_io.h"
#include "shardgan/data/hdf5_dataset.h"
#include "shardgan/data/images.h"
#include "shardgan/eval/classifier.h"
#include "shardgan/h5/probe.h"
#include "shardgan/util/isolate.h"

namespace fs = std::filesystem;
using namespace shardgan;

namespace {

std::string corpus(const std::string& target, const std::string& name) {
  return std::string(SHARDGAN_SOURCE_DIR) + "/tests/fuzz/corpus/" + target + "/" + name;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST(RunIsolated, ReturnsWhatTheChildFound) {
  const IsolatedResult r = run_isolated(
      "x", [](std::vector<std::string>& out) { out = {"first", "second"}; }, 10);
  EXPECT_EQ(r.problems, (std::vector<std::string>{"first", "second"}));
  EXPECT_EQ(r.failure(), "");
}

TEST(RunIsolated, AnExceptionIsAProblemNamingWhat) {
  const IsolatedResult r = run_isolated(
      "file.h5", [](std::vector<std::string>&) { throw std::runtime_error("bad header"); }, 10);
  ASSERT_EQ(r.problems.size(), 1u);
  EXPECT_EQ(r.problems[0], "file.h5: bad header");
  EXPECT_EQ(r.failure(), "");
}

TEST(RunIsolated, ACrashEndsTheChildNotThisProcess) {
  const IsolatedResult r = run_isolated(
      "x",
      [](std::vector<std::string>& out) {
        out.push_back("lost");  // sent only when the child finishes
        ::raise(SIGKILL);
      },
      10);
  EXPECT_EQ(r.signal, SIGKILL);
  EXPECT_TRUE(r.problems.empty());
  EXPECT_TRUE(contains(r.failure(), "crashed (signal 9")) << r.failure();
}

TEST(RunIsolated, TheDeadlineKillsAChildThatDoesNotFinish) {
  const auto t0 = std::chrono::steady_clock::now();
  const IsolatedResult r = run_isolated(
      "x",
      [](std::vector<std::string>&) {
        for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
      },
      0.5);
  EXPECT_TRUE(r.timed_out);
  EXPECT_LT(seconds_since(t0), 5.0);
  EXPECT_EQ(r.failure(), "did not finish within 0.5 s");
}

TEST(Hdf5Probe, ASoundFileProbesCleanAndOpens) {
  const std::string f = corpus("hdf5_dataset", "seed-ds-chunked.h5");
  EXPECT_EQ(h5::probe_isolated(f, {"imgs", "labels", "A"}), "");
  h5::probe_read(f, {"*"});
  const data::Hdf5Dataset ds(f);
  EXPECT_GT(ds.size(), 0);
}

// The file of the next cases, any reader's input: opening its crafted virtual dataset,
// libhdf5 1.10 overflows a buffer, which glibc's fortify check ends with SIGABRT. (Its
// over-reads, as in finding-hdf5-overread-*, crash only when the heap beyond lies badly.)
const std::string kCrashFile = corpus("ckpt_index", "finding-hdf5-abort-vds-selection.h5");

// The control of the next cases: in this process, the crafted file crashes libhdf5.
// Without it, an HDF5 that no longer crashes on the file would let the isolation cases pass
// without testing anything.
TEST(Hdf5Probe, ControlTheCrashFileCrashesHdf5InProcess) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::string f = kCrashFile;
  EXPECT_DEATH(h5::probe_read(f, {"*"}), "");
}

TEST(Hdf5Probe, TheDatasetReaderTurnsAnHdf5CrashIntoDataError) {
  const std::string f = kCrashFile;
  try {
    const data::Hdf5Dataset ds(f);
    FAIL() << "opened a file on which libhdf5 crashes";
  } catch (const DataError& e) {
    EXPECT_TRUE(contains(e.what(), f)) << e.what();
    EXPECT_TRUE(contains(e.what(), "the HDF5 library crashed")) << e.what();
  }
}

// A file whose chunk B-tree is corrupted, on which the reader's old scan of `labels`
// crashed in H5D__select_read: the probe's object walk refuses it first.
TEST(Hdf5Probe, ACorruptedChunkIndexIsAnErrorNamingTheFile) {
  const std::string f = corpus("hdf5_dataset", "finding-hdf5-segv-labels-read.h5");
  try {
    const data::Hdf5Dataset ds(f);
    FAIL() << "opened a file whose chunk index is corrupted";
  } catch (const DataError& e) {
    EXPECT_TRUE(contains(e.what(), f + ": an object header cannot be decoded")) << e.what();
  }
}

TEST(Hdf5Probe, AFileOnWhichHdf5SpinsEndsAtTheDeadline) {
  const std::string f = corpus("hdf5_dataset", "finding-hdf5-spin-metadata-cache.h5");
  const auto t0 = std::chrono::steady_clock::now();
  const std::string why = h5::probe_isolated(f, {"imgs", "labels", "A"}, 2.0);
  EXPECT_LT(seconds_since(t0), 10.0);
  EXPECT_TRUE(contains(why, "did not finish within 2 s")) << why;
}

TEST(Hdf5Probe, TheCheckpointReaderBoundsACraftedIndex) {
  const fs::path dir = fs::temp_directory_path() / ("shardgan_isolate_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  fs::copy_file(corpus("hdf5_dataset", "finding-hdf5-spin-metadata-cache.h5"), dir / ckpt::kIndexFile,
                fs::copy_options::overwrite_existing);
  ::setenv("SHARDGAN_HDF5_PROBE_DEADLINE_S", "2", 1);
  const auto t0 = std::chrono::steady_clock::now();
  std::string what;
  try {
    ckpt::CheckpointReader r(dir.string());
  } catch (const CheckpointError& e) {
    what = e.what();
  }
  ::unsetenv("SHARDGAN_HDF5_PROBE_DEADLINE_S");
  fs::remove_all(dir);
  EXPECT_LT(seconds_since(t0), 10.0);
  EXPECT_TRUE(contains(what, "did not finish within 2 s")) << what;
  EXPECT_TRUE(contains(what, ckpt::kIndexFile)) << what;
}

TEST(Hdf5Probe, TheClassifierLoaderProbesFirst) {
  const std::string f = corpus("classifier", "seed-classifier-contiguous-small.h5");
  EXPECT_EQ(h5::probe_isolated(f, {"*"}), "");
  eval::ClassifierInfo info;
  (void)eval::load_classifier(f, &info);
  const std::string bad = kCrashFile;
  try {
    (void)eval::load_classifier(bad);
    FAIL() << "loaded a file on which libhdf5 crashes";
  } catch (const eval::ClassifierFileError& e) {
    EXPECT_TRUE(contains(e.what(), "the HDF5 library crashed")) << e.what();
  }
}

TEST(Hdf5Probe, ABadDeadlineVariableIsRefusedByName) {
  ::setenv("SHARDGAN_HDF5_PROBE_DEADLINE_S", "soon", 1);
  EXPECT_THROW(h5::probe_deadline_s(), std::invalid_argument);
  ::setenv("SHARDGAN_HDF5_PROBE_DEADLINE_S", "0", 1);
  EXPECT_THROW(h5::probe_deadline_s(), std::invalid_argument);
  ::setenv("SHARDGAN_HDF5_PROBE_DEADLINE_S", "7.5", 1);
  EXPECT_EQ(h5::probe_deadline_s(), 7.5);
  ::unsetenv("SHARDGAN_HDF5_PROBE_DEADLINE_S");
  EXPECT_EQ(h5::probe_deadline_s(), h5::kProbeDeadlineS);
}
