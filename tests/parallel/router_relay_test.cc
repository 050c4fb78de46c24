// The relay rule of the router's plan (router.h, relay_shared): a region that one holder would
// send whole to several destinations of one host reaches each of them whole while the holder
// sends each a different part, the rounds stay free of wait cycles and within the budget, and
// real processes (forked ranks, shared memory and Gloo) land the exact bytes.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>

#include "tests/parallel/router_util.h"
#include "tests/parallel/vps_util.h"
#include "tests/support/multiprocess.h"

namespace weft::parallel {
namespace {

using namespace test_util;

// Bytes each rank sends (`out`) and receives (`in`) in the plan's messages.
struct Flow {
  std::vector<int64_t> out, in;
};
Flow flow(const TransferPlan& plan, int world) {
  Flow f{std::vector<int64_t>(size_t(world), 0), std::vector<int64_t>(size_t(world), 0)};
  for (const Wave& w : plan.waves)
    for (const Round& r : w.rounds)
      for (const Message& m : r.messages) f.out[size_t(m.src)] += m.bytes, f.in[size_t(m.dst)] += m.bytes;
  return f;
}

// The sum over rounds of the round's largest message: the move's length in bytes when every
// message of a round moves at once at the same rate.
int64_t round_bytes(const TransferPlan& plan) {
  int64_t n = 0;
  for (const Wave& w : plan.waves)
    for (const Round& r : w.rounds) {
      int64_t largest = 0;
      for (const Message& m : r.messages) largest = std::max(largest, m.bytes);
      n += largest;
    }
  return n;
}

RouterOptions direct(RouterOptions o) {
  o.relay_min_bytes = std::numeric_limits<int64_t>::max();
  return o;
}

// Rank 0 holds a 64 x 256 f32 region (64 KiB); ranks 1 and 2 need it whole, rank 0 nothing.
struct OneHolder {
  StateSpace space = one_state({64, 256});
  Layout a, b;
  explicit OneHolder(std::vector<int> hosts) {
    a.ranks.resize(3), b.ranks.resize(3);
    hold(a, 0, {0, 0}, {64, 256});
    hold(b, 1, {0, 0}, {64, 256});
    hold(b, 2, {0, 0}, {64, 256});
    a.hosts = b.hosts = std::move(hosts);
  }
};

TEST(RouterRelay, OneHolderTwoDestinationsEachGetsTheRegionWhole) {
  OneHolder c({0, 0, 0});
  RouterOptions opt;
  opt.budget_bytes = 1 << 14;  // messages of at most 4 KiB: 16 per destination
  const TransferPlan relay = transition(c.space, c.a, c.b, opt);
  const TransferPlan plain = transition(c.space, c.a, c.b, direct(opt));
  check_plan(c.space, c.a, c.b, relay, "relayed");  // each element once, rounds, budget, replay
  check_plan(c.space, c.a, c.b, plain, "direct");
  const int64_t region = 64 * 256 * 4;
  EXPECT_EQ(plain.bytes_relayed(), 0);
  EXPECT_EQ(relay.bytes_relayed(), region);  // each destination forwards its half
  EXPECT_EQ(relay.bytes_remote(), plain.bytes_remote()) << "a relay moves no extra link bytes";
  EXPECT_EQ(relay.bytes_remote(), 2 * region);
  const Flow r = flow(relay, 3), p = flow(plain, 3);
  EXPECT_EQ(p.out[0], 2 * region);
  EXPECT_EQ(r.out[0], region) << "the holder sends each destination a different half";
  EXPECT_EQ(r.out[1], region / 2);
  EXPECT_EQ(r.out[2], region / 2);
  for (int d : {1, 2}) EXPECT_EQ(r.in[size_t(d)], region) << "rank " << d;
  // A round lasts as long as its largest message: the holder sent 32 of 4 KiB, one per round
  // (128 KiB of rounds); now it sends 64 of 1 KiB (the wave's messages cut in quarters so that
  // forwards pipeline behind it) with the forwards beside them. Each destination receives
  // 64 KiB, one message a round, so half is the least; the rounds' greedy fit gets 3/4.
  EXPECT_LE(round_bytes(relay), round_bytes(plain) * 3 / 4)
      << round_bytes(relay) << " against " << round_bytes(plain);
  for (int q = 0; q < 3; ++q) {
    const RankMemory m = rank_memory(relay, c.a, c.b, q);
    EXPECT_LE(m.peak, m.bound(opt.budget_bytes)) << "rank " << q;
  }
}

TEST(RouterRelay, OnlyDestinationsOfOneHostAndRegionsOfTheMinimumRelay) {
  const int64_t region = 64 * 256 * 4;
  RouterOptions opt;
  opt.budget_bytes = 1 << 14;
  {  // destinations on two hosts: a forward would cross between them, the holder's send too
    OneHolder c({0, 1, 2});
    const TransferPlan plan = transition(c.space, c.a, c.b, opt);
    check_plan(c.space, c.a, c.b, plan, "destinations on hosts 1 and 2");
    EXPECT_EQ(plan.bytes_relayed(), 0);
  }
  {  // both on host 1, the holder on host 0: it sends the region across once, not twice
    OneHolder c({0, 1, 1});
    const TransferPlan plan = transition(c.space, c.a, c.b, opt);
    check_plan(c.space, c.a, c.b, plan, "destinations on host 1");
    EXPECT_EQ(plan.bytes_relayed(), region);
    EXPECT_EQ(flow(plan, 3).out[0], region);
  }
  {  // a region below relay_min_bytes goes direct
    OneHolder c({0, 0, 0});
    opt.relay_min_bytes = region + 1;
    EXPECT_EQ(transition(c.space, c.a, c.b, opt).bytes_relayed(), 0);
    opt.relay_min_bytes = region;
    EXPECT_EQ(transition(c.space, c.a, c.b, opt).bytes_relayed(), region);
  }
}

// tp2 x dp2 loses rank 3 (TP rank 1 of the second replica): rank 1 is the only holder of the
// second TP half, which ranks 0 and 2 of the new dp3 need whole.
struct LostShard {
  core::JobSpec spec = dp3_spec();
  StateSpace space = space_for(spec);
  Layout a, b;
  static core::JobSpec dp3_spec() {
    core::JobSpec s = tiny_spec(false);
    s.train.global_batch = 12;  // divisible by dp 2 and 3
    return s;
  }
  LostShard() {
    auto [a4, b4] = layouts(space, spec, {2, 2, 1, 1, 0}, {3, 1, 1, 1, 0});
    a4.ranks[3] = RankLayout{};  // killed
    a = std::move(a4), b = std::move(b4);
    a.hosts = b.hosts = {0, 0, 0, 0};
  }
};

TEST(RouterRelay, ALostTpShardsOneHolderSendsHalfAsMuch) {
  LostShard c;
  RouterOptions opt;
  opt.budget_bytes = 1 << 14;
  opt.relay_min_bytes = 0;  // the tiny model's tensors are a few KiB
  const TransferPlan relay = transition(c.space, c.a, c.b, opt);
  const TransferPlan plain = transition(c.space, c.a, c.b, direct(opt));
  check_plan(c.space, c.a, c.b, relay, "relayed");
  check_plan(c.space, c.a, c.b, plain, "direct");
  EXPECT_EQ(relay.bytes_remote(), plain.bytes_remote());
  EXPECT_GT(relay.bytes_relayed(), 0);
  const Flow r = flow(relay, 4), p = flow(plain, 4);
  // Rank 1's shard went whole to ranks 0 and 2; now each gets about half (a tensor of odd
  // rows splits one row apart) and they forward it to each other.
  EXPECT_LT(r.out[1], p.out[1] * 6 / 10);
  EXPECT_GT(r.out[1], p.out[1] * 4 / 10);
  // The parts are sized so that the three ranks' sends even out (rank 0 also serves rank 1's
  // first TP half): the busiest sends less than before.
  const int64_t busiest = *std::max_element(r.out.begin(), r.out.end());
  EXPECT_LT(busiest, *std::max_element(p.out.begin(), p.out.end()));
  EXPECT_LT(round_bytes(relay), round_bytes(plain));
  for (int q = 0; q < 3; ++q) EXPECT_EQ(r.in[size_t(q)], p.in[size_t(q)]) << "rank " << q;
  for (int q = 0; q < 4; ++q) {
    const RankMemory m = rank_memory(relay, c.a, c.b, q);
    EXPECT_LE(m.peak, std::max(m.bound(opt.budget_bytes), rank_memory(plain, c.a, c.b, q).peak))
        << "rank " << q;
  }
}

// The same move between real processes, through shared memory and through Gloo, with the rule
// and without: every destination element equals its truth, each transport carries what the
// plan says, and the variants' bytes agree bitwise.
TEST(RouterRelay, ALostTpShardMovesTheExactBytesOverBothTransports) {
  LostShard c;
  RouterOptions on;
  on.budget_bytes = 1 << 14;
  on.relay_min_bytes = 0;
  const RouterOptions off = direct(on);
  TransitionOptions shm;
  shm.shm_chunk_bytes = 320;  // chunks that split rows and messages
  TransitionOptions gloo = shm;
  gloo.shared_memory = false;
  struct Variant {
    const char* what;
    RouterOptions ro;
    TransitionOptions to;
  };
  const std::vector<Variant> variants = {{"relayed, shared memory", on, shm},
                                         {"relayed, Gloo", on, gloo},
                                         {"direct, shared memory", off, shm}};
  test::RunResult result = test::run_ranks(4, [&](test::RankContext& ctx) {
    test::RankWorld w = test::gloo_world(ctx, "relay", std::chrono::milliseconds(30'000));
    const int r = ctx.rank();
    std::vector<std::vector<core::Tensor>> outs;
    for (const Variant& v : variants) {
      const TransferPlan plan = transition(c.space, c.a, c.b, v.ro);
      std::vector<core::Tensor> src = allocate_locals(c.a.ranks[size_t(r)]);
      fill(c.space, c.a.ranks[size_t(r)], src);
      TransitionStats st;
      outs.push_back(run_transition(plan, c.a, c.b, r, src, *w.comm, v.to, &st));
      EXPECT_EQ(mismatches(c.space, c.b.ranks[size_t(r)], outs.back()), 0)
          << v.what << ", rank " << r;
      const Flow f = flow(plan, 4);
      int64_t forwards = 0;
      for (const Transfer& t : plan.transfers)
        if (t.relayed && t.src == r) forwards += t.bytes;
      EXPECT_EQ(st.bytes_forwarded, forwards) << v.what << ", rank " << r;

      const bool via_shm = v.to.shared_memory;
      EXPECT_EQ(via_shm ? st.bytes_sent_shm : st.bytes_sent_comm, f.out[size_t(r)]) << v.what;
      EXPECT_EQ(via_shm ? st.bytes_received_shm : st.bytes_received_comm, f.in[size_t(r)])
          << v.what;
      for (size_t l = 0; l < outs.back().size(); ++l)
        EXPECT_EQ(std::memcmp(outs.back()[l].raw_data(), outs[0][l].raw_data(),
                              outs[0][l].nbytes()),
                  0)
            << v.what << " differs in local " << l;
    }
  });
  EXPECT_TRUE(result.ok()) << result.summary();
}

}  // namespace
}  // namespace weft::parallel
