// The executor's building blocks on one process: region copies between strided pieces, shard
// views, parameter pieces seeded like the whole model, and the refusal of an invalid plan.
#include <gtest/gtest.h>

#include "base/error.h"
#include "comm/registry.h"
#include "core/exec/executor.h"
#include "core/models/gpt.h"
#include "parallel/executor.h"
#include "parallel/process_groups.h"
#include "parallel/regions.h"
#include "planner/planner.h"
#include "tests/parallel/layout_harness.h"

namespace weft::parallel {
namespace {

using planner::Box;
using planner::DimSlice;

core::Tensor iota(const core::Shape& s) {
  std::vector<float> v(size_t(core::shape_numel(s)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(i);
  return core::Tensor::from_vector<float>(s, v);
}

TEST(Regions, CopiesStridedChunksOfAGlobalValue) {
  // A (2, 12) value; the piece holds columns {1,2} + {5,6} + {9,10}: the qkv layout of head 1
  // of 2 with d = 2 (three strided chunks).
  core::Tensor full = iota({2, 12});
  Box fb = planner::full_box({2, 12});
  Box piece{DimSlice{0, 2, 1, 0}, DimSlice{1, 2, 3, 4}};
  core::Tensor local = core::Tensor::zeros({2, 6}, core::DType::kF32);
  copy_region(local, piece, full, fb, piece);
  EXPECT_EQ(local.to_vector<float>(),
            (std::vector<float>{1, 2, 5, 6, 9, 10, 13, 14, 17, 18, 21, 22}));
  // Back, accumulating, into a row-range piece of another tensor.
  core::Tensor back = core::Tensor::zeros({1, 12}, core::DType::kF32);
  Box row1{DimSlice{1, 1, 1, 0}, DimSlice{0, 12, 1, 0}};
  Box region{DimSlice{1, 1, 1, 0}, DimSlice{1, 2, 3, 4}};
  copy_region(back, row1, local, piece, region, true);
  copy_region(back, row1, local, piece, region, true);
  EXPECT_EQ(back.to_vector<float>(),
            (std::vector<float>{0, 26, 28, 0, 0, 34, 36, 0, 0, 42, 44, 0}));
  // A region outside either piece is refused.
  EXPECT_THROW(copy_region(local, piece, full, fb, fb), InternalError);
}

TEST(Regions, ShardViewSharesTheRootStorage) {
  core::Tensor root = iota({4, 3});
  Box rb = planner::full_box({4, 3});
  core::Tensor shard = sub_view(root, rb, Box{DimSlice{2, 2, 1, 0}, DimSlice{0, 3, 1, 0}});
  EXPECT_EQ(shard.to_vector<float>(), (std::vector<float>{6, 7, 8, 9, 10, 11}));
  shard.fill_(-1);
  EXPECT_EQ(root.item_at(6), -1);
  EXPECT_EQ(root.item_at(5), 5);
  EXPECT_THROW(sub_view(root, rb, Box{DimSlice{0, 1, 2, 2}, DimSlice{0, 3, 1, 0}}), NotSupported);
}

TEST(Regions, ParameterPiecesEqualTheWholeModelsInit) {
  core::JobSpec spec = test::layout_spec({"gpt-layout.yaml", 1, {}, 6, 0});
  core::ModelGraph mg = core::build_model(spec.model, 1);
  core::GraphExecutor ex(mg.graph);
  core::init_parameters(mg, ex, 99);
  int qkv = mg.graph.find_value("h.3.attn.qkv.weight");  // (3C, C)
  const core::Value& v = mg.graph.value(qkv);
  // Head 1 of 4 of every q, k, v block, columns 8..23: a strided tp x ZeRO-like piece.
  const int64_t C = v.shape[1], d = C / 4;
  Box box{DimSlice{d, d, 3, C}, DimSlice{8, 16, 1, 0}};
  core::Tensor piece = core::Tensor::empty(planner::box_shape(box), core::DType::kF32);
  init_parameter_piece(piece, box, v, 99);
  core::Tensor expect = core::Tensor::empty(planner::box_shape(box), core::DType::kF32);
  copy_region(expect, box, ex.tensor(qkv), planner::full_box(v.shape), box);
  EXPECT_EQ(piece.to_vector<float>(), expect.to_vector<float>());
}

TEST(RankExecutor, RefusesAPlanThatFailsValidation) {
  core::JobSpec spec = test::layout_spec({"gpt-layout.yaml", 1, {"parallel.dp=1"}, 6, 0});
  core::ModelGraph mg = planner::build_planning_graph(spec);
  planner::Plan plan = planner::make_plan(spec, mg.graph, 1);
  comm::CommOptions o;
  o.rank = 0;
  o.size = 1;
  auto world = comm::make_communicator(comm::BackendKind::kLoopback, o);
  ProcessGroups groups(*world, plan);
  EXPECT_NO_THROW(RankExecutor(plan, mg.graph, 0, *world, groups));
  // Drop the first compute: its outputs are then read before anything writes them.
  auto& prog = plan.roles.at(0).program;
  for (size_t i = 0; i < prog.size(); ++i)
    if (prog[i].kind == planner::InstrKind::kCompute) {
      prog.erase(prog.begin() + long(i));
      break;
    }
  EXPECT_THROW(RankExecutor(plan, mg.graph, 0, *world, groups), InternalError);
}

}  // namespace
}  // namespace weft::parallel
