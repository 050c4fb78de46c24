// A Gloo world forms all or nothing (gloo_store.h): a rank that published its address and
// then gave up (its epoch replaced before a peer came) must not leave a late peer connecting
// to it. Gloo connects a pair as soon as the peer's address is in the store and the connect
// cannot be cancelled: before this, the late peer sat in that connect for the whole timeout
// and missed the next epoch's world (LiveResize.Dp4ToDp2ByKills..., 1 CI run in ~9).
#include <gtest/gtest.h>

#include "base/config.h"

#if WEFT_HAVE_GLOO

#include <chrono>
#include <memory>
#include <string>

#include "base/error.h"
#include "comm/gloo/gloo_store.h"
#include "comm/registry.h"
#include "comm/store/cancellable_store.h"
#include "comm/store/in_memory_store.h"
#include "tests/support/multiprocess.h"

namespace weft::comm {
namespace {

using namespace std::chrono_literals;

Bytes bytes(const std::string& s) { return Bytes(s.begin(), s.end()); }
std::string text(const Bytes& b) { return std::string(b.begin(), b.end()); }

// Every rank's address present: the first wait decides `formed`, and returns.
TEST(GlooMeshFate, EveryAddressPresentFormsTheMesh) {
  InMemoryStore store(1000ms);
  store.set("w/0", bytes("a"));
  store.set("w/1", bytes("b"));
  GlooStore g(store, "w", 2);
  g.wait({"1"}, 1000ms);
  EXPECT_EQ(text(store.get("w/fate")), "formed");
}

// A rank that gives up while an address is missing says so for everyone and rethrows; a
// rank that then finds every address (the late one published last) gives up too instead of
// connecting.
TEST(GlooMeshFate, ARankThatGivesUpMakesTheLateOneGiveUpToo) {
  auto base = std::make_shared<InMemoryStore>(1000ms);
  CancellableStore replaced(base, [] { return std::string("epoch 2 was replaced by epoch 3"); },
                            10ms);
  base->set("w/0", bytes("a"));  // rank 0 published, then waits for rank 1
  GlooStore early(replaced, "w", 2);
  try {
    early.wait({"1"}, 1000ms);
    ADD_FAILURE() << "the wait of a replaced epoch returned";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("replaced by epoch 3"), std::string::npos) << e.what();
  }
  EXPECT_EQ(text(base->get("w/fate")), "abandoned");
  base->set("w/1", bytes("b"));  // rank 1 arrives late, not knowing of epoch 3 yet
  GlooStore late(*base, "w", 2);
  try {
    late.wait({"0"}, 1000ms);
    ADD_FAILURE() << "the late rank went on to connect to a rank that gave up";
  } catch (const TimeoutError& e) {
    ADD_FAILURE() << "a timeout, not the abandonment: " << e.what();
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("abandoned"), std::string::npos) << e.what();
  }
}

// A rank that gives up after the mesh formed goes on: every address is there, so its
// connects complete, and the ranks already connecting to it are not left waiting.
TEST(GlooMeshFate, AGiveUpAfterTheMeshFormedGoesOn) {
  auto base = std::make_shared<InMemoryStore>(1000ms);
  base->set("w/0", bytes("a"));
  base->set("w/1", bytes("b"));
  GlooStore first(*base, "w", 2);
  first.wait({"0"}, 1000ms);  // rank 1 saw every address: formed
  // Rank 0's wait for every address is cancelled (here: an address it cannot see, as when
  // it looked in a slice before the last one came): it finds `formed` and goes on.
  base->erase("w/1");
  CancellableStore replaced(base, [] { return std::string("replaced"); }, 10ms);
  GlooStore second(replaced, "w", 2);
  EXPECT_NO_THROW(second.wait({"0"}, 1000ms));
  EXPECT_EQ(text(base->get("w/fate")), "formed");
}

// End to end with real processes and Gloo's TCP pairs: rank 0 publishes its address and
// gives up (its store says the epoch was replaced); rank 1 comes after that and must fail
// with the abandonment, before connecting. Without the fate, rank 1 connected: where its side
// of the pair is the one that waits to be connected to, until the timeout; where it dials,
// into rank 0's closed port (a transport error). Rank 0's process stays alive meanwhile, as a
// worker that moved on to the next epoch does.
TEST(GlooMeshFate, ALateRankDoesNotConnectToOneThatGaveUp) {
  test::RunResult result = test::run_ranks(2, [](test::RankContext& ctx) {
    std::shared_ptr<Store> store = ctx.store();
    CommOptions o;
    o.rank = ctx.rank();
    o.size = 2;
    o.prefix = "fate";
    o.timeout = 10s;  // bounds the connect that waited it out (a failure either way)
    if (ctx.rank() == 0) {
      auto replaced = std::make_shared<CancellableStore>(
          store, [] { return std::string("epoch 2 was replaced by epoch 3"); }, 10ms);
      o.store = replaced.get();
      EXPECT_THROW(make_communicator(BackendKind::kGloo, o), CommError);
      store->set("test/rank0-gave-up", bytes("1"));
      store->wait({"test/rank1-done"}, 60s);
      return;
    }
    store->wait({"test/rank0-gave-up"}, 60s);
    o.store = store.get();
    try {
      make_communicator(BackendKind::kGloo, o);
      ADD_FAILURE() << "rank 1 formed a world with a rank that gave up";
    } catch (const TimeoutError& e) {
      ADD_FAILURE() << "a timeout, not the abandonment: " << e.what();
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("abandoned"), std::string::npos) << e.what();
    }
    store->set("test/rank1-done", bytes("1"));
  });
  for (const auto& r : result.ranks) EXPECT_TRUE(r.ok()) << "rank " << r.rank << ": " << r.message;
}

}  // namespace
}  // namespace weft::comm

#else
TEST(GlooMeshFate, NotBuilt) { GTEST_SKIP() << "Gloo not found at configure time (WEFT_WITH_GLOO)"; }
#endif
