// The node-shared stage-3 gather (sharding.<model>.node_shared_gather, comm/node_shared.h),
// under mpirun at 2 and 3 ranks on one host:
//  - a three-unit model with bfloat16 compute and float32 masters, three Adam steps with
//    prefetch: the same bits as the MPI all-gather (a gather only moves bytes, so any
//    difference is a wrong or stale block), with no MPI all-gather at all;
//  - the pool: every rank sees every block once published, and a slot is reused only
//    after every rank released the gather before (a rank that holds it is named);
//  - a rank that never publishes: the others time out within the limit, naming it.
// Negative control, run once: leaving out the own block's write (fill_own_block in
// start_shared_gather) fails the bit comparison at 2 ranks; the other two cases pass.
#include <mpi.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "shardgan/comm/mpi_communicator.h"
#include "shardgan/comm/node_shared.h"
#include "shardgan/optim/sharded_adam.h"
#include "shardgan/sharding/sharded_model.h"
#include "test_util.h"
#include "three_linear_net.h"

// The gtest files compile together in batches (tests/CMakeLists.txt): this file's names
// live in a namespace of its own.
namespace SHARDGAN_UNITY_ID {

using namespace shardgan;

namespace {

struct Net : test_util::ThreeLinearNet {
  Net(Communicator& comm, bool shared) : ThreeLinearNet(comm, cfg(shared)) {}
  static ShardingConfig cfg(bool shared) {
    ShardingConfig s = test_util::sharding(3);
    s.compute_dtype = at::kBFloat16;
    s.node_shared_gather = shared;
    return s;
  }
};

TEST(NodeSharedGather, SameBitsAsTheAllGather) {
  MpiCommunicator comm_ref(MPI_COMM_WORLD, 60.0), comm_shared(MPI_COMM_WORLD, 60.0);
  ASSERT_TRUE(ranks_share_node(comm_shared)) << "this test runs its ranks on one host";
  Net ref(comm_ref, false), sh(comm_shared, true);
  ShardedAdam opt_ref(ref.model, AdamConfig{1e-2}), opt_sh(sh.model, AdamConfig{1e-2});
  ASSERT_NE(sh.model.shared_pool(), nullptr);  // made here (its collectives), not in the steps
  ASSERT_EQ(ref.model.shared_pool(), nullptr);
  comm_ref.reset_stats();
  comm_shared.reset_stats();
  torch::manual_seed(100 + comm_ref.rank());
  for (int step = 0; step < 3; ++step) {
    at::Tensor x = torch::randn({6, 37});
    for (auto* n : {&ref, &sh}) {
      n->model.zero_grad();
      at::Tensor y = n->model.forward(TensorList{x}).at(0);
      y.to(at::kFloat).square().sum().backward();
    }
    opt_ref.step();
    opt_sh.step();
    torch::NoGradGuard no_grad;
    at::Tensor ya = ref.model.forward(TensorList{x}).at(0), yb = sh.model.forward(TensorList{x}).at(0);
    EXPECT_TRUE(torch::equal(ya, yb)) << "outputs after step " << step;
  }
  for (size_t u = 0; u < 3; ++u) {
    EXPECT_TRUE(torch::equal(ref.model.units()[u]->shard(), sh.model.units()[u]->shard())) << "unit " << u;
  }
  EXPECT_GT(comm_ref.stats().all_gather_calls, 0);
  EXPECT_EQ(comm_shared.stats().all_gather_calls, 0);
  EXPECT_GT(comm_shared.stats().reduce_scatter_calls, 0);  // gradients still go through MPI
  EXPECT_EQ(sh.model.shared_gather_fallbacks(), 0);
}

// A FullParameters scope holds every unit at once: more than the pool's slots. The gathers
// past the slots fall back to the MPI all-gather (on every rank alike) and the values agree.
TEST(NodeSharedGather, MoreUnitsHeldThanSlotsFallBackToTheAllGather) {
  MpiCommunicator comm_ref(MPI_COMM_WORLD, 60.0), comm_shared(MPI_COMM_WORLD, 60.0);
  const int units = ShardedModel::kSharedSlots + 3;
  std::vector<torch::nn::Linear> mods;
  auto build = [&](Communicator& comm, bool shared) {
    auto m = std::make_unique<ShardedModel>("d", comm, Net::cfg(shared));
    torch::manual_seed(4);
    for (int i = 0; i < units; ++i) {
      mods.push_back(torch::nn::Linear(16, 16));
      auto l = mods.back();
      m->add_unit("l" + std::to_string(i), l.ptr(), [l](const at::Tensor& x) mutable { return l->forward(x); });
    }
    return m;
  };
  auto ref = build(comm_ref, false), sh = build(comm_shared, true);
  {
    FullParameters a(*ref), b(*sh);
    for (int i = 0; i < units; ++i) {
      EXPECT_TRUE(torch::equal(ref->units()[i]->param(0), sh->units()[i]->param(0))) << "unit " << i;
    }
  }
  EXPECT_EQ(sh->shared_gather_fallbacks(), 3);
  // Released: the next forward uses the slots again.
  torch::NoGradGuard no_grad;
  at::Tensor x = torch::randn({2, 16});
  EXPECT_TRUE(torch::equal(ref->forward(TensorList{x}).at(0), sh->forward(TensorList{x}).at(0)));
  EXPECT_EQ(sh->shared_gather_fallbacks(), 3);
}

TEST(NodeSharedPool, BlocksVisibleAndSlotsReusedOnlyAfterEveryRankReleased) {
  MpiCommunicator comm(MPI_COMM_WORLD, 60.0);
  const int r = comm.rank(), n = comm.world_size();
  const int64_t block = 8192;  // two pages per rank
  NodeSharedPool pool(comm, 2, block * n, "test");
  ASSERT_EQ(pool.slot_of(1), 1);
  ASSERT_EQ(pool.slot_of(3), 1);
  auto* p = static_cast<unsigned char*>(pool.data(pool.slot_of(1)));
  EXPECT_FALSE(pool.held_here(1));  // nothing before gather 1
  pool.wait_free(1, 5.0, {});
  std::memset(p + r * block, r + 1, block);
  pool.publish(1);
  pool.wait_published(1, 30.0, {});
  for (int q = 0; q < n; ++q) EXPECT_EQ(p[q * block + 100], q + 1) << "block of rank " << q;
  // Gather 3 shares gather 1's slot: this rank holds it until it releases gather 1.
  EXPECT_TRUE(pool.held_here(3));
  comm.barrier();
  if (r != 0) pool.release(1);
  // Rank 0 still reads gather 1: no rank may take the slot, and the wait names rank 0.
  try {
    pool.wait_free(3, 0.3, [&] { comm.poll(); });
    ADD_FAILURE() << "slot reused while rank 0 held it";
  } catch (const CollectiveTimeout& e) {
    EXPECT_NE(std::string(e.what()).find("rank(s) 0 have not released gather 1"), std::string::npos) << e.what();
  }
  comm.barrier();
  if (r == 0) pool.release(1);
  EXPECT_FALSE(pool.held_here(3));
  pool.wait_free(3, 30.0, {});
  EXPECT_EQ(p[0], 1) << "slots keep their pages";
  comm.barrier();
}

TEST(NodeSharedPool, WaitTimesOutNamingTheRankThatDidNotPublish) {
  MpiCommunicator comm(MPI_COMM_WORLD, 60.0);
  NodeSharedPool pool(comm, 1, 4096, "unit-x");
  // Every rank but the last publishes; each waits 0.5 s for all.
  if (comm.rank() != comm.world_size() - 1) pool.publish(1);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    pool.wait_published(1, 0.5, [&] { comm.poll(); });
    ADD_FAILURE() << "wait returned without the last rank's block";
  } catch (const CollectiveTimeout& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("unit-x"), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank(s) " + std::to_string(comm.world_size() - 1) + " have not published"), std::string::npos)
        << msg;
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 5.0);
  comm.barrier();
}

}  // namespace

}  // namespace SHARDGAN_UNITY_ID
