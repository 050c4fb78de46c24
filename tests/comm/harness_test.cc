// Tests of the multi-process harness itself: a green run must mean every rank really ran,
// and each way a rank can go wrong must come back attributed to that rank.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>

#include "base/error.h"
#include "tests/support/mpi_env.h"
#include "tests/support/multiprocess.h"

namespace weft::test {
namespace {

using namespace std::chrono_literals;

TEST(Harness, AllRanksExchangeValuesThroughTheStore) {
  constexpr int kWorld = 4;
  RunResult result = run_ranks(kWorld, [](RankContext& ctx) {
    auto store = ctx.store();
    store->set_string("rank/" + std::to_string(ctx.rank()), std::to_string(ctx.rank() * 10));
    int64_t arrived = store->add("arrived", 1);
    if (arrived < 1 || arrived > ctx.world())
      throw std::runtime_error("bad counter " + std::to_string(arrived));
    // Each rank reads every other rank's value: blocks until the slowest rank has written.
    for (int r = 0; r < ctx.world(); ++r) {
      std::string v = store->get_string("rank/" + std::to_string(r));
      if (v != std::to_string(r * 10))
        throw std::runtime_error("rank " + std::to_string(r) + " wrote " + v);
    }
  });
  ASSERT_TRUE(result.ok()) << result.summary();
  ASSERT_EQ(result.ranks.size(), size_t(kWorld));
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(result.ranks[r].rank, r);
    EXPECT_EQ(result.ranks[r].status, RankStatus::kOk);
  }
  EXPECT_EQ(result.summary(), "all 4 ranks ok");
}

TEST(Harness, ContextCarriesRankWorldAndStore) {
  RunResult result = run_ranks(3, [](RankContext& ctx) {
    if (ctx.world() != 3) throw std::runtime_error("world " + std::to_string(ctx.world()));
    if (ctx.store_host() != "127.0.0.1" || ctx.store_port() == 0)
      throw std::runtime_error("bad store address");
    // Two clients of one rank see one store; the counter proves every rank ran once.
    auto a = ctx.store();
    auto b = ctx.store();
    a->add("ranks_seen", 1);
    b->add("rank_sum", ctx.rank());
    b->wait({"ranks_seen"}, 10s);
    a->set_string("done/" + std::to_string(ctx.rank()), "1");
    a->wait({"done/0", "done/1", "done/2"}, 20s);
    if (a->get_string("ranks_seen") != "3")
      throw std::runtime_error("ranks_seen " + a->get_string("ranks_seen"));
    if (a->get_string("rank_sum") != "3")
      throw std::runtime_error("rank_sum " + a->get_string("rank_sum"));
  });
  EXPECT_TRUE(result.ok()) << result.summary();
}

TEST(Harness, ThrowingRankIsReportedWithItsRankAndMessage) {
  RunResult result = run_ranks(3, [](RankContext& ctx) {
    if (ctx.rank() == 1) throw CommError("rank one gave up on purpose");
  });
  EXPECT_FALSE(result.ok());
  ASSERT_EQ(result.ranks.size(), 3u);
  EXPECT_TRUE(result.ranks[0].ok());
  EXPECT_TRUE(result.ranks[2].ok());
  EXPECT_EQ(result.ranks[1].status, RankStatus::kFailed);
  EXPECT_EQ(result.ranks[1].message, "rank one gave up on purpose");
  EXPECT_NE(result.ranks[1].exit_code, 0);
  EXPECT_NE(result.summary().find("rank 1: failed: rank one gave up on purpose"), std::string::npos)
      << result.summary();
}

TEST(Harness, HangingRankIsKilledAtTheDeadline) {
  RunOptions opts;
  opts.deadline = 2s;
  RunResult result = run_ranks(
      2,
      [](RankContext& ctx) {
        if (ctx.rank() == 0) return;
        for (;;) ::pause();  // never returns; only SIGKILL ends it
      },
      opts);
  ASSERT_EQ(result.ranks.size(), 2u);
  EXPECT_TRUE(result.ranks[0].ok()) << result.summary();
  EXPECT_EQ(result.ranks[1].status, RankStatus::kTimedOut);
  EXPECT_EQ(result.ranks[1].signal, SIGKILL);
  EXPECT_NE(result.summary().find("rank 1: timed out"), std::string::npos) << result.summary();
}

TEST(Harness, RankBlockedInStoreWaitIsKilledAndOthersFinish) {
  RunOptions opts;
  opts.deadline = 2s;
  opts.store_timeout = 60s;
  RunResult result = run_ranks(
      3,
      [](RankContext& ctx) {
        auto store = ctx.store();
        if (ctx.rank() == 2) store->get("never-set");  // would block for a minute
        store->add("finished", 1);
      },
      opts);
  EXPECT_TRUE(result.ranks[0].ok());
  EXPECT_TRUE(result.ranks[1].ok());
  EXPECT_EQ(result.ranks[2].status, RankStatus::kTimedOut);
}

TEST(Harness, CrashingRankIsReportedWithItsSignal) {
  RunResult result = run_ranks(3, [](RankContext& ctx) {
    // Default dispositions first: a sanitizer's handler would turn the crash into exit(1).
    if (ctx.rank() == 2) {
      ::signal(SIGSEGV, SIG_DFL);
      ::raise(SIGSEGV);
    }
    if (ctx.rank() == 0) {
      ::signal(SIGABRT, SIG_DFL);
      ::raise(SIGABRT);
    }
  });
  ASSERT_EQ(result.ranks.size(), 3u);
  EXPECT_TRUE(result.ranks[1].ok());
  EXPECT_EQ(result.ranks[2].status, RankStatus::kSignaled);
  EXPECT_EQ(result.ranks[2].signal, SIGSEGV);
  EXPECT_EQ(result.ranks[0].status, RankStatus::kSignaled);
  EXPECT_EQ(result.ranks[0].signal, SIGABRT);
  EXPECT_NE(result.summary().find("rank 2: signaled"), std::string::npos) << result.summary();
}

TEST(Harness, RankThatExitsEarlyIsNotMistakenForSuccess) {
  RunResult result = run_ranks(2, [](RankContext& ctx) {
    if (ctx.rank() == 1) ::_exit(0);  // left without finishing its function
    if (ctx.rank() == 0) ::_exit(7);
  });
  EXPECT_EQ(result.ranks[0].status, RankStatus::kExited);
  EXPECT_EQ(result.ranks[0].exit_code, 7);
  EXPECT_EQ(result.ranks[1].status, RankStatus::kExited);
  EXPECT_EQ(result.ranks[1].exit_code, 0);
  EXPECT_FALSE(result.ok());
}

TEST(Harness, GtestFailureInsideARankReachesTheParent) {
  RunResult result =
      run_ranks(2, [](RankContext& ctx) { EXPECT_EQ(ctx.rank(), 0) << "marker-from-rank"; });
  EXPECT_TRUE(result.ranks[0].ok());
  EXPECT_EQ(result.ranks[1].status, RankStatus::kFailed);
  EXPECT_NE(result.ranks[1].message.find("marker-from-rank"), std::string::npos)
      << result.ranks[1].message;
}

TEST(Harness, ReapsEveryChild) {
  // Three runs, one with a straggler: afterwards no child of this process is left, dead or
  // alive (waitpid(-1) finds none), so nothing leaks into the next test.
  RunOptions opts;
  opts.deadline = 1s;
  for (int i = 0; i < 3; ++i)
    run_ranks(
        2,
        [i](RankContext& ctx) {
          if (i == 1 && ctx.rank() == 1) ::pause();
        },
        opts);
  errno = 0;
  EXPECT_EQ(::waitpid(-1, nullptr, WNOHANG), -1);
  EXPECT_EQ(errno, ECHILD);
}

TEST(Harness, MpiEnvironmentDetection) {
  // The same process cannot be both; check the helpers agree with the environment.
  if (under_mpirun()) {
    EXPECT_GE(mpirun_size(), 1);
    EXPECT_GE(mpirun_rank(), 0);
  } else {
    EXPECT_EQ(mpirun_size(), -1);
    EXPECT_EQ(mpirun_rank(), -1);
  }
}

}  // namespace
}  // namespace weft::test
