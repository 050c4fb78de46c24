// Failure semantics of the Gloo backend with real processes: a rank killed with SIGKILL in
// the middle of a collective, a rank that stops participating, abort() from another thread.
// The survivors must get PeerLostError or TimeoutError from Work::wait(); no test measures
// time: a hang would surface as the harness killing the rank at its deadline.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <memory>
#include <thread>

#include "base/config.h"
#include "comm/registry.h"
#include "comm/store/store.h"
#include "tests/comm/comm_test_util.h"
#include "tests/support/multiprocess.h"

#if WEFT_HAVE_GLOO

namespace weft::comm {
namespace {

using namespace std::chrono_literals;
using core::DType;
using core::Tensor;
using testing::wait_for_peer_failure;

std::unique_ptr<Communicator> make_gloo(test::RankContext& ctx, Store& store,
                                        const std::string& prefix, Millis timeout) {
  CommOptions o;
  o.rank = ctx.rank();
  o.size = ctx.world();
  o.store = &store;
  o.prefix = prefix;
  o.timeout = timeout;
  return make_communicator(BackendKind::kGloo, o);
}

void expect_killed(const test::RunResult& result, int victim) {
  ASSERT_EQ(result.ranks.size() > size_t(victim), true);
  for (const auto& r : result.ranks) {
    if (r.rank == victim) {
      EXPECT_EQ(r.status, test::RankStatus::kSignaled) << result.summary();
      EXPECT_EQ(r.signal, SIGKILL) << result.summary();
    } else {
      EXPECT_TRUE(r.ok()) << "rank " << r.rank << ": " << r.message;
    }
  }
}

// The victim issues a large all-reduce and dies at once: the others are inside it, waiting
// for its data.
TEST(GlooFailure, RankKilledMidAllReduceFailsTheOthers) {
  constexpr int kVictim = 2;
  test::RunResult result = test::run_ranks(4, [](test::RankContext& ctx) {
    auto store = ctx.store();
    auto comm = make_gloo(ctx, *store, "kill-mid", 5s);
    comm->barrier().wait();
    Tensor t = Tensor::zeros({int64_t(8) << 20}, DType::kF32);
    Work w = comm->all_reduce(t);
    if (ctx.rank() == kVictim) kill(getpid(), SIGKILL);
    std::string error = wait_for_peer_failure(w);
    // The communicator stays failed: later calls report the same failure family at once.
    std::string later = wait_for_peer_failure(comm->barrier());
    EXPECT_EQ(error, later);
  });
  expect_killed(result, kVictim);
}

// With two ranks the survivor's only connection is to the victim: the error names it.
TEST(GlooFailure, PeerKilledBeforeJoiningIsNamedInPeerLostError) {
  test::RunResult result = test::run_ranks(2, [](test::RankContext& ctx) {
    auto store = ctx.store();
    auto comm = make_gloo(ctx, *store, "kill-before", 30s);
    comm->barrier().wait();
    if (ctx.rank() == 1) kill(getpid(), SIGKILL);
    Tensor t = Tensor::zeros({1024}, DType::kI64);
    try {
      comm->all_reduce(t).wait();
      ADD_FAILURE() << "all_reduce succeeded without its peer";
    } catch (const PeerLostError& e) {
      EXPECT_EQ(e.peer(), 1) << e.what();
    } catch (const std::exception& e) {
      // 30 s is far beyond the time the closed socket needs to show; anything but
      // PeerLostError means the death went unnoticed.
      ADD_FAILURE() << "expected PeerLostError, got: " << e.what();
    }
  });
  expect_killed(result, 1);
}

// A rank that is alive but never joins the collective: its peer times out, and having given
// up it closes its connections, so the late rank learns of it as a lost peer.
TEST(GlooFailure, StuckPeerMakesTheOtherTimeOut) {
  test::RunResult result = test::run_ranks(2, [](test::RankContext& ctx) {
    auto store = ctx.store();
    auto comm = make_gloo(ctx, *store, "stuck", 2s);
    comm->barrier().wait();
    Tensor t = Tensor::zeros({16}, DType::kF32);
    if (ctx.rank() == 0) {
      EXPECT_THROW(comm->all_reduce(t).wait(), TimeoutError);
      store->set_string("rank0-gave-up", "1");
    } else {
      store->wait({"rank0-gave-up"}, 30s);
      try {
        comm->all_reduce(t).wait();
        ADD_FAILURE() << "all_reduce succeeded with a peer that had given up";
      } catch (const PeerLostError& e) {
        EXPECT_EQ(e.peer(), 0) << e.what();
      } catch (const std::exception& e) {
        ADD_FAILURE() << "expected PeerLostError, got: " << e.what();
      }
    }
  });
  EXPECT_TRUE(result.ok()) << result.summary();
}

// abort() from a second thread while the first waits: the wait fails with CommError naming
// the abort (not a timeout: the operation's timeout is far away), later calls fail at once,
// and the peer is released with PeerLostError.
TEST(GlooFailure, AbortFromAnotherThreadFailsPendingAndFutureCalls) {
  test::RunResult result = test::run_ranks(2, [](test::RankContext& ctx) {
    auto store = ctx.store();
    auto comm = make_gloo(ctx, *store, "abort", 30s);
    comm->barrier().wait();
    Tensor t = Tensor::zeros({16}, DType::kF32);
    if (ctx.rank() == 0) {
      Work pending = comm->all_reduce(t);
      Tensor r = Tensor::empty({4}, DType::kF32);
      Work pending_recv = comm->recv(r, 1, {.tag = 1});
      // The peer takes no part until this rank has aborted, so a bounded wait must give up
      // and leave the operation running.
      EXPECT_THROW(pending.wait(10ms), TimeoutError);
      EXPECT_FALSE(pending.done());
      std::thread aborter([&] {
        std::this_thread::sleep_for(100ms);
        comm->abort("test asked for it");
      });
      try {
        pending.wait();
        ADD_FAILURE() << "all_reduce succeeded although aborted";
      } catch (const PeerLostError& e) {
        ADD_FAILURE() << "abort reported as a lost peer: " << e.what();
      } catch (const TimeoutError& e) {
        ADD_FAILURE() << "abort did not interrupt the wait: " << e.what();
      } catch (const CommError& e) {
        EXPECT_NE(std::string(e.what()).find("test asked for it"), std::string::npos) << e.what();
      }
      aborter.join();
      EXPECT_TRUE(comm->aborted());
      EXPECT_THROW(pending_recv.wait(), CommError);
      Work later = comm->broadcast(t);
      EXPECT_TRUE(later.done());
      EXPECT_THROW(later.wait(), CommError);
      EXPECT_THROW(comm->split(0, 0), CommError);
      store->set_string("rank0-aborted", "1");
    } else {
      store->wait({"rank0-aborted"}, 30s);
      testing::wait_for_peer_failure(comm->all_reduce(t));
    }
  });
  EXPECT_TRUE(result.ok()) << result.summary();
}

// Destroying a communicator with an operation pending fails that operation instead of
// waiting for the peer that will never come.
TEST(GlooFailure, DestroyingWithPendingWorkFailsIt) {
  test::RunResult result = test::run_ranks(2, [](test::RankContext& ctx) {
    auto store = ctx.store();
    auto comm = make_gloo(ctx, *store, "destroy", 30s);
    comm->barrier().wait();
    if (ctx.rank() == 0) {
      Tensor t = Tensor::zeros({16}, DType::kF32);
      Work w = comm->all_reduce(t);
      comm.reset();
      EXPECT_TRUE(w.done());
      EXPECT_THROW(w.wait(), CommError);
      store->set_string("rank0-destroyed", "1");
    } else {
      store->wait({"rank0-destroyed"}, 30s);
      Tensor t = Tensor::zeros({16}, DType::kF32);
      testing::wait_for_peer_failure(comm->all_reduce(t));
    }
  });
  EXPECT_TRUE(result.ok()) << result.summary();
}

}  // namespace
}  // namespace weft::comm

#else

TEST(GlooFailure, NotBuilt) { GTEST_SKIP() << "Gloo not found at configure time (WEFT_WITH_GLOO)"; }

#endif
