// What striping the router's messages over several connections per pair buys between two
// hosts (network namespaces, tests/support/netns.h; forked ranks): 256 MiB from host 0 to
// host 1 through run_transition with 1, 2, 4 and 8 connections (elastic.
// transfer_connections), (i) over the plain veth and (ii) with every TCP flow capped at
// 200 Mbit/s on host 0's egress, as per-flow limits of real NICs and WAN paths do. Printed
// side by side as "K=1 vs K=4: x MB/s vs y MB/s (ratio)"; what is asserted is only that
// every byte arrives exact (no timing thresholds). The figures are in docs/run.md.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
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

namespace fs = std::filesystem;
using namespace test_util;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr int64_t kFloats = int64_t(64) << 20;  // 256 MiB
const std::vector<int> kConnections = {1, 2, 4, 8};

// Every TCP flow leaving host `i` at `mbit` Mbit/s at most: htb classes behind a u32 hash on
// the low byte of the source port (256 buckets, a class each). The kernel here has neither fq
// (maxrate) nor sfq; two flows whose ports share a low byte share a cap.
void cap_every_flow(const test::VirtualHosts& hosts, int i, int mbit) {
  const fs::path batch = fs::temp_directory_path() / ("weft-stripes-tc-" + hosts.netns(i));
  {
    std::ofstream f(batch);
    f << "qdisc add dev eth0 root handle 1: htb default 1\n"
      << "class add dev eth0 parent 1: classid 1:1 htb rate 10gbit quantum 60000\n";
    char id[16];
    for (int b = 0; b < 256; ++b) {
      std::snprintf(id, sizeof id, "%x", 0x100 + b);
      f << "class add dev eth0 parent 1: classid 1:" << id << " htb rate " << mbit << "mbit ceil "
        << mbit << "mbit quantum 60000\n";
    }
    f << "filter add dev eth0 parent 1:0 prio 1 handle 2: protocol ip u32 divisor 256\n";
    for (int b = 0; b < 256; ++b) {
      char bucket[8];
      std::snprintf(id, sizeof id, "%x", 0x100 + b), std::snprintf(bucket, sizeof bucket, "%x", b);
      f << "filter add dev eth0 parent 1:0 prio 1 protocol ip u32 ht 2:" << bucket
        << ": match u32 0 0 flowid 1:" << id << "\n";
    }
    // The IP header's protocol TCP; the hash key: the TCP ports' word (20 bytes on), source
    // port's low byte.
    f << "filter add dev eth0 parent 1:0 prio 1 protocol ip u32 ht 800:: match ip protocol 6 "
         "0xff hashkey mask 0x00ff0000 at 20 link 2:\n";
  }
  const std::string cmd =
      "tc -n " + hosts.netns(i) + " -batch " + batch.string() + " > /dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  fs::remove(batch);
}

// Seconds that host 1's rank took to receive the state, by connection count, the best of
// three (the counts interleaved: the machine is shared, and a burst of other work slows
// whichever run it meets); one run_ranks (a world of two with seven extra connections).
std::map<int, double> measure(const test::VirtualHosts& hosts, const std::string& what) {
  const StateSpace space = one_state({kFloats});
  Layout a, b;
  a.ranks.resize(2), b.ranks.resize(2);
  a.hosts = b.hosts = {0, 1};
  hold(a, 0, {0}, {kFloats}), hold(b, 1, {0}, {kFloats});
  const TransferPlan plan = transition(space, a, b);  // 256 MiB budget: 4 messages of 64 MiB
  const fs::path out = fs::temp_directory_path() / ("weft-stripes-" + std::to_string(::getpid()));
  test::RunOptions ro;
  ro.deadline = milliseconds(300'000);
  test::RunResult result = test::run_ranks(
      2,
      [&](test::RankContext& ctx) {
        const int r = ctx.rank();
        std::unique_ptr<comm::Store> store = ctx.store();
        HostPairComms p = connect_host_pair(hosts, r, *store, "throughput", milliseconds(120'000),
                                            kConnections.back());
        std::unique_ptr<comm::Communicator>& comm = p.comm;
        std::vector<std::unique_ptr<comm::Communicator>>& more = p.more;
        std::ofstream log;
        if (r == 1) log.open(out);
        for (int rep = 0; rep < 3; ++rep)
          for (int k : kConnections) {
            TransitionOptions opt;
            for (int i = 0; i + 1 < k; ++i) opt.connections.push_back(more[size_t(i)].get());
            std::vector<core::Tensor> src = allocate_locals(a.ranks[size_t(r)]);
            if (r == 0) {
              float* x = src[0].data<float>();
              for (int64_t e = 0; e < kFloats; ++e) x[e] = float(e % 1000003) * 0.5f;
            }
            agree_stop(*comm, false);  // both ready: the clock measures the transfer alone
            const auto t0 = Clock::now();
            std::vector<core::Tensor> got = run_transition(plan, a, b, r, src, *comm, opt);
            const double s = std::chrono::duration<double>(Clock::now() - t0).count();
            if (r != 1) continue;
            const float* y = got.at(0).data<float>();
            int64_t bad = 0;
            for (int64_t e = 0; e < kFloats; ++e) bad += y[e] != float(e % 1000003) * 0.5f;
            EXPECT_EQ(bad, 0) << what << ", " << k << " connections";
            log << k << " " << s << "\n";
          }
      },
      ro);
  EXPECT_TRUE(result.ok()) << result.summary();
  std::map<int, double> seconds;
  std::ifstream in(out);
  for (int k; in >> k;) {
    double s = 0;
    in >> s;
    seconds[k] = seconds.count(k) ? std::min(seconds[k], s) : s;
  }
  fs::remove(out);
  return seconds;
}

void print(const std::string& what, const std::map<int, double>& s) {
  const double mib = double(kFloats * 4) / double(1 << 20);
  auto rate = [&](int k) { return mib * 1.048576 / s.at(k); };  // MB/s
  for (int k : {2, 4, 8})
    std::printf("[ measured ] %s: K=1 vs K=%d: %.0f MB/s vs %.0f MB/s (%.2fx)\n", what.c_str(), k,
                rate(1), rate(k), rate(k) / rate(1));
}

TEST(RouterStripesThroughput, OneToEightConnectionsBetweenTwoHostsPlainAndPerFlowCapped) {
  std::string why;
  if (!test::VirtualHosts::available(&why)) GTEST_SKIP() << why;
  test::VirtualHosts hosts(2);
  const std::map<int, double> plain = measure(hosts, "plain veth");
  ASSERT_NO_FATAL_FAILURE(cap_every_flow(hosts, 0, 200));
  const std::map<int, double> capped = measure(hosts, "200 Mbit/s per flow");
  ASSERT_EQ(plain.size(), kConnections.size());
  ASSERT_EQ(capped.size(), kConnections.size());
  std::printf(
      "[ measured ] 256 MiB from host 0 to host 1 through the router (4 messages of "
      "64 MiB), best of 3\n");
  print("plain veth", plain);
  print("200 Mbit/s per flow", capped);
}

}  // namespace
}  // namespace weft::parallel
