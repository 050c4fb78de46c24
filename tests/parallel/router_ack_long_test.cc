// What the router's acknowledgements (TransitionOptions::acknowledge: a sender frees a source
// only once the receiver has acknowledged the last message that read it) cost in move time:
// the setup of RouterStripesThroughput (two network-namespace hosts, 256 MiB from host 0 to
// host 1 through run_transition over Gloo), moved with the acknowledgement off and on,
// interleaved, best of five: one tensor with the default 256 MiB budget (4 messages of 64 MiB,
// one acknowledgement), the same over 4 connections, and 1024 tensors of 256 KiB swapped
// between the two ranks, which then allocate between their messages: with a 1 MiB budget
// (1024 messages of 256 KiB, an acknowledgement each: the worst case) and with 16 MiB.
// Printed side by side as "off vs on: x s vs y s (ratio)"; what is asserted is only that
// every byte arrives exact and the acknowledgements counted (no timing thresholds). The
// figures are in docs/run.md.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
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

// Element `e` of state `id`: distinct across neighbouring states and elements.
float value(StateId id, int64_t e) { return float((int64_t(id) * 7 + e) % 1000003) * 0.5f; }

// A move's acknowledgements (awaited on one end, sent on the other: the test fails when the
// two sums differ) and the allocations that waited for one, summed over the ranks.
struct Acks {
  int64_t acks = 0, waits = 0;
};

Acks agree_count(comm::Communicator& comm, const TransitionStats& st) {
  core::Tensor t =
      core::Tensor::from_vector<int64_t>({3}, {st.acks_awaited, st.acks_sent, st.ack_waits});
  comm.all_reduce(t).wait();
  const int64_t* v = t.data<int64_t>();
  EXPECT_EQ(v[0], v[1]);
  return {v[0], v[2]};
}

// `n` f32 parameters of kFloats / n elements each: all on rank 0 in A and on rank 1 in B, or
// (`swap`) parameter i on rank i % 2 in A and on the other in B, so that both ranks send,
// receive and allocate as they go (an acknowledgement before each allocation that frees).
struct Move {
  StateSpace space;
  Layout a, b;
};

Move tensors(int n, bool swap) {
  core::Graph g;
  for (int i = 0; i < n; ++i) {
    core::Value v;
    v.name = "w" + std::to_string(i);
    v.shape = {kFloats / n};
    v.dtype = core::DType::kF32;
    v.role = core::Role::kParameter;
    v.persistent = true;
    g.add_value(v);
  }
  Move m{StateSpace::from_graph(g), {}, {}};
  m.a.ranks.resize(2), m.b.ranks.resize(2);
  m.a.hosts = m.b.hosts = {0, 1};
  for (int i = 0; i < n; ++i) {
    const StateId id = m.space.find("w" + std::to_string(i));
    const int from = swap ? i % 2 : 0;
    for (auto [l, r] : {std::pair<Layout*, int>{&m.a, from}, {&m.b, 1 - from}}) {
      RankLayout& rl = l->ranks[size_t(r)];
      rl.locals.push_back(LocalTensor{id, {kFloats / n}, core::DType::kF32, -1});
      rl.boxes.push_back(StateBox{id, {0}, {kFloats / n}, int(rl.locals.size()) - 1, {0}});
    }
  }
  return m;
}

// Seconds that the move of `n` tensors took with the acknowledgement off (false) and on
// (true), the best of five, over `connections` connections per pair; `acks` gets how many
// acknowledgements the move took and how often an allocation waited for one.
std::map<bool, double> measure(const test::VirtualHosts& hosts, int n, bool swap, int64_t budget,
                               int connections, Acks* acks) {
  const Move mv = tensors(n, swap);
  const StateSpace& space = mv.space;
  const Layout &a = mv.a, &b = mv.b;
  const TransferPlan plan = transition(space, a, b, RouterOptions{budget});
  const fs::path out =
      fs::temp_directory_path() / ("weft-router-ack-" + std::to_string(::getpid()));
  test::RunOptions ro;
  ro.deadline = milliseconds(600'000);
  test::RunResult result = test::run_ranks(
      2,
      [&](test::RankContext& ctx) {
        const int r = ctx.rank();
        std::unique_ptr<comm::Store> store = ctx.store();
        HostPairComms p =
            connect_host_pair(hosts, r, *store, "router-ack", milliseconds(120'000), connections);
        std::unique_ptr<comm::Communicator>& comm = p.comm;
        std::vector<std::unique_ptr<comm::Communicator>>& more = p.more;
        std::ofstream log;
        if (r == 1) log.open(out);
        for (int rep = 0; rep < 5; ++rep)
          for (bool ack : {false, true}) {
            TransitionOptions opt;
            opt.acknowledge = ack;
            for (auto& c : more) opt.connections.push_back(c.get());
            std::vector<core::Tensor> src = allocate_locals(a.ranks[size_t(r)]);
            const RankLayout &ra = a.ranks[size_t(r)], &rb = b.ranks[size_t(r)];
            for (size_t l = 0; l < src.size(); ++l) {
              float* x = src[l].data<float>();
              for (int64_t e = 0; e < src[l].numel(); ++e) x[e] = value(ra.locals[l].state, e);
            }
            agree_stop(*comm, false);  // both ready: the clock measures the transfer alone
            const auto t0 = Clock::now();
            TransitionStats st;
            std::vector<core::Tensor> got = run_transition(plan, a, b, r, src, *comm, opt, &st);
            // The sender's clock stops when its last acknowledgement came; the receiver's
            // when its last one was delivered: the later of the two is the move's end.
            agree_stop(*comm, false);
            const double s = std::chrono::duration<double>(Clock::now() - t0).count();
            // Both ends count the same acknowledgements; none when off.
            const Acks counted = agree_count(*comm, st);
            if (ack)
              EXPECT_GT(counted.acks, 0);
            else
              EXPECT_EQ(counted.acks, 0);
            int64_t bad = 0;
            for (size_t l = 0; l < got.size(); ++l) {
              const float* y = got[l].data<float>();
              for (int64_t e = 0; e < got[l].numel(); ++e)
                bad += y[e] != value(rb.locals[l].state, e);
            }
            EXPECT_EQ(bad, 0) << (ack ? "acknowledged" : "not acknowledged") << ", rank " << r;
            if (r == 1)
              log << ack << " " << s << " " << counted.acks << " " << counted.waits << "\n";
          }
      },
      ro);
  EXPECT_TRUE(result.ok()) << result.summary();
  std::map<bool, double> seconds;
  std::ifstream in(out);
  for (int ack; in >> ack;) {
    double s = 0;
    Acks c;
    in >> s >> c.acks >> c.waits;
    if (ack) *acks = c;
    seconds[ack != 0] = seconds.count(ack != 0) ? std::min(seconds[ack != 0], s) : s;
  }
  fs::remove(out);
  return seconds;
}

void print(const std::string& what, const std::map<bool, double>& s) {
  const double mb = double(kFloats * 4) / 1e6;
  std::printf(
      "[ measured ] %s: acknowledgement off vs on: %.3f s vs %.3f s (%.0f vs %.0f MB/s, "
      "on/off time %.3f)\n",
      what.c_str(), s.at(false), s.at(true), mb / s.at(false), mb / s.at(true),
      s.at(true) / s.at(false));
}

TEST(RouterAckCost, MoveTimeWithAndWithoutTheAcknowledgementBetweenTwoHosts) {
  std::string why;
  if (!test::VirtualHosts::available(&why)) GTEST_SKIP() << why;
  test::VirtualHosts hosts(2);
  Acks acks[4];
  const std::map<bool, double> big = measure(hosts, 1, false, int64_t(256) << 20, 1, &acks[0]);
  const std::map<bool, double> striped = measure(hosts, 1, false, int64_t(256) << 20, 4, &acks[1]);
  const std::map<bool, double> swap = measure(hosts, 1024, true, int64_t(1) << 20, 1, &acks[2]);
  ASSERT_EQ(big.size(), 2u);
  ASSERT_EQ(striped.size(), 2u);
  const std::map<bool, double> swap16 = measure(hosts, 1024, true, int64_t(16) << 20, 1, &acks[3]);
  ASSERT_EQ(swap.size(), 2u);
  ASSERT_EQ(swap16.size(), 2u);
  auto with = [&](const std::string& what, const Acks& c) {
    return what + ", " + std::to_string(c.acks) + " acks (" + std::to_string(c.waits) +
           " allocations waited for one)";
  };
  std::printf(
      "[ measured ] 256 MiB between host 0 and host 1 through the router over Gloo, "
      "best of 5\n");
  print(with("1 tensor 0 -> 1, 4 messages of 64 MiB, 1 connection", acks[0]), big);
  print(with("1 tensor 0 -> 1, 4 messages of 64 MiB, 4 connections", acks[1]), striped);
  print(with("1024 tensors of 256 KiB swapped 0 <-> 1, budget 1 MiB (1024 messages)", acks[2]),
        swap);
  print(with("1024 tensors of 256 KiB swapped 0 <-> 1, budget 16 MiB (64 messages)", acks[3]),
        swap16);
}

}  // namespace
}  // namespace weft::parallel
