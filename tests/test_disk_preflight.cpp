// The disk pre-flight (train/preflight.h: checkpoint_saves, disk_report, check_disk): the
// saves a run makes, this run's offload files credited as free, and the refusals, each
// naming the folder and the keys, on reports with set free-space figures. Local; run under
// mpirun with 1 rank like the other tests. Negative control, run once: giving the
// checkpoints the filesystem's whole free space when the offload files share it fails
// RefusesWhatDoesNotFitAndNamesTheKeys.
// Issue 58, finding 4: the leftovers of a crashed save (step-*.tmp, .old, .del) are counted
// and credited once the first commit deletes them (CountsACrashedSavesLeftovers), and a save
// writes nothing while the last save's rotated checkpoints are still being deleted
// (SaveWaitsForPendingDeletion; its ctest control, save_skips_deletion_wait, must fail).
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "shardgan/checkpoint/checkpoint.h"
#include "shardgan/comm/mpi_communicator.h"
#include "shardgan/sharding/sharded_model.h"
#include "shardgan/train/preflight.h"

// The gtest files compile together in batches (tests/CMakeLists.txt): this file's names
// live in a namespace of its own.
namespace SHARDGAN_UNITY_ID {

using namespace shardgan;

namespace {

TrainConfig run(int64_t steps, int64_t every, bool final_ckpt, int64_t keep = 3) {
  TrainConfig c;
  c.source = "test.yaml";
  c.steps = steps;
  c.checkpoint_every = every;
  c.final_checkpoint = final_ckpt;
  c.keep_checkpoints = keep;
  return c;
}

// A report with the "disk" figures check_disk reads.
nlohmann::json report(int64_t offload, int64_t present, int64_t off_avail, int64_t ckpt, int64_t at_once,
                      int64_t ckpt_avail, bool same) {
  nlohmann::json d = {{"offload_path", "/data/offload"},    {"offload_bytes", offload},
                      {"offload_bytes_present", present},   {"offload_available_bytes", off_avail},
                      {"checkpoint_path", "/data/run/checkpoints"}, {"checkpoint_bytes", ckpt},
                      {"checkpoint_saves", at_once},        {"checkpoints_at_once", at_once},
                      {"checkpoint_available_bytes", ckpt_avail}, {"same_filesystem", same}};
  return {{"disk", d}};
}

std::string refusal(const TrainConfig& c, const nlohmann::json& r) {
  try {
    check_disk(c, r);
  } catch (const DiskPreflightError& e) {
    return e.what();
  }
  return "";
}

constexpr int64_t GB = 1'000'000'000;

TEST(DiskPreflight, CountsTheSaves) {
  EXPECT_EQ(checkpoint_saves(run(10, 5, true)), 2);   // steps 5 and 10: the last one is the final
  EXPECT_EQ(checkpoint_saves(run(10, 3, true)), 4);   // 3, 6, 9 and the end
  EXPECT_EQ(checkpoint_saves(run(10, 3, false)), 3);  // 3, 6, 9
  EXPECT_EQ(checkpoint_saves(run(10, 0, true)), 1);
  EXPECT_EQ(checkpoint_saves(run(10, 0, false)), 0);
}

TEST(DiskPreflight, RefusesWhatDoesNotFitAndNamesTheKeys) {
  const TrainConfig c = run(2, 0, true);
  EXPECT_EQ(refusal(c, report(80 * GB, 0, 100 * GB, 0, 0, 100 * GB, true)), "");
  std::string m = refusal(c, report(80 * GB, 0, 66 * GB, 60 * GB, 1, 66 * GB, true));
  EXPECT_NE(m.find("test.yaml: disk pre-flight: the offload files"), std::string::npos) << m;
  EXPECT_NE(m.find("80.00 GB under offload.path '/data/offload', but only 66.00 GB"), std::string::npos) << m;
  // The offload files fit; the checkpoint does not, once they are written.
  m = refusal(c, report(36 * GB, 0, 66 * GB, 36 * GB, 1, 66 * GB, true));
  EXPECT_NE(m.find("add up to 1 checkpoint(s) of 36.00 GB"), std::string::npos) << m;
  EXPECT_NE(m.find("only 30.00 GB are free there once the offload files (36.00 GB) are written"), std::string::npos) << m;
  for (const char* key : {"run.dir", "train.keep_checkpoints", "train.final_checkpoint", "train.skip_disk_check"}) {
    EXPECT_NE(m.find(key), std::string::npos) << key << " not named: " << m;
  }
  // On another filesystem the checkpoints have that one's free space to themselves.
  EXPECT_EQ(refusal(c, report(36 * GB, 0, 66 * GB, 36 * GB, 1, 40 * GB, false)), "");
  EXPECT_NE(refusal(c, report(36 * GB, 0, 66 * GB, 36 * GB, 2, 40 * GB, false)), "");
  // This run's files of an earlier start are reserved again, not added.
  EXPECT_EQ(refusal(c, report(80 * GB, 30 * GB, 66 * GB, 0, 0, 66 * GB, true)), "");
  // Free space unknown: nothing to compare.
  EXPECT_EQ(refusal(c, report(80 * GB, 0, -1, 60 * GB, 1, -1, true)), "");
}

TEST(DiskPreflight, ReportCreditsOnlyThisRunsOffloadFiles) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("shardgan-disk-" + std::to_string(::getpid()));
  fs::create_directories(dir / "offload");
  for (const char* name : {"generator.rank0.offload", "discriminator.rank1.replica1.offload", "other.offload",
                           "generator.rank0.txt"}) {
    std::ofstream(dir / "offload" / name) << std::string(1000, 'x');
  }
  TrainConfig c = run(10, 3, true, /*keep=*/2);
  c.run_dir = (dir / "run").string();  // does not exist yet: its nearest existing folder is asked
  const nlohmann::json d = disk_report(c, 5000, 700);
  EXPECT_EQ(d["offload_path"].get<std::string>(), c.run_dir + "/offload");
  EXPECT_EQ(d["offload_bytes_present"].get<int64_t>(), 0);  // no run/offload folder
  c.g_optim.offload.path = (dir / "offload").string();
  const nlohmann::json e = disk_report(c, 5000, 700);
  EXPECT_EQ(e["offload_bytes_present"].get<int64_t>(), 2000);
  EXPECT_EQ(e["checkpoint_saves"].get<int64_t>(), 4);
  EXPECT_EQ(e["checkpoints_at_once"].get<int64_t>(), 3);  // keep 2, one more while a save commits
  // A resumed run: its committed checkpoints rotate out as it saves (not the unfinished one).
  for (const char* name : {"step-00000003", "step-00000006", "step-00000009.tmp"}) {
    fs::create_directories(dir / "run" / "checkpoints" / name);
  }
  const nlohmann::json r = disk_report(c, 5000, 700);
  EXPECT_EQ(r["checkpoints_present"].get<int64_t>(), 2);
  EXPECT_EQ(r["checkpoints_at_once"].get<int64_t>(), 1);  // 2 there + 1 new = keep + 1
  c.keep_checkpoints = 1;  // more there than kept: still one more at a time
  EXPECT_EQ(disk_report(c, 5000, 700)["checkpoints_at_once"].get<int64_t>(), 1);
  c.final_checkpoint = false;
  c.checkpoint_every = 0;
  EXPECT_EQ(disk_report(c, 5000, 700)["checkpoints_at_once"].get<int64_t>(), 0);
  EXPECT_GT(e["offload_available_bytes"].get<int64_t>(), 0);
  EXPECT_TRUE(e["same_filesystem"].get<bool>());
  fs::remove_all(dir);
}

// A crashed save leaves step-* directories that are not committed: counted with their bytes,
// and credited against the checkpoints' need once the first save's commit deletes them
// (never below one checkpoint: the first save writes before its commit).
TEST(DiskPreflight, CountsACrashedSavesLeftovers) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("shardgan-leftovers-" + std::to_string(::getpid()));
  const fs::path ckpts = dir / "run" / "checkpoints";
  auto put = [&](const std::string& sub, int64_t bytes) {
    fs::create_directories((ckpts / sub).parent_path());
    std::ofstream(ckpts / sub) << std::string(static_cast<size_t>(bytes), 'x');
  };
  put("step-00000003/rank-00000.h5", 700);      // committed
  put("step-00000006.del/rank-00000.h5", 700);  // a rotation the crash interrupted
  put("step-00000009.tmp/rank-00000.h5", 300);  // the save the crash interrupted
  put("step-00000009.tmp/rank-00001.h5", 200);
  put("step-00000006.old/index.h5", 50);
  put("other.tmp/x", 1000);                     // not a save's
  std::ofstream(ckpts / "step-00000012.tmp") << "a file, not a save's folder";
  TrainConfig c = run(10, 3, true, /*keep=*/2);  // 4 saves
  c.run_dir = (dir / "run").string();
  const nlohmann::json d = disk_report(c, 0, 700);
  EXPECT_EQ(d["checkpoints_present"].get<int64_t>(), 1);
  EXPECT_EQ(d["leftovers_present"].get<int64_t>(), 3);
  EXPECT_EQ(d["leftover_bytes"].get<int64_t>(), 1250);
  EXPECT_EQ(d["checkpoints_at_once"].get<int64_t>(), 2);  // 1 there + 2 new = keep + 1
  EXPECT_EQ(d["checkpoint_bytes_needed"].get<int64_t>(), 700);  // 2 x 700 - 1250, but one at least
  EXPECT_EQ(checkpoint_bytes_needed(36 * GB, 2, 10 * GB), 62 * GB);
  EXPECT_EQ(checkpoint_bytes_needed(36 * GB, 2, 0), 72 * GB);
  EXPECT_EQ(checkpoint_bytes_needed(36 * GB, 0, 10 * GB), 0);
  // check_disk: 2 checkpoints of 36 GB with 40 GB free fit once 36 GB of leftovers go
  nlohmann::json r = report(0, 0, 40 * GB, 36 * GB, 2, 40 * GB, false);
  EXPECT_NE(refusal(c, r), "");  // without the leftovers: refused (the control)
  r["disk"]["leftovers_present"] = 2;
  r["disk"]["leftover_bytes"] = 36 * GB;
  EXPECT_EQ(refusal(c, r), "");
  r["disk"]["checkpoint_available_bytes"] = 30 * GB;  // not even the first save fits
  const std::string m = refusal(c, r);
  EXPECT_NE(m.find("deletes the 2 leftover(s) of interrupted saves there (*.tmp, *.old, *.del: 36.00 GB)"),
            std::string::npos) << m;
  fs::remove_all(dir);
}

// A save must not write while the last save's rotated checkpoints are being deleted, or the
// disk holds them and the new one at once (more than the keep + 1 the pre-flight counts). The
// rotated checkpoint gets thousands of files, so that its deletion takes a while; a watcher
// thread looks for the next save's folder while the doomed one still exists. Control
// save_skips_deletion_wait (ctest disk_preflight_deletion_wait_control) must fail here.
TEST(DiskPreflight, SaveWaitsForPendingDeletion) {
  namespace fs = std::filesystem;
  MpiCommunicator self(MPI_COMM_SELF, 60.0);
  auto lin = torch::nn::Linear(4, 3);
  ShardingConfig sc;
  sc.stage = 0;
  ShardedModel model("m", self, sc);
  model.add_unit("lin", lin.ptr(), [lin](const at::Tensor& x) mutable { return lin->forward(x); });
  const fs::path run_dir = fs::temp_directory_path() / ("shardgan-deletion-" + std::to_string(::getpid()));
  const fs::path ckpts = run_dir / "checkpoints";
  TrainCounters counters;
  counters.noise_rng_state = torch::zeros({8}, torch::kUInt8);
  counters.step = 1;
  save_checkpoint(run_dir.string(), counters, {{&model, nullptr}}, "test", self, /*keep_last=*/1);
  for (int i = 0; i < 6000; ++i) std::ofstream(ckpts / "step-00000001" / ("junk" + std::to_string(i))) << i;
  std::atomic<bool> stop{false}, overlap{false}, saw_deletion{false};
  std::thread watcher([&] {
    std::error_code ec;
    while (!stop.load()) {
      const bool doomed = fs::exists(ckpts / "step-00000001.del", ec);
      saw_deletion = saw_deletion || doomed;
      if (doomed && fs::exists(ckpts / "step-00000003.tmp", ec)) overlap = true;
    }
  });
  counters.step = 2;  // rotates step 1 out: renamed to .del, deleted in the background
  save_checkpoint(run_dir.string(), counters, {{&model, nullptr}}, "test", self, 1);
  counters.step = 3;
  save_checkpoint(run_dir.string(), counters, {{&model, nullptr}}, "test", self, 1);
  stop = true;
  watcher.join();
  wait_for_checkpoint_cleanup();
  EXPECT_TRUE(saw_deletion.load()) << "the deletion ended before the watcher saw it: the test saw nothing";
  EXPECT_FALSE(overlap.load()) << "step 3's save wrote while step 1's deletion was still running";
  EXPECT_FALSE(fs::exists(ckpts / "step-00000001.del"));
  EXPECT_TRUE(fs::exists(ckpts / "step-00000003"));
  fs::remove_all(run_dir);
}

}  // namespace

}  // namespace SHARDGAN_UNITY_ID
