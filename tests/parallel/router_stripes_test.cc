// The router's messages striped over several connections per pair (TransitionOptions::
// connections, elastic.transfer_connections) between hosts that are network namespaces
// (tests/support/netns.h), with real processes (forked ranks, each on its own host): the bytes
// arrive exact for any count of connections, odd sizes and messages shorter than the count;
// a worker's world connects the extra ones only across hosts and closes them with its epoch.
#include <dirent.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <string>

#include "comm/registry.h"
#include "parallel/launch_env.h"
#include "parallel/transfer_connections.h"
#include "tests/parallel/host_pair.h"
#include "tests/parallel/router_util.h"
#include "tests/support/multiprocess.h"
#include "tests/support/netns.h"

namespace weft::parallel {
namespace {

using namespace test_util;
using std::chrono::milliseconds;

#define SKIP_WITHOUT_HOSTS()                                       \
  do {                                                             \
    std::string why;                                               \
    if (!test::VirtualHosts::available(&why)) GTEST_SKIP() << why; \
  } while (0)

// The open file descriptors of this process.
int open_fds() {
  int n = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
    ::closedir(d);
  }
  return n;
}

struct Case {
  std::string what;
  const StateSpace* space;
  Layout a, b;
  int connections = 1;
  int64_t stripe_min_bytes = 0;
};

// Rank 0 and 1 on hosts 0 and 1: rows of a [301, 77] f32 state to columns (messages of
// 150 x 39 and 151 x 38 floats, sizes that 3 and 8 do not divide, both ways in one round), and
// one float from rank 0 to rank 1 (4 bytes: shorter than 8 connections).
TEST(RouterStripes, NetnsHostsGetExactBytesOverOneToEightConnections) {
  SKIP_WITHOUT_HOSTS();
  test::VirtualHosts hosts(2);
  const StateSpace rows = one_state({301, 77}), one = one_state({1});
  Layout a, b, a1, b1;
  a.ranks.resize(2), b.ranks.resize(2), a1.ranks.resize(2), b1.ranks.resize(2);
  a.hosts = b.hosts = a1.hosts = b1.hosts = {0, 1};
  hold(a, 0, {0, 0}, {150, 77}), hold(a, 1, {150, 0}, {151, 77});
  hold(b, 0, {0, 0}, {301, 38}), hold(b, 1, {0, 38}, {301, 39});
  hold(a1, 0, {0}, {1}), hold(b1, 1, {0}, {1});
  std::vector<Case> cases;
  for (int k : {1, 3, 4, 8})
    cases.push_back({"rows to columns, " + std::to_string(k) + " connections", &rows, a, b, k});
  cases.push_back({"rows to columns, 4 connections, messages below the stripe size", &rows, a, b, 4,
                   int64_t(1) << 20});
  cases.push_back({"one float, 8 connections", &one, a1, b1, 8});
  const RouterOptions ro{int64_t(1) << 20};
  for (const Case& c : cases) ASSERT_EQ(transition(*c.space, c.a, c.b, ro).rounds(), 1) << c.what;
  test::RunResult result = test::run_ranks(2, [&](test::RankContext& ctx) {
    const int r = ctx.rank();
    std::unique_ptr<comm::Store> store = ctx.store();  // on the machine's loopback
    HostPairComms p = connect_host_pair(hosts, r, *store, "stripes", milliseconds(30'000), 8);
    std::unique_ptr<comm::Communicator>& comm = p.comm;
    std::vector<std::unique_ptr<comm::Communicator>>& more = p.more;
    EXPECT_TRUE(spans_hosts(*comm, p.options.host));
    for (const Case& c : cases) {
      const StateSpace& space = *c.space;
      const TransferPlan plan = transition(space, c.a, c.b, ro);
      TransitionOptions opt;
      for (int i = 0; i + 1 < c.connections; ++i) opt.connections.push_back(more[size_t(i)].get());
      opt.stripe_min_bytes = c.stripe_min_bytes;
      std::vector<core::Tensor> src = allocate_locals(c.a.ranks[size_t(r)]);
      fill(space, c.a.ranks[size_t(r)], src);
      TransitionStats st;
      std::vector<core::Tensor> got = run_transition(plan, c.a, c.b, r, src, *comm, opt, &st);
      EXPECT_EQ(mismatches(space, c.b.ranks[size_t(r)], got), 0) << c.what << ", rank " << r;
      int64_t out = 0, in = 0;
      for (const Message& m : plan.waves[0].rounds[0].messages) {
        if (m.src == r) out += m.bytes;
        if (m.dst == r) in += m.bytes;
      }
      EXPECT_EQ(st.bytes_sent_comm, out) << c.what;
      EXPECT_EQ(st.bytes_received_comm, in) << c.what;
      EXPECT_EQ(st.bytes_sent_shm + st.bytes_received_shm, 0) << c.what;
      const bool striped = c.connections > 1 && c.stripe_min_bytes == 0;
      EXPECT_EQ(st.bytes_sent_striped, striped ? out : 0) << c.what;
      EXPECT_EQ(st.bytes_received_striped, striped ? in : 0) << c.what;
    }
  });
  EXPECT_TRUE(result.ok()) << result.summary();
}

// A worker's world of two hosts with elastic.transfer_connections 4: three more connections,
// which carry a striped move exact, and every socket of an epoch closed with its world: the
// process has as many descriptors after three epochs as before. On one host (every rank on
// 127.0.0.1) none are connected: shared memory carries everything there.
TEST(RouterStripes, WorkerWorldConnectsMoreAcrossHostsOnlyAndClosesThemWithItsEpoch) {
  SKIP_WITHOUT_HOSTS();
  test::VirtualHosts hosts(2);
  const StateSpace space = one_state({301, 77});
  Layout a, b;
  a.ranks.resize(2), b.ranks.resize(2);
  a.hosts = b.hosts = {0, 1};
  hold(a, 0, {0, 0}, {150, 77}), hold(a, 1, {150, 0}, {151, 77});
  hold(b, 0, {0, 0}, {301, 38}), hold(b, 1, {0, 38}, {301, 39});
  const TransferPlan plan = transition(space, a, b, RouterOptions{int64_t(1) << 20});
  test::RunResult result = test::run_ranks(2, [&](test::RankContext& ctx) {
    const int r = ctx.rank();
    {  // one host: the run's store on 127.0.0.1
      LaunchEnv env;
      env.rank = r, env.world = 2;
      env.store_host = ctx.store_host(), env.store_port = ctx.store_port();
      env.store_prefix = "one-host";
      WorkerWorld w(env, milliseconds(30'000), {}, 4);
      EXPECT_TRUE(w.connections().empty());
      agree_stop(w.comm(), false);  // both ranks connected before rank 0 closes
    }
    // A store served beyond loopback asks its clients for the job's token.
    ::setenv("WEFT_JOB_TOKEN", "router-stripes-test-token", 1);
    const int before = open_fds();
    for (int epoch = 1; epoch <= 3; ++epoch) {
      hosts.in_host(r, [&] {
        LaunchEnv env;  // host 0 serves this epoch's store, as rank 0 under mpirun does
        env.rank = r, env.world = 2;
        env.store_host = hosts.address(0), env.store_port = uint16_t(29500 + epoch);
        env.host_store = r == 0;
        env.store_prefix = "epoch/" + std::to_string(epoch);
        WorkerWorld w(env, milliseconds(30'000), {}, 4);
        ASSERT_EQ(w.connections().size(), 3u) << "epoch " << epoch;
        TransitionOptions opt;
        opt.connections = w.connections();
        opt.stripe_min_bytes = 0;
        std::vector<core::Tensor> src = allocate_locals(a.ranks[size_t(r)]);
        fill(space, a.ranks[size_t(r)], src);
        TransitionStats st;
        std::vector<core::Tensor> got = run_transition(plan, a, b, r, src, w.comm(), opt, &st);
        EXPECT_EQ(mismatches(space, b.ranks[size_t(r)], got), 0) << "epoch " << epoch;
        EXPECT_GT(st.bytes_sent_striped, 0) << "epoch " << epoch;
        EXPECT_EQ(st.bytes_sent_striped, st.bytes_sent_comm) << "epoch " << epoch;
        agree_stop(w.comm(), false);  // the store is no longer needed by either rank
      });
    }
    EXPECT_EQ(open_fds(), before) << "descriptors left by three epochs' connections";
  });
  EXPECT_TRUE(result.ok()) << result.summary();
}

}  // namespace
}  // namespace weft::parallel
