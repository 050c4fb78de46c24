// Worlds built ahead of a known change (launch/world_ahead.h), two ranks as two threads of
// this process on a loopback store: the build connects on its own thread and the entry
// takes the connected world; a build whose epoch the agent's notice replaced gives up at
// once instead of waiting for ranks that will never come.
#include "launch/world_ahead.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "base/error.h"
#include "comm/store/tcp_store_server.h"
#include "core/tensor.h"
#include "launch/epoch_notice.h"
#include "planner/plan_cache.h"
#include "tests/launch/zero1_spec.h"

namespace weft::launch {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

parallel::LaunchEnv env_of(int rank, int world, uint16_t port, int64_t epoch) {
  parallel::LaunchEnv e;
  e.rank = rank;
  e.world = world;
  e.launcher = "weft run";
  e.store_port = port;
  e.rdzv_epoch = epoch;
  e.store_prefix = "rdzv/t/epoch/" + std::to_string(epoch) + "/round/0";
  return e;
}

fs::path notice_path(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("weft_ahead_" + name + "_" + std::to_string(::getpid()));
  fs::remove(p);
  return p;
}

TEST(WorldAhead, BuildsTheNextEpochsWorldOnAThreadAndTheEntryTakesItConnected) {
  comm::TCPStoreServer server;
  const fs::path notices = notice_path("take");
  WorldAhead a0, a1;
  a0.start(env_of(0, 2, server.port(), 2), notices, 30s);
  a1.start(env_of(1, 2, server.port(), 2), notices, 30s);
  a0.start(env_of(0, 2, server.port(), 2), notices, 30s);  // already under way: no second build
  std::unique_ptr<EpochWorld> e0 = a0.take(2), e1 = a1.take(2);
  std::unique_ptr<parallel::WorkerWorld> w0 = std::move(e0->world), w1 = std::move(e1->world);
  ASSERT_NE(w0, nullptr);
  ASSERT_NE(w1, nullptr);
  EXPECT_EQ(w0->comm().rank(), 0);
  EXPECT_EQ(w1->comm().rank(), 1);
  // The two worlds are one communicator: a sum over it.
  core::Tensor t0 = core::Tensor::from_vector<float>({2}, {1.f, 2.f});
  core::Tensor t1 = core::Tensor::from_vector<float>({2}, {10.f, 20.f});
  std::thread other([&] { w1->comm().all_reduce(t1).wait(); });
  w0->comm().all_reduce(t0).wait();
  other.join();
  EXPECT_EQ(t0.data<float>()[0], 11.f);
  EXPECT_EQ(t1.data<float>()[1], 22.f);
  EXPECT_EQ(a0.take(2), nullptr);  // taken once
  EXPECT_EQ(a0.take(3), nullptr);  // never started
}

// A graceful leave: epoch 2 has three ranks, of which rank 2 leaves (it only hands its
// state over), and the trainers run tp2. Each rank's build connects the world, then the
// trainers' part (ranks 0 and 1) and their process groups of the tp2 plan over it; the
// leaving rank gets neither. The tensor-parallel group sums over both trainers.
TEST(WorldAhead, BuildsTheTrainersPartAndTheirProcessGroupsWithTheWorld) {
  comm::TCPStoreServer server;
  const fs::path notices = notice_path("groups");
  core::JobSpec spec = zero1_spec();
  spec.parallel.zero = 0, spec.parallel.tp = 2, spec.parallel.dp = 1;
  planner::PlanCache plans(spec);
  const std::shared_ptr<const planner::Plan> plan = plans.plan(2);
  WorldAhead a[3];
  for (int r = 0; r < 3; ++r)
    a[r].start(env_of(r, 3, server.port(), 2), notices, 30s, 1,
               EpochTrainers{2, [&plans] { return plans.plan(2); }});
  std::unique_ptr<EpochWorld> e[3];
  for (int r = 0; r < 3; ++r) e[r] = a[r].take(2);
  for (int r = 0; r < 3; ++r) ASSERT_NE(e[r], nullptr) << "rank " << r;
  EXPECT_EQ(e[2]->train_comm, nullptr);
  EXPECT_EQ(e[2]->groups, nullptr);
  int tp_group = -1;
  for (const planner::ProcessGroup& g : plan->groups)
    if (g.ranks == std::vector<int>{0, 1}) tp_group = g.id;
  ASSERT_GE(tp_group, 0) << "no group of both trainers in the tp2 plan";
  for (int r : {0, 1}) {
    ASSERT_NE(e[r]->train_comm, nullptr) << "rank " << r;
    ASSERT_NE(e[r]->groups, nullptr) << "rank " << r;
    EXPECT_EQ(e[r]->trainers().size(), 2);
    EXPECT_EQ(e[r]->trainers().rank(), r);
    EXPECT_TRUE(e[r]->groups->fits(e[r]->trainers(), *plan));
    EXPECT_GT(e[r]->groups->splits(), 0);
    EXPECT_EQ(e[r]->splits(), 1 + e[r]->groups->splits());
  }
  core::Tensor t0 = core::Tensor::from_vector<float>({1}, {1.f});
  core::Tensor t1 = core::Tensor::from_vector<float>({1}, {10.f});
  std::thread other([&] { e[1]->groups->group(tp_group).all_reduce(t1).wait(); });
  e[0]->groups->group(tp_group).all_reduce(t0).wait();
  other.join();
  EXPECT_EQ(t0.data<float>()[0], 11.f);
  EXPECT_EQ(t1.data<float>()[0], 11.f);
}

TEST(WorldAhead, ABuildWhoseEpochWasReplacedGivesUpAndTakeSaysWhy) {
  comm::TCPStoreServer server;
  const fs::path notices = notice_path("replaced");
  WorldAhead a;
  // Rank 1 of epoch 2 never comes: only the notice of epoch 3 can end this build before the
  // communicator's timeout (600 s: past the suite's 60 s limit on this binary, so a build
  // that waited it out fails the test).
  a.start(env_of(0, 2, server.port(), 2), notices, 600s);
  EpochNotice n;
  n.epoch = 3;
  n.nnodes = 1;
  n.why = "membership changed: epoch 2 -> 3";
  write_epoch_notice(notices, n);
  try {
    (void)a.take(2);
    ADD_FAILURE() << "the replaced build returned a world";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("epoch 2 was replaced by epoch 3"), std::string::npos)
        << e.what();
  }
  fs::remove(notices);
}

TEST(WorldAhead, AWorkerThatEndsCancelsItsBuildInsteadOfWaitingForPeers) {
  comm::TCPStoreServer server;
  const fs::path notices = notice_path("ends");
  // Rank 1 never comes and no notice replaces epoch 2: only the destructor's cancel can end
  // this build before its 600 s timeout (past the suite's 60 s limit on this binary).
  { WorldAhead a; a.start(env_of(0, 2, server.port(), 2), notices, 600s); }
  SUCCEED();
}

}  // namespace
}  // namespace weft::launch
