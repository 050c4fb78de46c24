// The router's same-host transport and adoption with real processes (forked ranks, Gloo on
// 127.0.0.1 for the setup and the cross-host pairs): shared memory and the communicator move
// bitwise the same bytes, survivors of a shrink keep their tensors, and a peer killed or
// stuck mid-transfer fails the others within the timeout, leaving nothing in /dev/shm.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "tests/parallel/router_util.h"
#include "tests/support/multiprocess.h"

namespace weft::parallel {
namespace {

namespace fs = std::filesystem;
using namespace test_util;
using std::chrono::milliseconds;

Layout on_hosts(Layout l, std::vector<int> hosts) {
  l.hosts = std::move(hosts);
  return l;
}

// What rank `r` must send and receive, split by transport as run_transition decides.
TransitionStats expected(const TransferPlan& plan, const Layout& a, const Layout& b, int r,
                         bool shm) {
  TransitionStats e;
  for (const Wave& w : plan.waves)
    for (const Round& round : w.rounds)
      for (const Message& m : round.messages) {
        const bool same = shm && a.host(m.src) == a.host(m.dst) && b.host(m.src) == b.host(m.dst);
        if (m.src == r) (same ? e.bytes_sent_shm : e.bytes_sent_comm) += m.bytes;
        if (m.dst == r) (same ? e.bytes_received_shm : e.bytes_received_comm) += m.bytes;
      }
  return e;
}

void expect_moved(const TransitionStats& got, const TransitionStats& want,
                  const std::string& what) {
  EXPECT_EQ(got.bytes_sent_shm, want.bytes_sent_shm) << what;
  EXPECT_EQ(got.bytes_received_shm, want.bytes_received_shm) << what;
  EXPECT_EQ(got.bytes_sent_comm, want.bytes_sent_comm) << what;
  EXPECT_EQ(got.bytes_received_comm, want.bytes_received_comm) << what;
}

struct Variant {
  std::string what;
  Layout a, b;
  TransitionOptions opt;
};

// Every variant from the same source values on every rank of `world`: each destination must
// equal the truth and, byte for byte, the first variant's. Chunks of 320 bytes split rows
// (64 f32 = 256 bytes) and messages (up to budget/4) into many pieces.
void run_variants(const StateSpace& space, const std::vector<Variant>& variants, int64_t budget,
                  const std::function<void(TransferPlan&)>& edit = {}) {
  const int world = variants.at(0).a.world();
  RouterOptions ro;
  ro.budget_bytes = budget;
  int64_t shm_total = 0;
  for (const Variant& v : variants) {
    TransferPlan p = transition(space, v.a, v.b, ro);
    for (int r = 0; r < world; ++r)
      shm_total += expected(p, v.a, v.b, r, v.opt.shared_memory).bytes_sent_shm;
  }
  ASSERT_GT(shm_total, 0) << "no variant takes the shared-memory path";
  test::RunResult result = test::run_ranks(world, [&](test::RankContext& ctx) {
    test::RankWorld w = test::gloo_world(ctx, "router", milliseconds(30'000));
    const int r = ctx.rank();
    std::vector<std::vector<core::Tensor>> outs;
    for (const Variant& v : variants) {
      TransferPlan plan = transition(space, v.a, v.b, ro);
      if (edit) edit(plan);
      std::vector<core::Tensor> src = allocate_locals(v.a.ranks[size_t(r)]);
      fill(space, v.a.ranks[size_t(r)], src);
      TransitionStats st;
      outs.push_back(run_transition(plan, v.a, v.b, r, src, *w.comm, v.opt, &st));
      EXPECT_EQ(mismatches(space, v.b.ranks[size_t(r)], outs.back()), 0)
          << v.what << ", rank " << r;
      expect_moved(st, expected(plan, v.a, v.b, r, v.opt.shared_memory), v.what);
      for (size_t l = 0; l < outs.back().size(); ++l) {
        const core::Tensor &x = outs.back()[l], &y = outs[0][l];
        ASSERT_EQ(x.nbytes(), y.nbytes());
        EXPECT_EQ(std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()), 0)
            << v.what << " differs from " << variants[0].what << " in local " << l;
      }
    }
  });
  EXPECT_TRUE(result.ok()) << result.summary();
}

struct Case {
  const char* name;
  bool moe;
  Degrees from, to;
  int64_t budget;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class RouterShm : public ::testing::TestWithParam<Case> {};

// The transitions of router_exec_test, each four ways: one host through shared memory, two
// hosts (shared memory within, Gloo across, in the same rounds), one host with shared memory
// off, and every rank its own host.
TEST_P(RouterShm, SharedMemoryAndGlooMoveBitwiseTheSameBytes) {
  const Case& c = GetParam();
  core::JobSpec spec = tiny_spec(c.moe);
  StateSpace space = space_for(spec);
  auto [a, b] = layouts(space, spec, c.from, c.to);
  ASSERT_EQ(a.world(), 4);
  TransitionOptions shm;
  shm.shm_chunk_bytes = 320;
  TransitionOptions off = shm;
  off.shared_memory = false;
  const std::vector<int> one(4, 0), two{0, 0, 1, 1};
  run_variants(space,
               {{"one host, shared memory", on_hosts(a, one), on_hosts(b, one), shm},
                {"two hosts", on_hosts(a, two), on_hosts(b, two), shm},
                {"one host, shared memory off", on_hosts(a, one), on_hosts(b, one), off},
                {"own hosts", a, b, shm}},
               c.budget);
}

INSTANTIATE_TEST_SUITE_P(
    Transitions, RouterShm,
    ::testing::Values(Case{"Dp2Tp2ToPp2Dp2", false, {2, 2, 1, 1, 0}, {2, 1, 2, 1, 0}, 8192},
                      Case{"Dp2Tp2ToDp4Zero1", false, {2, 2, 1, 1, 0}, {4, 1, 1, 1, 1}, 1 << 16},
                      Case{"FourRanksShrinkToOne", false, {1, 4, 1, 1, 0}, {}, 1 << 20},
                      Case{"MoeEp2ToEp4", true, {1, 1, 1, 2, 0}, {1, 1, 1, 4, 0}, 1 << 14}),
    [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

// Random layouts (uneven grids, flat shards, replicas; some boxes identical on a rank, so
// some tensors are adopted) on one and on two hosts.
TEST(RouterShmRandom, RandomLayoutsMatchTheCommunicatorsBytes) {
  for (uint64_t seed : {3u, 11u}) {
    std::mt19937_64 rng(seed);
    StateSpace space = random_space(rng, 6);
    for (int hosts : {1, 2}) {
      Layout a = random_layout(rng, space, 4, hosts), b = random_layout(rng, space, 4, hosts);
      TransitionOptions shm;
      shm.shm_chunk_bytes = 100;
      TransitionOptions off = shm;
      off.shared_memory = false;
      SCOPED_TRACE("seed " + std::to_string(seed) + ", hosts " + std::to_string(hosts));
      run_variants(space, {{"shared memory", a, b, shm}, {"communicator", a, b, off}}, 4096);
    }
  }
}

// Survivors adopt: every B tensor of ranks 0 and 1 is the A tensor itself (same storage),
// nothing is copied or sent. With ZeRO-1 on the way the parameters are still adopted and the
// moments, now shards, are copied locally.
void run_adoption(Degrees from, Degrees to, bool all_adopted) {
  core::JobSpec spec = tiny_spec(false);
  StateSpace space = space_for(spec);
  auto [a0, b0] = layouts(space, spec, from, to);
  const std::vector<int> one(size_t(a0.world()), 0);
  const Layout a = on_hosts(a0, one), b = on_hosts(b0, one);
  const TransferPlan plan = transition(space, a, b);
  EXPECT_EQ(plan.bytes_remote(), 0);
  test::RunResult result = test::run_ranks(a.world(), [&](test::RankContext& ctx) {
    test::RankWorld w = test::gloo_world(ctx, "router", milliseconds(30'000));
    const int r = ctx.rank();
    const RankLayout& rb = b.ranks[size_t(r)];
    std::vector<core::Tensor> src = allocate_locals(a.ranks[size_t(r)]);
    fill(space, a.ranks[size_t(r)], src);
    std::vector<void*> before;
    for (const core::Tensor& t : src) before.push_back(t.raw_data());
    const std::vector<int> adopt = adopted_locals(plan, a, b, r);
    TransitionStats st;
    std::vector<core::Tensor> dst = run_transition(plan, a, b, r, src, *w.comm, {}, &st);
    EXPECT_EQ(mismatches(space, rb, dst), 0);
    int64_t adopted = 0, copied = 0;
    for (size_t l = 0; l < dst.size(); ++l) {
      if (all_adopted) {
        EXPECT_GE(adopt[l], 0) << "local " << l;
      }
      if (adopt[l] >= 0) {
        EXPECT_EQ(dst[l].raw_data(), before[size_t(adopt[l])]) << "local " << l;
        adopted += rb.locals[l].bytes();
      }
    }
    for (const Transfer& t : plan.transfers)
      if (t.dst == r && adopt[size_t(rb.boxes[size_t(t.dst_box)].local)] < 0) copied += t.bytes;
    for (const core::Tensor& s : src) EXPECT_FALSE(s.defined());
    EXPECT_EQ(st.bytes_adopted, adopted);
    EXPECT_EQ(st.bytes_copied, copied);
    if (r < 2) {
      EXPECT_GT(st.bytes_adopted, 0);
    }
    if (all_adopted) {
      EXPECT_EQ(st.bytes_copied, 0);
    }
    if (!all_adopted && r < 2) {
      EXPECT_GT(st.bytes_copied, 0);
    }
    expect_moved(st, TransitionStats{}, "nothing between ranks");
  });
  EXPECT_TRUE(result.ok()) << result.summary();
}

TEST(RouterAdopt, Dp4ToDp2SurvivorsKeepEveryTensor) {
  run_adoption({4, 1, 1, 1, 0}, {2, 1, 1, 1, 0}, true);
}

TEST(RouterAdopt, Dp2ToDp2Zero1AdoptsParametersAndCopiesShards) {
  run_adoption({2, 1, 1, 1, 0}, {2, 1, 1, 1, 1}, false);
}

// ---- hand-built layouts: one f32 state -------------------------------------------------------

// Rows of a [300, 77] state to columns on two ranks of one host: each rank sends the other
// 150 x 38 or 39 floats (rows of 308 bytes) in one round, both directions at once through
// 3 slots of 1 KiB (deadlocks if one direction waited for the other); then a round of
// empty messages both ways, which neither transport may wait on.
TEST(RouterShmMessages, LargerThanAChunkBothWaysAndEmpty) {
  StateSpace space = one_state({300, 77});
  Layout a, b;
  a.ranks.resize(2), b.ranks.resize(2);
  a.hosts = b.hosts = {0, 0};
  hold(a, 0, {0, 0}, {150, 77}), hold(a, 1, {150, 0}, {150, 77});
  hold(b, 0, {0, 0}, {300, 38}), hold(b, 1, {0, 38}, {300, 39});
  TransitionOptions shm;
  shm.shm_chunk_bytes = 1000, shm.shm_slots = 3;
  TransitionOptions off = shm;
  off.shared_memory = false;
  const TransferPlan plan = transition(space, a, b, RouterOptions{1 << 20});
  ASSERT_EQ(plan.rounds(), 1);
  ASSERT_EQ(plan.waves[0].rounds[0].messages.size(), 2u);
  EXPECT_GT(plan.waves[0].rounds[0].messages[0].bytes, 10 * 1024);
  run_variants(space, {{"shared memory", a, b, shm}, {"communicator", a, b, off}}, 1 << 20,
               [](TransferPlan& p) {
                 p.waves[0].rounds.push_back(Round{{Message{0, 1, {}, 0}, Message{1, 0, {}, 0}}});
               });
}

// The /dev/shm names of the router segments created by the pids in `dir` (one file per rank).
std::vector<std::string> shm_left(const fs::path& dir) {
  std::vector<std::string> left;
  for (const auto& f : fs::directory_iterator(dir)) {
    std::ifstream in(f.path());
    std::string pid;
    in >> pid;
    const std::string prefix = "weft-router-" + pid + "-";
    for (const auto& e : fs::directory_iterator("/dev/shm"))
      if (e.path().filename().string().rfind(prefix, 0) == 0) left.push_back(e.path().string());
  }
  return left;
}

void write_file(const fs::path& p, const std::string& text) { std::ofstream(p) << text; }

// The shared-memory setup is collective: a rank that reaches the move first waits there for
// the last one, and its stats say so (the router's debug line shows, rank by rank, how far
// apart the ranks reached the move). Rank 1 calls run_transition 300 ms after rank 0 said it
// was calling it (steady_clock is the machine's monotonic clock, the same in both
// processes); rank 0's setup cannot end before rank 1 took part: it lasts the 300 ms less
// what rank 0 did between saying so and starting it (microseconds, unless it is descheduled
// there: half of the 300 ms is allowed for that on a loaded machine, where a setup that did
// not wait takes a few ms), and its parts of the wall time add up to no more than the wall
// time.
TEST(RouterShmStats, SetupLastsUntilTheLastRankReachesTheMove) {
  StateSpace space = one_state({256, 64});
  Layout a, b;
  a.ranks.resize(2), b.ranks.resize(2);
  a.hosts = b.hosts = {0, 0};
  hold(a, 0, {0, 0}, {128, 64}), hold(a, 1, {128, 0}, {128, 64});
  hold(b, 0, {0, 0}, {256, 32}), hold(b, 1, {0, 32}, {256, 32});
  const TransferPlan plan = transition(space, a, b, RouterOptions{1 << 20});
  char tmpl[] = "/tmp/weft-router-late-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const fs::path calling = fs::path(tmpl) / "rank0-calling";
  constexpr double kLate = 0.3;
  test::RunResult result = test::run_ranks(2, [&](test::RankContext& ctx) {
    test::RankWorld w = test::gloo_world(ctx, "router", milliseconds(30'000));
    const int r = ctx.rank();
    std::vector<core::Tensor> src = allocate_locals(a.ranks[size_t(r)]);
    fill(space, a.ranks[size_t(r)], src);
    using Clock = std::chrono::steady_clock;
    if (r == 0) {
      write_file(calling.string() + ".tmp",
                 std::to_string(Clock::now().time_since_epoch().count()));
      fs::rename(calling.string() + ".tmp", calling);
    } else {
      while (!fs::exists(calling)) std::this_thread::sleep_for(milliseconds(1));
      std::ifstream in(calling);
      long long t0 = 0;
      in >> t0;
      std::this_thread::sleep_until(Clock::time_point(Clock::duration(t0)) +
                                    std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(kLate)));
    }
    TransitionStats st;
    std::vector<core::Tensor> dst = run_transition(plan, a, b, r, src, *w.comm, {}, &st);
    EXPECT_EQ(mismatches(space, b.ranks[size_t(r)], dst), 0) << "rank " << r;
    EXPECT_GT(st.bytes_received_shm, 0) << "rank " << r;
    EXPECT_LE(st.seconds_setup + st.seconds_local_copy + st.seconds_packing +
                  st.seconds_unpacking,
              st.seconds + 1e-9)
        << "rank " << r;
    if (r == 0) {
      EXPECT_GE(st.seconds_setup, kLate / 2) << "rank 0 set up before rank 1 reached the move";
    }
  });
  EXPECT_TRUE(result.ok()) << result.summary();
  fs::remove_all(tmpl);
}

// Rank 0 holds a [3 * 256Ki] f32 state whole and sends each of ranks 1..3 one third (1 MiB,
// 16 chunks of 64 KiB) in rounds 0, 1, 2. After its second chunk rank 0 either dies
// (SIGKILL) or stops until the others have given up. The others must throw a CommError
// naming rank 0 (PeerLostError or TimeoutError; TimeoutError when it is alive) within the
// 3 s timeout, and no segment of any rank may stay in /dev/shm.
void run_lost_peer(bool kill) {
  const int64_t m = int64_t(256) << 10;
  StateSpace space = one_state({3 * m});
  Layout a, b;
  a.ranks.resize(4), b.ranks.resize(4);
  a.hosts = b.hosts = {0, 0, 0, 0};
  hold(a, 0, {0}, {3 * m});
  for (int q = 1; q < 4; ++q) hold(b, q, {(q - 1) * m}, {m});
  const TransferPlan plan = transition(space, a, b, RouterOptions{int64_t(64) << 20});
  ASSERT_EQ(plan.rounds(), 3);
  char tmpl[] = "/tmp/weft-router-shm-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const fs::path dir = tmpl, pids = dir / "pids", gave_up = dir / "gave_up";
  fs::create_directories(pids), fs::create_directories(gave_up);
  test::RunOptions ro;
  ro.deadline = milliseconds(50'000);
  test::RunResult result = test::run_ranks(
      4,
      [&](test::RankContext& ctx) {
        const int r = ctx.rank();
        write_file(pids / std::to_string(r), std::to_string(::getpid()));
        test::RankWorld w = test::gloo_world(ctx, "router", milliseconds(3'000));
        std::vector<core::Tensor> src = allocate_locals(a.ranks[size_t(r)]);
        fill(space, a.ranks[size_t(r)], src);
        TransitionOptions opt;
        opt.shm_chunk_bytes = int64_t(64) << 10;
        if (r == 0)
          opt.on_progress = [&](const TransitionStats& st) {
            if (st.bytes_sent_shm < 2 * opt.shm_chunk_bytes) return;
            if (kill) ::raise(SIGKILL);
            // Stuck, not dead: wait until every other rank gave up (bounded by the deadline).
            while (std::distance(fs::directory_iterator(gave_up), fs::directory_iterator()) < 3)
              std::this_thread::sleep_for(milliseconds(10));
          };
        try {
          run_transition(plan, a, b, r, src, *w.comm, opt);
          if (r != 0) ADD_FAILURE() << "rank " << r << " finished although rank 0 did not send";
        } catch (const CommError& e) {
          if (r != 0) {
            EXPECT_NE(std::string(e.what()).find("rank 0"), std::string::npos) << e.what();
            if (!kill) {
              EXPECT_NE(dynamic_cast<const TimeoutError*>(&e), nullptr) << e.what();
            }
            write_file(gave_up / std::to_string(r), e.what());
          }
        }
      },
      ro);
  for (int r = 1; r < 4; ++r) EXPECT_TRUE(result.ranks[size_t(r)].ok()) << result.summary();
  if (kill) {
    EXPECT_EQ(result.ranks[0].status, test::RankStatus::kSignaled) << result.summary();
  } else {
    EXPECT_TRUE(result.ranks[0].ok()) << result.summary();
  }
  EXPECT_EQ(std::distance(fs::directory_iterator(gave_up), fs::directory_iterator()), 3);
  EXPECT_EQ(shm_left(pids), std::vector<std::string>{});
  fs::remove_all(dir);
}

TEST(RouterShmFailure, PeerKilledMidTransferFailsTheOthers) { run_lost_peer(true); }

TEST(RouterShmFailure, StuckPeerTimesTheOthersOut) { run_lost_peer(false); }

}  // namespace
}  // namespace weft::parallel
