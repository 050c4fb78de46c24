// A move stopped midway loses no box: when run_transition throws, the sources a rank has not
// yet released and the destinations that arrived whole (its `finished`) together cover the
// whole state, every element with its value. Forked ranks move dp2 ZeRO-1 to dp3 (a join)
// over Gloo, or through shared memory, with a budget small enough for many rounds; the
// newcomer stops after about half of what it receives, until the others have given up on it.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "base/error.h"
#include "parallel/router.h"
#include "tests/parallel/router_util.h"
#include "tests/support/multiprocess.h"

namespace weft::parallel {
namespace {

namespace fs = std::filesystem;
using namespace test_util;
using std::chrono::milliseconds;

std::string join(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += std::to_string(x) + " ";
  return s;
}

std::vector<int> split(const std::string& line) {
  std::vector<int> out;
  std::istringstream in(line);
  for (int x; in >> x;) out.push_back(x);
  return out;
}

// `x` then `y` as one rank's layout (y's locals after x's).
RankLayout merged(RankLayout x, const RankLayout& y) {
  const int base = int(x.locals.size());
  x.locals.insert(x.locals.end(), y.locals.begin(), y.locals.end());
  for (StateBox b : y.boxes) {
    b.local += base;
    x.boxes.push_back(std::move(b));
  }
  return x;
}

void run_stopped(bool shared_memory) {
  core::JobSpec spec = tiny_spec();
  spec.train.global_batch = 12;  // divisible by dp2 and dp3 micro-batches
  const StateSpace space = space_for(spec);
  auto [a, b] = layouts(space, spec, {2, 1, 1, 1, 1}, {3, 1, 1, 1, 1});
  if (shared_memory) a.hosts = b.hosts = {0, 0, 0};
  const TransferPlan plan = transition(space, a, b, RouterOptions{int64_t(1) << 14});
  int64_t newcomer_gets = 0;
  for (const Transfer& t : plan.transfers)
    if (t.dst == 2 && !t.local()) newcomer_gets += t.bytes;
  ASSERT_GT(plan.rounds(), 8);
  char tmpl[] = "/tmp/weft-router-stopped-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const fs::path dir = tmpl, gave_up = dir / "gave_up", held = dir / "held";
  fs::create_directories(gave_up), fs::create_directories(held);
  test::RunOptions ro;
  ro.deadline = milliseconds(60'000);
  test::RunResult result = test::run_ranks(
      3,
      [&](test::RankContext& ctx) {
        const int r = ctx.rank();
        test::RankWorld w = test::gloo_world(ctx, "router", milliseconds(3'000));
        std::vector<core::Tensor> src = allocate_locals(a.ranks[size_t(r)]);
        fill(space, a.ranks[size_t(r)], src);
        TransitionOptions opt;
        opt.shm_chunk_bytes = 1024;
        opt.shm_slots = 2;
        if (r == 2)
          opt.on_progress = [&](const TransitionStats& st) {
            if (2 * (st.bytes_received_comm + st.bytes_received_shm) < newcomer_gets) return;
            // Stopped: the others give up waiting on it (their timeout), then it fails too.
            while (std::distance(fs::directory_iterator(gave_up), fs::directory_iterator()) < 2)
              std::this_thread::sleep_for(milliseconds(10));
            throw CommError("stopped by the test midway");
          };
        std::vector<core::Tensor> finished;
        try {
          run_transition(plan, a, b, r, src, *w.comm, opt, nullptr, &finished);
          std::ofstream(gave_up / std::to_string(r)) << "finished";  // the newcomer must not wait
          ADD_FAILURE() << "rank " << r << " finished a move the newcomer stopped";
          return;
        } catch (const CommError& e) {
          if (r != 2) std::ofstream(gave_up / std::to_string(r)) << e.what();
        }
        // What this rank holds now, each element with its value.
        std::vector<int> kept, done;
        std::vector<core::Tensor> kept_t, done_t;
        for (size_t l = 0; l < src.size(); ++l)
          if (src[l].defined()) kept.push_back(int(l)), kept_t.push_back(src[l]);
        ASSERT_EQ(finished.size(), b.ranks[size_t(r)].locals.size());
        for (size_t l = 0; l < finished.size(); ++l)
          if (finished[l].defined()) done.push_back(int(l)), done_t.push_back(finished[l]);
        EXPECT_EQ(mismatches(space, only_locals(a.ranks[size_t(r)], kept), kept_t), 0);
        EXPECT_EQ(mismatches(space, only_locals(b.ranks[size_t(r)], done), done_t), 0);
        std::ofstream(held / std::to_string(r)) << join(kept) << "\n" << join(done) << "\n";
      },
      ro);
  EXPECT_TRUE(result.ok()) << result.summary();
  // Together the three ranks hold every box; the old layout alone no longer does.
  Layout left;
  left.ranks.resize(3);
  int released = 0, arrived = 0;
  for (int r = 0; r < 3; ++r) {
    std::ifstream in(held / std::to_string(r));
    std::string a_line, b_line;
    ASSERT_TRUE(std::getline(in, a_line) && std::getline(in, b_line)) << "rank " << r;
    const std::vector<int> kept = split(a_line), done = split(b_line);
    released += int(a.ranks[size_t(r)].locals.size() - kept.size());
    arrived += r == 2 ? int(done.size()) : 0;
    left.ranks[size_t(r)] = merged(only_locals(a.ranks[size_t(r)], kept),
                                   only_locals(b.ranks[size_t(r)], done));
  }
  EXPECT_GT(released, 0) << "no source was freed before the stop: nothing mixed to test";
  EXPECT_GT(arrived, 0) << "nothing arrived whole on the newcomer before the stop";
  EXPECT_NO_THROW(check_covers(space, left));
  fs::remove_all(dir);
}

TEST(RouterStopped, AMoveStoppedMidwayOverGlooLeavesEveryBoxOnSomeRank) { run_stopped(false); }

TEST(RouterStopped, AMoveStoppedMidwayThroughSharedMemoryLeavesEveryBoxOnSomeRank) {
  run_stopped(true);
}

}  // namespace
}  // namespace weft::parallel
