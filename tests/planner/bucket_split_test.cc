// One gradient bucket split (planner/buckets.h) for the lowering and the search's stage model:
// for a few layouts (ZeRO-2's per micro-batch among them) the stage model counts as many
// gradient buckets per stage as the lowered program has data-parallel gradient calls, at the
// default bucket_bytes and at another, and
// the layout's bucket_bytes (the job's ParallelConfig's) changes the stage model's count.
#include <gtest/gtest.h>

#include <set>

#include "planner/buckets.h"
#include "planner/lower.h"
#include "planner/planner.h"
#include "planner/policy.h"
#include "planner/stage_cost.h"
#include "tests/planner/util.h"

namespace weft::planner {
namespace {

TEST(BucketSplit, ABucketGoesOutOnceFull) {
  EXPECT_EQ(bucket_count({}, 10), 0);
  EXPECT_EQ(bucket_count({3, 3, 3}, 10), 1);          // one bucket, never full
  EXPECT_EQ(bucket_count({4, 6, 1}, 10), 2);          // full at 10, then the rest
  EXPECT_EQ(bucket_count({25, 1, 25, 4, 5}, 10), 3);  // a tensor past the size fills one alone
}

// make_plan's lowering with the job's ParallelConfig at `bucket_bytes` (no job key sets it:
// the plan file and the code do). The tied parameters' gradient values land in `tied`.
Plan lowered(const core::JobSpec& spec, const core::Graph& g, int world, int64_t bucket_bytes,
             std::set<int>* tied) {
  Plan plan;
  plan.config = resolve_parallel(spec, world);
  plan.config.bucket_bytes = bucket_bytes;
  plan.mesh = Mesh(plan.config.deg, plan.config.order);
  plan.decisions = decide_partitions(g, plan.config);
  GraphInfo gi(g, plan.config, plan.decisions);
  RvdCache cache;
  lower_plan(gi, plan, CostModel{}, cache);
  build_groups(plan);
  for (int p : g.parameters())
    if (gi.param_stages[size_t(p)].size() > 1) tied->insert(gi.grad_value[size_t(p)]);
  return plan;
}

// The data-parallel gradient calls of stage `s`'s first lane: its "grad.sync" collectives,
// less the tied embedding's sum across stages (the step's own call, not bucketed).
int64_t lowered_buckets(const Plan& plan, int s, const std::set<int>& tied) {
  const size_t lanes = plan.roles.size() / size_t(plan.config.deg.pp);
  const Role& r = plan.roles.at(size_t(s) * lanes);
  int64_t n = 0;
  for (const Instr* c :
       test_util::collectives(r, [](const Instr& c) { return c.part == "grad.sync"; })) {
    bool only_tied = true;
    for (const Operand& o : c->in)
      only_tied = only_tied && tied.count(r.tensors[size_t(o.tensor)].value);
    n += only_tied ? 0 : 1;
  }
  return n;
}

// The stage model's count for stage `s`: its chunks' (chunk_grad_buckets).
int64_t model_buckets(const core::JobSpec& spec, const core::Graph& g, const ParallelConfig& pc,
                      int s, int64_t bucket_bytes) {
  const Crossing cross = crossing(pc.deg, pc.order, CostModel{}.ranks_per_node);
  const SplitCosts sc = split_costs(g, CostModel{}, spec.train.global_batch, pc.deg.tp, pc.deg.ep,
                                    pc.micro_batch, cross, pc.sequence_parallel);
  Layout l;
  l.deg = pc.deg, l.zero = pc.zero, l.schedule = pc.schedule;
  l.virtual_stages = pc.virtual_stages, l.micro_batch = pc.micro_batch;
  l.micro_batches = pc.micro_batches, l.bucket_bytes = bucket_bytes;
  for (const auto& c : pc.chunks) l.chunk_layers.push_back(int64_t(c.size()));
  int64_t n = 0, begin = 0;
  for (int c = 0; c < pc.chunk_count(); ++c) {
    const int64_t end = begin + l.chunk_layers[size_t(c)];
    if (pc.chunk_stage(c) == s) n += chunk_grad_buckets(sc, l, c, begin, end);
    begin = end;
  }
  return n;
}

// GPT, 8 layers of width 512: 12.6 MB of parameters a layer in f32, so that the default
// 25 MiB buckets are several per stage.
TEST(BucketSplit, TheStageModelCountsTheLoweringsGradientBuckets) {
  struct Case {
    const char* name;
    int64_t dp, tp, pp, zero;
  };
  const Case cases[] = {{"dp2", 2, 1, 1, 0},
                        {"dp2 x tp2", 2, 2, 1, 0},
                        {"dp2 x pp2", 2, 1, 2, 0},
                        {"dp2 zero1", 2, 1, 1, 1},
                        {"dp2 zero2", 2, 1, 1, 2}};
  for (const Case& k : cases) {
    core::JobSpec spec = test_util::gpt_spec(8, 512, 8, 1024, 16);
    spec.parallel.dp = k.dp, spec.parallel.tp = k.tp, spec.parallel.pp = k.pp;
    spec.parallel.zero = k.zero;
    const int world = int(k.dp * k.tp * k.pp);
    const core::ModelGraph mg = build_planning_graph(spec);
    const ParallelConfig pc = resolve_parallel(spec, world);
    for (const int64_t bucket : {ParallelConfig{}.bucket_bytes, int64_t(4) << 20}) {
      std::set<int> tied;
      const Plan plan = lowered(spec, mg.graph, world, bucket, &tied);
      for (int s = 0; s < int(k.pp); ++s) {
        SCOPED_TRACE(std::string(k.name) + ", " + std::to_string(bucket >> 20) + " MiB, stage " +
                     std::to_string(s));
        const int64_t want = lowered_buckets(plan, s, tied);
        EXPECT_GE(want, 2);  // several buckets, or the comparison would prove little
        // ZeRO-2 reduce-scatters each micro-batch's gradients as soon as they are complete.
        const int64_t rounds = k.zero >= 2 ? pc.micro_batches : 1;
        EXPECT_EQ(model_buckets(spec, mg.graph, pc, s, bucket) * rounds, want);
      }
    }
  }
}

// Before, the stage model split at ParallelConfig{}'s 25 MiB whatever the job's: a smaller
// bucket_bytes must count more buckets, a larger one fewer.
TEST(BucketSplit, TheLayoutsBucketBytesChangesTheStageModelsCount) {
  core::JobSpec spec = test_util::gpt_spec(8, 512, 8, 1024, 16);
  spec.parallel.dp = 2;
  const core::ModelGraph mg = build_planning_graph(spec);
  const ParallelConfig pc = resolve_parallel(spec, 2);
  const int64_t def = model_buckets(spec, mg.graph, pc, 0, ParallelConfig{}.bucket_bytes);
  EXPECT_GT(model_buckets(spec, mg.graph, pc, 0, int64_t(4) << 20), def);
  EXPECT_EQ(model_buckets(spec, mg.graph, pc, 0, int64_t(1) << 30), 1);
  EXPECT_GT(def, 1);
}

}  // namespace
}  // namespace weft::planner
