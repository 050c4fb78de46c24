// Loading into any layout: a checkpoint written under one plan's layout (every rank's
// shard cut from a single-process run's tensors by layout_of(plan, r)) loads under another
// plan's layout into exactly the right slices, and into the single-process trainer, which
// then continues with bitwise the losses of the run that never stopped.
#include <gtest/gtest.h>

#include "planner/planner.h"
#include "tests/checkpoint/ckpt_util.h"

namespace weft::checkpoint {
namespace {

using test_util::TempDir;
using test_util::tiny_job;

struct Degrees {
  int64_t dp = 1, tp = 1, pp = 1, ep = 1, zero = 0;
};

parallel::Layout plan_layout(core::JobSpec s, const parallel::StateSpace& space, Degrees d) {
  s.parallel.dp = d.dp, s.parallel.tp = d.tp, s.parallel.pp = d.pp, s.parallel.ep = d.ep,
  s.parallel.zero = d.zero;
  s.train.micro_batch = 2;
  planner::PlanOptions o;
  o.simulate = false;
  return parallel::layout_of(space, planner::make_plan(s, int(d.dp * d.tp * d.pp * d.ep), o));
}

// Writes the trainer's state as a checkpoint under `from` (all of its ranks' shards).
std::string save_under(const core::JobSpec& spec, core::Trainer& t,
                       const parallel::StateSpace& space, const parallel::Layout& from,
                       const std::string& root) {
  auto whole = test_util::whole_state(t);
  HeldState held;
  for (int r = 0; r < from.world(); ++r) {
    held.ranks.push_back(r);
    held.tensors.push_back(test_util::slice_for(space, from, r, whole));
  }
  return save_checkpoint(root, CheckpointInfo{&spec, t.current_step(), "test layout"}, space, from,
                         held, 3);
}

struct Case {
  std::string name;
  bool moe;
  Degrees from, to;
};

class CheckpointLayouts : public ::testing::TestWithParam<Case> {};

TEST_P(CheckpointLayouts, LoadsIntoExactlyTheRightSlicesAndResumesBitwise) {
  const Case& c = GetParam();
  TempDir dir;
  core::JobSpec spec = tiny_job(c.moe);
  spec.train.global_batch = 8;
  spec.train.micro_batch = 4;
  core::data::TokenDataset data = core::data::TokenDataset::load(spec);
  core::Trainer straight(spec);
  std::vector<double> expect = test_util::train(straight, data, 8);

  core::Trainer t(spec);
  test_util::train(t, data, 5);
  parallel::StateSpace space =
      parallel::StateSpace::from_graph(planner::build_planning_graph(spec).graph);
  parallel::Layout from = plan_layout(spec, space, c.from), to = plan_layout(spec, space, c.to);
  std::string step = save_under(spec, t, space, from, dir.str());
  Metadata m = read_metadata(step, "test");
  EXPECT_GT(m.shards.size(), 1u) << "one shard per writing rank";

  // Every rank of the other layout gets exactly its slices.
  auto whole = test_util::whole_state(t);
  for (int r = 0; r < to.world(); ++r) {
    std::vector<core::Tensor> got = parallel::allocate_locals(to.ranks[size_t(r)]);
    load_checkpoint(step, m, space, to, r, got, "test");
    std::vector<core::Tensor> want = test_util::slice_for(space, to, r, whole);
    for (size_t l = 0; l < got.size(); ++l) {
      const parallel::StateTensor& st = space.at(to.ranks[size_t(r)].locals[l].state);
      if (st.kind == parallel::StateKind::kScalar) {
        int64_t v = got[l].data<int64_t>()[0];
        EXPECT_EQ(v, st.name == parallel::kSeedState ? int64_t(spec.train.seed) : 5) << st.name;
        continue;
      }
      EXPECT_TRUE(test_util::same_bytes(got[l], want[l])) << "rank " << r << " " << st.name;
    }
  }

  // And the single-process trainer resumes from it.
  core::Trainer resumed(spec);
  TrainerCheckpoints ckpt(spec, resumed, dir.str());
  ASSERT_EQ(resumed.current_step(), 5);
  std::vector<double> tail = test_util::train(resumed, data, 8);
  for (size_t i = 0; i < tail.size(); ++i) EXPECT_EQ(tail[i], expect[5 + i]) << "step " << 5 + i;
}

INSTANTIATE_TEST_SUITE_P(
    Pairs, CheckpointLayouts,
    ::testing::Values(Case{"dp2tp2_to_pp2", false, {2, 2, 1, 1, 0}, {1, 1, 2, 1, 0}},
                      Case{"dp2tp2_to_single", false, {2, 2, 1, 1, 0}, {}},
                      Case{"dp2tp2_to_dp4_zero1", false, {2, 2, 1, 1, 0}, {4, 1, 1, 1, 1}},
                      Case{"dp4_zero1_to_tp2_zero3", false, {4, 1, 1, 1, 1}, {2, 2, 1, 1, 3}},
                      Case{"moe_ep2_to_ep4", true, {1, 1, 1, 2, 0}, {1, 1, 1, 4, 0}}),
    [](const auto& info) { return info.param.name; });

TEST(CheckpointLayouts, ALoadReadsOnlyTheRangesItNeeds) {
  // A model large enough for many 1 MiB checksum blocks, saved by one process; the second
  // pipeline stage needs layer 1, the final norm and the tied embedding only.
  TempDir dir;
  core::JobSpec spec = tiny_job();
  spec.model.dim = 256;
  spec.train.micro_batch = 4;
  core::Trainer t(spec);
  parallel::StateSpace space =
      parallel::StateSpace::from_graph(planner::build_planning_graph(spec).graph);
  std::string step = save_under(spec, t, space, plan_layout(spec, space, {}), dir.str());
  Metadata m = read_metadata(step, "test");
  ASSERT_EQ(m.shards.size(), 1u);
  parallel::Layout pp = plan_layout(spec, space, {1, 1, 2, 1, 0});
  std::vector<core::Tensor> got = parallel::allocate_locals(pp.ranks[1]);
  int64_t read = load_checkpoint(step, m, space, pp, 1, got, "test");
  int64_t needed = 0;
  for (const parallel::LocalTensor& l : pp.ranks[1].locals)
    if (space.at(l.state).kind != parallel::StateKind::kScalar) needed += l.bytes();
  EXPECT_GE(read, needed);
  EXPECT_LT(read, m.shards[0].bytes * 3 / 4)
      << "read " << read << " of " << m.shards[0].bytes << " bytes for " << needed << " needed";
}

}  // namespace
}  // namespace weft::checkpoint
