// GlooLinks names a lost peer from the state of its connection, not only from Gloo's error
// message: under load Gloo's message named an address that was neither end of any of the
// process's connections, and a survivor's PeerLostError lost the rank (CI, PeerLoss).
#include <gtest/gtest.h>

#include "base/config.h"

#if WEFT_HAVE_GLOO

#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "base/check.h"
#include "comm/gloo/gloo_links.h"
#include "comm/gloo/gloo_store.h"
#include "tests/support/multiprocess.h"

namespace weft::comm {
namespace {

using namespace std::chrono_literals;

constexpr int kVictim = 2;

TEST(GlooLinks, TheKilledRankIsTheOneLostPeerOfEverySurvivor) {
  test::RunResult result = test::run_ranks(3, [](test::RankContext& ctx) {
    auto store = ctx.store();
    gloo::transport::tcp::attr attr;
    attr.hostname = "127.0.0.1";
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(ctx.rank(), ctx.world());
    context->setTimeout(30s);
    GlooStore gloo_store(*store, "links/gloo");
    context->connectFullMesh(gloo_store, device);
    GlooLinks links(*context, *store, "links/gloo");

    // Every connection is up: nobody is lost, and a message naming no peer names none.
    EXPECT_EQ(links.lost_peer(), -1);
    EXPECT_EQ(links.peer_in_message("Read error [127.0.0.1]:1: Connection reset by peer"), -1);
    store->set_string(str("checked/", ctx.rank()), "1");
    store->wait({"checked/0", "checked/1", "checked/2"}, 30s);
    if (ctx.rank() == kVictim) ::kill(::getpid(), SIGKILL);

    // The victim's end closes with its process; each survivor sees exactly that connection
    // hang up, and the other survivor's stays up. The harness's deadline bounds the loop.
    int lost = -1;
    while ((lost = links.lost_peer()) < 0) std::this_thread::sleep_for(5ms);
    EXPECT_EQ(lost, kVictim);
    // A survivor that left now would be a second lost peer for the other one.
    store->set_string(str("found/", ctx.rank()), "1");
    store->wait({"found/0", "found/1"}, 30s);
  });
  ASSERT_EQ(result.ranks.size(), 3u);
  for (const auto& r : result.ranks) {
    if (r.rank == kVictim)
      EXPECT_EQ(r.status, test::RankStatus::kSignaled) << result.summary();
    else
      EXPECT_TRUE(r.ok()) << result.summary();
  }
}

}  // namespace
}  // namespace weft::comm

#endif  // WEFT_HAVE_GLOO
