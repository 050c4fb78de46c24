// Lowering keeps one copy of each op's sub-ops and shifts it in place from the micro-batch it
// last served to the next one (lower_stage.cc's sub_ops); schedules visit micro-batches out
// of order (1F1B's backward of micro-batch 0 after the forward of 3, interleaved chunks), so
// every shift is relative. Whatever the order, micro-batch m's compute instructions must be
// micro-batch 0's with every batch-cut operand moved m micro-batches along its batch dim (a
// loss's addend m micro-batches on) and every other operand the same.
#include <gtest/gtest.h>

#include <map>
#include <tuple>

#include "planner/planner.h"
#include "tests/planner/util.h"

namespace weft::planner {
namespace {

struct Layout {
  int world, tp, pp, ep;
  std::string schedule;
};

Plan plan_of(const Layout& c, core::ModelGraph& mg) {
  core::JobSpec s = c.ep > 1 ? test_util::moe_spec(4, 2) : test_util::gpt_spec(4);
  s.train.global_batch = 32;
  s.parallel.tp = c.tp, s.parallel.pp = c.pp, s.parallel.ep = c.ep;
  s.parallel.pipeline.schedule = c.schedule;
  if (c.schedule == "interleaved") s.parallel.pipeline.virtual_stages = 2;
  mg = build_planning_graph(s);
  PlanOptions po;
  po.simulate = false;
  return make_plan(s, mg.graph, c.world, po);
}

// How `later` (micro-batch m's operand) relates to `first` (micro-batch 0's): 0 when equal,
// else the micro-batches it is moved by, or -1 when it is not a shift of `first`.
int64_t shifted_by(const Piece& first, const Piece& later) {
  if (first == later) return 0;
  if (first.box.size() != later.box.size() || first.parts != later.parts) return -1;
  int64_t by = -1;
  int moved = 0;
  for (size_t d = 0; d < first.box.size(); ++d) {
    DimSlice a = first.box[d], b = later.box[d];
    if (a == b) continue;
    if (++moved > 1 || a.size != b.size || a.count != b.count || a.stride != b.stride ||
        a.size == 0 || (b.start - a.start) % a.size != 0)
      return -1;
    by = (b.start - a.start) / a.size;
  }
  if (moved == 1) return first.part == later.part ? by : -1;
  return -1;  // a partial sum's addend index alone moves: checked by the caller
}

TEST(MicroBatchShift, EveryMicroBatchComputesMicroBatchZerosOperandsShifted) {
  // tp 2 splits the cross-entropy over the vocabulary (its own parts and edges); ep 2 runs
  // MoE's custom lowering.
  const std::vector<Layout> layouts = {{8, 2, 2, 1, "1f1b"},
                                       {8, 2, 2, 1, "interleaved"},
                                       {8, 1, 4, 1, "gpipe"},
                                       {8, 2, 1, 2, "1f1b"}};
  for (const Layout& c : layouts) {
    SCOPED_TRACE("tp" + std::to_string(c.tp) + " pp" + std::to_string(c.pp) + " ep" +
                 std::to_string(c.ep) + " " + c.schedule);
    core::ModelGraph mg;
    const Plan plan = plan_of(c, mg);
    const int m = int(plan.config.micro_batches);
    ASSERT_GE(m, 4);
    int64_t checked = 0, moved = 0;
    for (const Role& role : plan.roles) {
      // (stage, chunk, recompute, micro-batch) -> its compute instructions in program order.
      std::map<std::tuple<Stage, int, bool, int>, std::vector<const Instr*>> runs;
      for (const Instr& in : role.program)
        if (in.kind == InstrKind::kCompute && in.mb >= 0)
          runs[{in.stage, in.chunk, in.recompute, in.mb}].push_back(&in);
      for (const auto& [key, later] : runs) {
        const auto& [stage, chunk, recompute, mb] = key;
        if (mb == 0) continue;
        const auto first_it = runs.find({stage, chunk, recompute, 0});
        ASSERT_NE(first_it, runs.end());
        const std::vector<const Instr*>& first = first_it->second;
        ASSERT_EQ(first.size(), later.size()) << "micro-batch " << mb;
        for (size_t i = 0; i < first.size(); ++i) {
          const Instr &a = *first[i], &b = *later[i];
          ASSERT_EQ(a.op, b.op);
          ASSERT_EQ(a.part, b.part);
          ASSERT_EQ(a.in.size(), b.in.size());
          ASSERT_EQ(a.out.size(), b.out.size());
          auto expect_shift = [&](const Operand& x, const Operand& y) {
            const TensorDesc &p = role.tensors[size_t(x.tensor)],
                             &q = role.tensors[size_t(y.tensor)];
            EXPECT_EQ(x.slot, y.slot);
            EXPECT_EQ(p.value, q.value);
            const int64_t by = shifted_by(p.piece, q.piece);
            if (by == -1 && p.piece.box == q.piece.box && p.piece.parts == q.piece.parts) {
              // A loss's partial sum over the batch: its addend index moves by one batch
              // part per micro-batch (parts / K, K = data shards x micro-batches).
              const int64_t K = plan.config.data_shards() * m;
              EXPECT_EQ(q.piece.part - p.piece.part, mb * (p.piece.parts / K))
                  << "op %" << a.op << " micro-batch " << mb;
              ++moved;
            } else {
              EXPECT_TRUE(by == 0 || by == mb)
                  << "op %" << a.op << " micro-batch " << mb << ": " << piece_str(p.piece)
                  << " then " << piece_str(q.piece);
              moved += by == mb;
            }
            ++checked;
          };
          for (size_t k = 0; k < a.in.size(); ++k) expect_shift(a.in[k], b.in[k]);
          for (size_t k = 0; k < a.out.size(); ++k) expect_shift(a.out[k], b.out[k]);
        }
      }
    }
    EXPECT_GT(checked, 100);
    EXPECT_GT(moved, checked / 4);  // most operands are activations, cut on the batch
  }
}

}  // namespace
}  // namespace weft::planner
