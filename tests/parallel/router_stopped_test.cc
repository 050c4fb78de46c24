// A move stopped midway loses no box: when run_transition throws, the sources a rank has not
// yet released and what arrived of its destinations (its Arrived: whole tensors, and the
// arrived boxes of partly filled ones) together cover the whole state, every element with
// its value. Forked ranks move dp2 ZeRO-1 to dp3 (a join)
// over Gloo, or through shared memory, with a budget small enough for many rounds; the
// newcomer stops after about half of what it receives, until the others have given up on it.
// Then the window each transport must close: the newcomer stalls in a round before it
// receives, while its sender's send completes (Gloo: the bytes in the kernel or the socket
// buffer; shared memory: every chunk in the slots), and the sender goes on to free the
// source; only the acknowledgement (Gloo) or the wait until the slots are drained (shared
// memory) keeps that source held. Last, the window the arrived boxes close: a shrink (dp3 ->
// dp2) whose survivor stops after it copied its own shard into its new, larger one and
// before the rest came; that shard's source is freed, so the partly filled destination holds
// its only copy.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>
#include <tuple>

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

// A partly filled destination's layout: the tensors `done` of B rank `rb` (ascending), the
// locals that `partial` has boxes of (their `local` is rb's index) holding only those.
RankLayout arrived_layout(const RankLayout& rb, const std::vector<int>& done,
                          const std::vector<StateBox>& partial) {
  RankLayout out = only_locals(rb, done);
  std::vector<int> at(rb.locals.size(), -1);
  for (size_t i = 0; i < done.size(); ++i) at[size_t(done[i])] = int(i);
  std::vector<char> part(out.locals.size(), 0);
  for (const StateBox& b : partial) part[size_t(at.at(size_t(b.local)))] = 1;
  std::vector<StateBox> boxes;
  for (const StateBox& b : out.boxes)
    if (!part[size_t(b.local)]) boxes.push_back(b);
  for (StateBox b : partial) {
    b.local = at[size_t(b.local)];
    boxes.push_back(std::move(b));
  }
  std::stable_sort(boxes.begin(), boxes.end(),
                   [](const StateBox& x, const StateBox& y) { return x.local < y.local; });
  out.boxes = std::move(boxes);
  return out;
}

// Copies of `tensors` (rl's locals) that keep only the elements of rl's boxes, zero
// elsewhere: a partly filled destination has arbitrary bytes outside what arrived.
std::vector<core::Tensor> boxes_only(const RankLayout& rl,
                                     const std::vector<core::Tensor>& tensors) {
  std::vector<core::Tensor> out;
  for (const core::Tensor& x : tensors) out.push_back(core::Tensor::zeros(x.shape(), x.dtype()));
  for (const StateBox& b : rl.boxes) {
    const core::Tensor& x = tensors[size_t(b.local)];
    copy_box(out[size_t(b.local)].raw_data(), x.shape(), b.local_start, x.raw_data(), x.shape(),
             b.local_start, b.extent, core::dtype_size(x.dtype()));
  }
  return out;
}

std::string boxes_line(const std::vector<StateBox>& boxes) {
  std::string s;
  for (const StateBox& b : boxes) {
    s += std::to_string(b.local) + " " + std::to_string(b.state) + " " +
         std::to_string(b.start.size()) + " ";
    for (const std::vector<int64_t>* v : {&b.start, &b.extent, &b.local_start})
      for (int64_t x : *v) s += std::to_string(x) + " ";
  }
  return s;
}

std::vector<StateBox> split_boxes(const std::string& line) {
  std::vector<StateBox> out;
  std::istringstream in(line);
  for (StateBox b; in >> b.local >> b.state;) {
    size_t n = 0;
    in >> n;
    for (std::vector<int64_t>* v : {&b.start, &b.extent, &b.local_start}) {
      v->assign(n, 0);
      for (int64_t& x : *v) in >> x;
    }
    out.push_back(b);
  }
  return out;
}

// The join (dp2 ZeRO-1 -> dp3) or shrink (dp3 -> dp2) of these tests, with a 16 KiB budget
// (many rounds).
struct Join {
  StateSpace space;
  Layout a, b;
  TransferPlan plan;
};

Join join_of(bool shared_memory, int from_dp = 2, int to_dp = 3) {
  core::JobSpec spec = tiny_spec();
  spec.train.global_batch = 12;  // divisible by dp2 and dp3 micro-batches
  Join j{space_for(spec), {}, {}, {}};
  std::tie(j.a, j.b) = layouts(j.space, spec, {from_dp, 1, 1, 1, 1}, {to_dp, 1, 1, 1, 1});
  if (shared_memory) j.a.hosts = j.b.hosts = {0, 0, 0};
  j.plan = transition(j.space, j.a, j.b, RouterOptions{int64_t(1) << 14});
  return j;
}

// What the three ranks hold after a stopped move: `with` every piece, `without` the same
// less the partly filled destinations (what was reported before they were); `released`
// counts the sources freed, `arrived` the destinations the stopped rank got whole, `partial`
// the arrived boxes of its partly filled ones.
struct Left {
  Layout with, without;
  int released = 0, arrived = 0, partial = 0;
};

// Runs the move on three forked ranks, rank `stopper` (by default 2, the newcomer of the
// join) failing at a point that `stop_newcomer` sets in its options: it calls `stopped()`
// there, which waits until the others have ended (given up on it, or finished) and throws.
// Then checks that what every rank holds has its values, and returns what they hold.
Left run_stopped_move(
    const Join& j, bool shared_memory, bool acknowledge,
    const std::function<void(TransitionOptions&, std::function<void()>)>& stop_newcomer,
    int stopper = 2) {
  const StateSpace& space = j.space;
  const Layout &a = j.a, &b = j.b;
  char tmpl[] = "/tmp/weft-router-stopped-XXXXXX";
  EXPECT_NE(::mkdtemp(tmpl), nullptr);
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
        opt.shared_memory = shared_memory;
        opt.acknowledge = acknowledge;
        opt.shm_chunk_bytes = 1024;
        opt.shm_slots = 4;  // 4 KiB: a whole message (budget / 4) fits in a channel
        if (r == stopper)
          stop_newcomer(opt, [&] {
            // Stopped: the others give up waiting on it (their timeout), then it fails too.
            while (std::distance(fs::directory_iterator(gave_up), fs::directory_iterator()) < 2)
              std::this_thread::sleep_for(milliseconds(10));
            throw CommError("stopped by the test midway");
          });
        Arrived got;
        try {
          // Returned: the rank holds its whole new layout (`got` is left alone then).
          got.tensors = run_transition(j.plan, a, b, r, src, *w.comm, opt, nullptr, &got);
          got.partial.assign(got.tensors.size(), {});
          std::ofstream(gave_up / std::to_string(r)) << "finished";  // the stopper must not wait
          ASSERT_NE(r, stopper) << "rank " << r << " finished a move it stopped";
        } catch (const CommError& e) {
          if (r != stopper) std::ofstream(gave_up / std::to_string(r)) << e.what();
        }
        // What this rank holds now, each element with its value.
        std::vector<int> kept, done;
        std::vector<core::Tensor> kept_t, done_t;
        std::vector<StateBox> partial;
        for (size_t l = 0; l < src.size(); ++l)
          if (src[l].defined()) kept.push_back(int(l)), kept_t.push_back(src[l]);
        ASSERT_EQ(got.tensors.size(), b.ranks[size_t(r)].locals.size());
        ASSERT_EQ(got.partial.size(), got.tensors.size());
        for (size_t l = 0; l < got.tensors.size(); ++l) {
          if (!got.tensors[l].defined()) {
            EXPECT_TRUE(got.partial[l].empty()) << "boxes of local " << l << " without it";
            continue;
          }
          done.push_back(int(l)), done_t.push_back(got.tensors[l]);
          partial.insert(partial.end(), got.partial[l].begin(), got.partial[l].end());
        }
        const RankLayout mine = arrived_layout(b.ranks[size_t(r)], done, partial);
        EXPECT_EQ(mismatches(space, only_locals(a.ranks[size_t(r)], kept), kept_t), 0);
        EXPECT_EQ(mismatches(space, mine, boxes_only(mine, done_t)), 0);
        std::ofstream(held / std::to_string(r)) << join(kept) << "\n"
                                                << join(done) << "\n"
                                                << boxes_line(partial) << "\n";
      },
      ro);
  EXPECT_TRUE(result.ok()) << result.summary();
  Left left;
  left.with.ranks.resize(3), left.without.ranks.resize(3);
  for (int r = 0; r < 3; ++r) {
    std::ifstream in(held / std::to_string(r));
    std::string a_line, b_line, p_line;
    EXPECT_TRUE(std::getline(in, a_line) && std::getline(in, b_line) && std::getline(in, p_line))
        << "rank " << r;
    const std::vector<int> kept = split(a_line), done = split(b_line);
    const std::vector<StateBox> partial = split_boxes(p_line);
    std::vector<int> whole;  // the destinations that arrived whole
    for (int l : done)
      if (std::none_of(partial.begin(), partial.end(),
                       [&](const StateBox& p) { return p.local == l; }))
        whole.push_back(l);
    left.released += int(a.ranks[size_t(r)].locals.size() - kept.size());
    left.arrived += r == stopper ? int(whole.size()) : 0;
    left.partial += r == stopper ? int(partial.size()) : 0;
    const RankLayout old = only_locals(a.ranks[size_t(r)], kept);
    left.with.ranks[size_t(r)] = merged(old, arrived_layout(b.ranks[size_t(r)], done, partial));
    left.without.ranks[size_t(r)] = merged(old, only_locals(b.ranks[size_t(r)], whole));
  }
  fs::remove_all(dir);
  return left;
}

void run_stopped(bool shared_memory) {
  const Join j = join_of(shared_memory);
  int64_t newcomer_gets = 0;
  for (const Transfer& t : j.plan.transfers)
    if (t.dst == 2 && !t.local()) newcomer_gets += t.bytes;
  ASSERT_GT(j.plan.rounds(), 8);
  const Left left = run_stopped_move(
      j, shared_memory, true, [&](TransitionOptions& opt, std::function<void()> stopped) {
        opt.on_progress = [=](const TransitionStats& st) {
          if (2 * (st.bytes_received_comm + st.bytes_received_shm) >= newcomer_gets) stopped();
        };
      });
  // Together the three ranks hold every box; the old layout alone no longer does.
  EXPECT_GT(left.released, 0) << "no source was freed before the stop: nothing mixed to test";
  EXPECT_GT(left.arrived, 0) << "nothing arrived whole on the newcomer before the stop";
  EXPECT_NO_THROW(check_covers(j.space, left.with));
}

// The first round in which the newcomer receives a message after which its sender frees a
// source (one no destination adopts): the sender's send completes there while the newcomer,
// stalled before its receive, holds nothing of it.
std::pair<int, int> round_before_a_release(const Join& j) {
  for (size_t w = 0; w < j.plan.waves.size(); ++w)
    for (size_t r = 0; r < j.plan.waves[w].rounds.size(); ++r)
      for (const Message& m : j.plan.waves[w].rounds[r].messages) {
        if (m.dst != 2 || m.bytes == 0) continue;
        const std::vector<int> adopt = adopted_locals(j.plan, j.a, j.b, m.src);
        const std::vector<RankOp> ops = rank_ops(j.plan, j.a, j.b, m.src);
        for (size_t i = 0; i < ops.size(); ++i) {
          if (ops[i].kind != RankOp::kWait || ops[i].wave != int(w) || ops[i].round != int(r))
            continue;
          for (size_t k = i + 1; k < ops.size() && ops[k].kind == RankOp::kRelease; ++k)
            if (std::find(adopt.begin(), adopt.end(), ops[k].index) == adopt.end())
              return {int(w), int(r)};
        }
      }
  return {-1, -1};
}

// The newcomer stalls in the round of round_before_a_release, its receive posted, until the
// others have ended; returns whether what the ranks hold then covers the state.
bool stalled_receiver_keeps_everything(bool shared_memory, bool acknowledge) {
  const Join j = join_of(shared_memory);
  const auto [wave, round] = round_before_a_release(j);
  EXPECT_GE(wave, 0) << "no sender frees a source right after a message to the newcomer";
  const Left left = run_stopped_move(j, shared_memory, acknowledge,
                                     [&](TransitionOptions& opt, std::function<void()> stopped) {
                                       opt.before_wait = [=](int w, int r, const Message* in) {
                                         if (w == wave && r == round) {
                                           EXPECT_NE(in, nullptr);
                                           stopped();
                                         }
                                       };
                                     });
  EXPECT_GT(left.released, 0) << "no source was freed before the stall: nothing to lose";
  try {
    check_covers(j.space, left.with);
    return true;
  } catch (const InternalError& e) {
    std::printf("[ gap      ] %s\n", e.what());
    return false;
  }
}

TEST(RouterStopped, AMoveStoppedMidwayOverGlooLeavesEveryBoxOnSomeRank) { run_stopped(false); }

TEST(RouterStopped, AMoveStoppedMidwayThroughSharedMemoryLeavesEveryBoxOnSomeRank) {
  run_stopped(true);
}

// Gloo: the sender's send completes, the newcomer is stopped before its receive did; the
// sender keeps the source until the newcomer acknowledges the message, so it still holds it.
TEST(RouterStopped, AReceiverStoppedBeforeItsReceiveOverGlooLosesNothingToTheAcknowledgement) {
  EXPECT_TRUE(stalled_receiver_keeps_everything(false, true));
}

// The same stall without the acknowledgement: the sender frees the source once its send
// completed, so a box is on no rank (what the test above would find if the window reopened).
TEST(RouterStopped, WithoutTheAcknowledgementTheSameStallOverGlooLosesABox) {
  EXPECT_FALSE(stalled_receiver_keeps_everything(false, false));
}

// Shared memory: every chunk of the message fits in the channel's slots, so the sender's
// part is done at once; it keeps the source because it waits until the newcomer drained them.
TEST(RouterStopped, AReceiverStoppedBeforeItsReceiveThroughSharedMemoryLosesNothingToTheDrain) {
  EXPECT_TRUE(stalled_receiver_keeps_everything(true, true));
}

// The bytes rank 2 receives in the messages of the rounds up to (wave, round), that one's
// included.
int64_t received_through(const Join& j, int wave, int round) {
  int64_t n = 0;
  for (size_t w = 0; w < j.plan.waves.size(); ++w)
    for (size_t r = 0; r < j.plan.waves[w].rounds.size(); ++r) {
      if (std::make_pair(int(w), int(r)) > std::make_pair(wave, round)) return n;
      for (const Message& m : j.plan.waves[w].rounds[r].messages)
        if (m.dst == 2) n += m.bytes;
    }
  return n;
}

// Shared memory: the newcomer fails right after it unpacked the last chunk of the message
// of round_before_a_release (its progress hook throws there, as a transport error could
// while it still waits on its own send). Its sender saw the slots drained and freed the
// source; the newcomer must count that message as arrived, or its boxes are on no rank.
TEST(RouterStopped, AReceiverFailingRightAfterItsLastChunkThroughSharedMemoryReportsIt) {
  const Join j = join_of(true);
  const auto [wave, round] = round_before_a_release(j);
  ASSERT_GE(wave, 0) << "no sender frees a source right after a message to the newcomer";
  const int64_t through = received_through(j, wave, round);
  const Left left =
      run_stopped_move(j, true, true, [&](TransitionOptions& opt, std::function<void()> stopped) {
        opt.on_progress = [=](const TransitionStats& st) {
          if (st.bytes_received_shm >= through) stopped();
        };
      });
  EXPECT_GT(left.released, 0) << "no source was freed before the stop: nothing to lose";
  EXPECT_NO_THROW(check_covers(j.space, left.with));
}

// dp3 -> dp2 ZeRO-1: rank 0's new shard is its old one plus part of rank 1's. Rank 0 stalls
// in the first round in which it receives anything, after its wave's local copies: it has
// copied its own old shard into the new one and freed it, and the rest has not come (its
// sender keeps that part, awaiting the acknowledgement or the drain). The copied boxes are
// then only in the partly filled destination: without them the ranks' holdings leave
// elements on no rank (what a report of whole tensors alone lost); with them every element
// is found, with its value (checked on each rank).
void shrink_stopped_after_a_local_copy(bool shared_memory) {
  const Join j = join_of(shared_memory, 3, 2);
  const Left left = run_stopped_move(
      j, shared_memory, true,
      [&](TransitionOptions& opt, std::function<void()> stopped) {
        opt.before_wait = [=](int, int, const Message* in) {
          if (in) stopped();
        };
      },
      0);
  EXPECT_GT(left.released, 0) << "no source was freed before the stall: nothing to lose";
  EXPECT_GT(left.partial, 0) << "no destination of rank 0 was partly filled at the stall";
  EXPECT_THROW(check_covers(j.space, left.without), InternalError)
      << "the partly filled destinations hold no only copy: the stall misses the window";
  EXPECT_NO_THROW(check_covers(j.space, left.with));
}

TEST(RouterStopped, AShrinkStoppedAfterALocalCopyOverGlooKeepsThePartlyFilledShard) {
  shrink_stopped_after_a_local_copy(false);
}

TEST(RouterStopped, AShrinkStoppedAfterALocalCopyThroughSharedMemoryKeepsThePartlyFilledShard) {
  shrink_stopped_after_a_local_copy(true);
}

}  // namespace
}  // namespace weft::parallel
