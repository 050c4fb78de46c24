// ZeRO-3 gathers a block at a time (lower_step.cc's gather_block), as FSDP gathers a wrapped
// module's flat parameter: within each unit every parameter is gathered exactly once, and
// the gathers of one block (a transformer layer, the embedding, the final norm) go out as one
// grouped all-gather. The numbers are the layout tests' (LayoutMatrix.Dp2Zero3, one
// process's losses); the bytes are CommVolume's.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "planner/validate.h"
#include "tests/planner/util.h"

namespace weft::planner {
namespace {

TEST(Zero3BlockGather, EachUnitGathersEveryParameterOnceInOneCallPerBlock) {
  core::JobSpec s = test_util::gpt_spec(3, 32, 4, 256, 16);
  s.train.global_batch = 8;
  s.train.micro_batch = 2;
  s.parallel.dp = 2;
  s.parallel.zero = 3;
  const core::ModelGraph mg = build_planning_graph(s);
  const core::Graph& g = mg.graph;
  const Plan plan = make_plan(s, g, 2);
  for (const std::string& e : validate_plan(plan, g).errors) ADD_FAILURE() << e;

  // Each parameter's block: the layer of the forward ops that read it (-1: embedding, norm,
  // head).
  std::map<int, std::set<int>> layers_of;
  for (const core::Op& o : g.ops())
    for (int v : o.inputs)
      if (o.phase == core::Phase::kForward)
        if (g.value(v).role == core::Role::kParameter) layers_of[v].insert(o.layer);
  const size_t params = layers_of.size();

  for (int rank = 0; rank < 2; ++rank) {
    const RankProgram p = plan.program(rank);
    // (stage, micro-batch) -> the parameters gathered in that unit, and its calls.
    std::map<std::pair<Stage, int>, std::multiset<int>> gathered;
    std::map<std::pair<Stage, int>, int> calls;
    for (const Instr& in : p.program) {
      if (in.kind != InstrKind::kCollective || in.part != "zero3.gather") continue;
      EXPECT_EQ(in.coll, CollKind::kAllGather);
      const auto unit = std::make_pair(in.stage, in.mb);
      ++calls[unit];
      std::set<int> blocks;
      for (const Operand& o : in.in) {
        const int v = p.tensors[size_t(o.tensor)].value;
        gathered[unit].insert(v);
        blocks.insert(layers_of.at(v).begin(), layers_of.at(v).end());
      }
      // One call, one block: a layer's parameters, or the layer-less ones (wte, wpe, ln_f).
      EXPECT_EQ(blocks.size(), 1u) << "rank " << rank << ": a call spans blocks";
    }
    // Two micro-batches a rank, each a forward and a backward unit.
    ASSERT_EQ(gathered.size(), 4u) << "rank " << rank;
    for (const auto& [unit, values] : gathered) {
      const std::set<int> distinct(values.begin(), values.end());
      EXPECT_EQ(values.size(), distinct.size()) << "a parameter gathered twice in one unit";
      if (unit.first == Stage::kForward) {
        EXPECT_EQ(distinct.size(), params) << "every parameter is read by the forward";
        // The embedding's (wte, wpe), three layers', the final norm's: five calls, not one
        // per parameter (39 of them).
        EXPECT_EQ(calls[unit], 5) << "rank " << rank << " micro-batch " << unit.second;
      }
      EXPECT_LT(calls[unit], int(distinct.size()));
    }
  }
}

}  // namespace
}  // namespace weft::planner
