// Sharded checkpoints (issue 5), run under `mpirun -np 4`:
//  - the flat-range box decomposition behind the virtual datasets;
//  - a round trip (save, load into a fresh trainer, save again: identical bits) at every
//    ZeRO stage the sharding layer supports;
//  - N -> M resharding for N, M in {1, 2, 3, 4}: 3 steps on N ranks, save, resume on M
//    ranks (other stages), 3 more steps; every tensor of the step-6 checkpoint, Adam state
//    included, must equal an uninterrupted 6-step one-rank stage-0 run within
//    max|a - b| <= 1e-9 * max|b| (float64; the runs differ only in summation order, as in
//    test_parity), and bit for bit when M == N with the same stages;
//  - export: the generator written by shardgan-ckpt export loads back with torch::load
//    and computes what the trained generator computes;
//  - h5py from the project's environment (.venv) reads the index's virtual datasets and gets the
//    trainer's full tensors, and h5dump reads them too.
// Sub-worlds come from MPI_Comm_split; ranks outside one wait in a sleeping barrier so
// that they leave the two cores to the ranks that work.
#include <mpi.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <functional>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "shardgan/h5/h5.h"
#include "shardgan/checkpoint/shard_io.h"
#include "shardgan/comm/local_communicator.h"
#include "shardgan/comm/mpi_communicator.h"
#include "shardgan/sharding/deferred.h"
#include "shardgan/train/inference.h"
#include "shardgan/train/trainer.h"

// The gtest files compile together in batches (tests/CMakeLists.txt): this file's names
// live in a namespace of its own.
namespace SHARDGAN_UNITY_ID {

using namespace shardgan;
namespace fs = std::filesystem;

namespace {

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// MPI_Barrier on COMM_WORLD, polled with sleeps (Open MPI's blocking barrier spins).
void sleepy_barrier() {
  MPI_Request req;
  MPI_Ibarrier(MPI_COMM_WORLD, &req);
  int done = 0;
  while (!done) {
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (!done) usleep(500);
  }
}

// Runs fn(comm) on world ranks [0, n) with a communicator of its own; everyone waits.
void on_first(int n, const std::function<void(MpiCommunicator&)>& fn) {
  MPI_Comm sub;
  MPI_Comm_split(MPI_COMM_WORLD, world_rank() < n ? 0 : MPI_UNDEFINED, world_rank(), &sub);
  if (sub != MPI_COMM_NULL) {
    {
      MpiCommunicator comm(sub, 120.0);
      fn(comm);
    }
    MPI_Comm_free(&sub);
  }
  sleepy_barrier();
}

// A temporary directory with the same name on every rank.
std::string shared_tmpdir(const char* what) {
  char buf[256] = {0};
  if (world_rank() == 0) {
    std::string t = std::string("/tmp/shardgan-") + what + ".XXXXXX";
    std::snprintf(buf, sizeof(buf), "%s", t.c_str());
    if (!mkdtemp(buf)) std::abort();
  }
  MPI_Bcast(buf, sizeof(buf), MPI_CHAR, 0, MPI_COMM_WORLD);
  return buf;
}

TrainConfig small_config(int g_stage, int d_stage, const std::string& run_dir) {
  TrainConfig c = parse_config(R"(
run: {seed: 7}
data: {source: synthetic, synthetic_size: 72}
train: {steps: 6, global_batch: 12}
model: {dtype: float64, z_dim: 8, g_width: 4, d_width: 4}
)", "checkpoint-test", {});
  c.g_sharding.stage = g_stage;
  c.d_sharding.stage = d_stage;
  c.run_dir = run_dir;
  return c;
}

// The ZeRO stages this build's sharding layer accepts.
std::vector<int> supported_stages() {
  std::vector<int> out;
  MpiCommunicator self(MPI_COMM_SELF);
  for (int s = 0; s <= 3; ++s) {
    try {
      ShardingConfig sc;
      sc.stage = s;
      ShardedModel m("probe", self, sc);
      m.add_unit("u", std::make_shared<torch::nn::LinearImpl>(2, 2), [](const at::Tensor& x) { return x; });
      out.push_back(s);
    } catch (const std::invalid_argument&) {
    }
  }
  return out;
}

struct Diff {
  double worst_rel = 0;
  bool identical = true;
  std::string worst_name;
};

// Compares every tensor of two checkpoints (read through the index), and the counters.
Diff compare_checkpoints(const std::string& a_dir, const std::string& b_dir) {
  ckpt::CheckpointReader a(a_dir), b(b_dir);
  EXPECT_EQ(a.manifest().step, b.manifest().step);
  EXPECT_EQ(a.manifest().epoch, b.manifest().epoch);
  EXPECT_EQ(a.manifest().batch_in_epoch, b.manifest().batch_in_epoch);
  auto ta = a.tensors(), tb = b.tensors();
  EXPECT_EQ(ta.size(), tb.size());
  Diff d;
  for (size_t i = 0; i < ta.size() && i < tb.size(); ++i) {
    EXPECT_EQ(ta[i].path, tb[i].path);
    EXPECT_EQ(ta[i].dtype, "float64") << ta[i].path;
    at::Tensor x = torch::empty(ta[i].shape, torch::kDouble), y = torch::empty(tb[i].shape, torch::kDouble);
    a.read_tensor(ta[i], x.data_ptr());
    b.read_tensor(tb[i], y.data_ptr());
    if (!torch::equal(x, y)) d.identical = false;
    const double scale = y.abs().max().item<double>();
    const double rel = (x - y).abs().max().item<double>() / std::max(scale, 1e-300);
    if (rel > d.worst_rel) {
      d.worst_rel = rel;
      d.worst_name = ta[i].path;
    }
  }
  return d;
}

TEST(FlatRangeBoxes, CoverExactlyTheRangeInOrder) {
  for (auto shape : std::vector<std::vector<int64_t>>{{7}, {3, 5}, {4, 3, 2, 5}, {2, 1, 3}}) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    at::Tensor idx = torch::arange(n, torch::kLong).view(shape);
    for (int64_t lo = 0; lo < n; ++lo) {
      for (int64_t hi = lo + 1; hi <= n; ++hi) {
        auto boxes = ckpt::flat_range_boxes(shape, lo, hi);
        ASSERT_LE(boxes.size(), 2 * shape.size() - 1);
        std::vector<at::Tensor> parts;
        for (auto& b : boxes) {
          at::Tensor t = idx;
          for (size_t k = 0; k < shape.size(); ++k) t = t.narrow(static_cast<int64_t>(k), b.start[k], b.count[k]);
          parts.push_back(t.reshape({-1}));
        }
        ASSERT_TRUE(torch::equal(torch::cat(parts), torch::arange(lo, hi, torch::kLong)))
            << "shape rank " << shape.size() << " [" << lo << ", " << hi << ")";
      }
    }
  }
}

TEST(Checkpoint, RoundTripAtEveryStage) {
  const std::string base = shared_tmpdir("ckpt-roundtrip");
  const int n = world_size();
  for (int s : supported_stages()) {
    const std::string run = base + "/stage" + std::to_string(s);
    std::string first, second;
    on_first(n, [&](MpiCommunicator& comm) {
      Trainer t(small_config(s, s, run), comm);
      t.train_step();
      t.train_step();
      first = t.save();
      Trainer u(small_config(s, s, run + "-again"), comm);
      u.resume(first);
      EXPECT_EQ(u.step(), 2);
      second = u.save();
    });
    if (world_rank() == 0) {
      Diff d = compare_checkpoints(first, second);
      EXPECT_TRUE(d.identical) << "stage " << s << ": " << d.worst_name << " differs by " << d.worst_rel;
      ckpt::CheckpointReader r(first);
      EXPECT_TRUE(r.verify_all().empty());
      std::printf("[checkpoint] round trip at stage %d on %d ranks: bit-identical %s\n", s, n,
                  d.identical ? "yes" : "NO");
    }
  }
  sleepy_barrier();
  if (world_rank() == 0) fs::remove_all(base);
}

TEST(Checkpoint, ReshardNToMMatchesUninterruptedRun) {
  if (world_size() < 4) GTEST_SKIP() << "needs mpirun -np 4";
  const std::string base = shared_tmpdir("ckpt-reshard");
  const std::vector<int> stages = supported_stages();
  auto pick = [&](int k) { return stages[static_cast<size_t>(k) % stages.size()]; };
  std::string reference;
  on_first(1, [&](MpiCommunicator& comm) {
    Trainer t(small_config(0, 0, base + "/reference"), comm);
    for (int i = 0; i < 6; ++i) t.train_step();
    reference = t.save();
  });
  // Also dump the trainer's full tensors after 3 steps on 2 ranks for the h5py check.
  for (int n = 1; n <= 4; ++n) {
    const int gs = pick(n), ds = pick(n + 1);
    std::string saved, straight;
    on_first(n, [&](MpiCommunicator& comm) {
      Trainer t(small_config(gs, ds, base + "/save" + std::to_string(n)), comm);
      for (int i = 0; i < 3; ++i) t.train_step();
      saved = t.save();
      if (n == 2) {  // the trainer's own full tensors, for the h5py check
        auto g = t.generator().gather_full_parameters(), d = t.discriminator().gather_full_parameters();
        if (comm.rank() == 0) {
          h5::File f = h5::File::create(base + "/expected.h5");
          for (auto& [model, params] : {std::make_pair(std::string("generator"), g), std::make_pair(std::string("discriminator"), d)}) {
            for (auto& [name, p] : params) {
              at::Tensor c = p.contiguous();
              f.write(model + "/params/" + name, h5::DType::kF64, c.sizes().vec(), c.data_ptr());
            }
          }
          for (auto* m : {&t.generator(), &t.discriminator()}) {
            for (auto& [name, b] : m->named_buffers()) {
              at::Tensor c = b.contiguous();
              f.write(m->name() + "/buffers/" + name, h5::DType::kF64, c.sizes().vec(), c.data_ptr());
            }
          }
        }
      }
      for (int i = 0; i < 3; ++i) t.train_step();
      Trainer straight_run(small_config(gs, ds, base + "/straight" + std::to_string(n)), comm);
      for (int i = 0; i < 6; ++i) straight_run.train_step();
      straight = straight_run.save();
    });
    if (n == 2 && world_rank() == 0) {
      const std::string cmd = SHARDGAN_PYTHON " " SHARDGAN_SOURCE_DIR "/tests/ckpt_h5py_check.py " + saved + " " +
                              base + "/expected.h5";
      EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
      const std::string dump = "h5dump -d /generator/params/block0.0.weight " + saved + "/index.h5 > " + base + "/dump.txt";
      EXPECT_EQ(std::system(dump.c_str()), 0) << dump;
    }
    for (int m = 1; m <= 4; ++m) {
      // Same world size: the same stages (bit-exact); otherwise other stages.
      const int gm = m == n ? gs : pick(n + m), dm = m == n ? ds : pick(n + m + 1);
      std::string resumed;
      on_first(m, [&](MpiCommunicator& comm) {
        Trainer t(small_config(gm, dm, base + "/resume" + std::to_string(n) + std::to_string(m)), comm);
        t.resume(base + "/save" + std::to_string(n));  // the newest checkpoint there
        EXPECT_EQ(t.step(), 3);
        for (int i = 0; i < 3; ++i) t.train_step();
        resumed = t.save();
      });
      if (world_rank() == 0) {
        Diff d = compare_checkpoints(resumed, reference);
        EXPECT_LE(d.worst_rel, 1e-9) << n << " -> " << m << ": " << d.worst_name;
        std::printf("[checkpoint] %d ranks (G stage %d, D stage %d) -> %d ranks (G %d, D %d): max rel diff %.3g vs the "
                    "uninterrupted 1-rank run (%s)",
                    n, gs, ds, m, gm, dm, d.worst_rel, d.worst_name.c_str());
        if (m == n) {
          Diff e = compare_checkpoints(resumed, straight);
          EXPECT_TRUE(e.identical) << n << " -> " << m << ": " << e.worst_name << " differs by " << e.worst_rel;
          std::printf("; bit-identical to the uninterrupted %d-rank run: %s", n, e.identical ? "yes" : "NO");
        }
        std::printf("\n");
      }
    }
  }
  sleepy_barrier();
  if (world_rank() == 0) fs::remove_all(base);
}

TEST(Checkpoint, ExportLoadsBackWithTorchLoad) {
  const std::string base = shared_tmpdir("ckpt-export");
  if (world_rank() == 0) {
    MpiCommunicator self(MPI_COMM_SELF, 120.0);
    Trainer t(small_config(3, 3, base + "/run"), self);
    t.train_step();
    t.train_step();
    ckpt::CheckpointReader rd(t.save());
    LocalCommunicator local;  // no MPI calls: what the tool uses
    TrainConfig cfg;
    auto g = load_generator(rd, local, /*ema=*/false, &cfg);
    auto want = t.generator().gather_full_parameters(), got = g->gather_full_parameters();
    ASSERT_EQ(want.size(), got.size());
    for (size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(torch::equal(want[i].second, got[i].second)) << want[i].first;
    const std::string path = base + "/g.pt";
    export_model(*g, rd.manifest().config, path);
    auto g2 = load_exported_generator(path, local);
    ShardingConfig sc;
    sc.stage = 0;
    auto g3 = build_sharded_model(cfg.family->generator(local), local, sc, /*seed=*/999, cfg.model_dtype);  // other weights, then torch::load
    auto root = plain_module(*g3);
    torch::load(root, path);
    torch::NoGradGuard no_grad;
    at::Tensor z = fixed_latents(cfg, 16);
    for (auto* m : {g.get(), g2.get(), g3.get(), &t.generator()}) m->train(false);
    at::Tensor y = t.generator().forward(z);
    EXPECT_TRUE(torch::equal(g->forward(z), y));
    EXPECT_TRUE(torch::equal(g2->forward(z), y));
    EXPECT_TRUE(torch::equal(g3->forward(z), y));
    EXPECT_THROW(load_generator(rd, local, /*ema=*/true), CheckpointError);
  }
  sleepy_barrier();
  if (world_rank() == 0) fs::remove_all(base);
}

}  // namespace

}  // namespace SHARDGAN_UNITY_ID
