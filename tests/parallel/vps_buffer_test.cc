// VPS buffers (StateKind::kBuffer): loss_free's per-block routing bias is state outside the
// graph. A loss_free space has one buffer per MoE block after the graph's tensors (their
// StateIds unchanged), every rank's layout holds each buffer whole (so it is replicated
// world-fold and a reshard never moves it between ranks), and buffer_tensor() is a view of
// the balance's live bias.
#include <gtest/gtest.h>

#include <memory>
#include <set>

#include "base/error.h"
#include "core/graph/moe_balance.h"
#include "tests/parallel/vps_util.h"

namespace weft::parallel {
namespace {

using test_util::Degrees;
using test_util::plan_for;

core::JobSpec moe_layout_spec(const std::string& balance) {
  return core::load_job_spec(std::string(WEFT_SOURCE_DIR) + "/configs/moe-layout.yaml",
                             {"model.moe.balance=" + balance, "train.threads=1",
                              "train.eval_every=0", "train.steps=6", "train.warmup_steps=2"});
}

TEST(VpsBuffer, LossFreeSpaceHasOneBiasPerMoeBlockAfterTheGraphsState) {
  core::JobSpec spec = moe_layout_spec("loss_free");
  std::unique_ptr<core::MoeBalance> bal = core::MoeBalance::for_model(spec.model);
  ASSERT_TRUE(bal);
  ASSERT_EQ(bal->mode(), core::MoeBalance::Mode::kLossFree);
  ASSERT_EQ(int64_t(bal->layers().size()), spec.model.layers) << "moe.every = 1";
  core::ModelGraph mg = planner::build_planning_graph(spec);
  StateSpace plain = StateSpace::from_graph(mg.graph);
  StateSpace space = StateSpace::from_graph(mg.graph, bal.get());
  ASSERT_EQ(space.size(), plain.size() + int(bal->layers().size()));

  // The graph's states keep their ids; the buffers follow them, one per block in order.
  size_t next_layer = 0;
  for (const StateTensor& t : space.tensors()) {
    EXPECT_EQ(space.find(t.name), t.id);
    if (t.kind == StateKind::kBuffer) {
      ASSERT_LT(next_layer, bal->layers().size());
      EXPECT_EQ(t.name, core::MoeBalance::bias_name(bal->layers()[next_layer++]));
      EXPECT_EQ(t.shape, core::Shape{spec.model.moe.experts});
      EXPECT_EQ(t.dtype, core::DType::kF32);
      EXPECT_EQ(t.value, -1);
      EXPECT_STREQ(state_kind_name(t.kind), "buffer");
      EXPECT_EQ(plain.find(t.name), -1);
      continue;
    }
    StateId p = plain.find(t.name);
    ASSERT_GE(p, 0) << t.name;
    EXPECT_EQ(plain.at(p).kind, t.kind);
    EXPECT_EQ(plain.at(p).shape, t.shape);
    if (t.kind != StateKind::kScalar) {
      EXPECT_EQ(p, t.id) << t.name << ": a graph state moved";
      EXPECT_EQ(space.of_value(t.value), t.id);
    } else {
      EXPECT_GT(t.id, space.find(core::MoeBalance::bias_name(bal->layers().back())));
    }
  }
  EXPECT_EQ(next_layer, bal->layers().size());
  EXPECT_EQ(space.find("moe.bias:h.0"), plain.size() - 3) << "after the graph's tensors";

  // The single-process layout: each buffer whole on rank 0, local i = state i.
  Layout whole = whole_layout(space);
  check_covers(space, whole);
  for (int l : bal->layers()) {
    StateId id = space.find(core::MoeBalance::bias_name(l));
    const StateBox& b = whole.ranks[0].boxes.at(size_t(id));
    EXPECT_EQ(b.state, id);
    EXPECT_EQ(b.local, id);
    EXPECT_EQ(b.extent, (std::vector<int64_t>{spec.model.moe.experts}));
  }
}

TEST(VpsBuffer, EveryRanksLayoutHoldsEachBufferWholeWithReplicasTheWorld) {
  core::JobSpec spec = moe_layout_spec("loss_free");
  std::unique_ptr<core::MoeBalance> bal = core::MoeBalance::for_model(spec.model);
  const int64_t E = spec.model.moe.experts;
  StateSpace space = StateSpace::from_graph(planner::build_planning_graph(spec).graph, bal.get());
  std::vector<Layout> layouts;
  for (Degrees d : {Degrees{2, 1, 1, 2, 0}, Degrees{1, 2, 2, 1, 0}, Degrees{2, 1, 1, 2, 1},
                    Degrees{2, 1, 1, 1, 0}}) {
    SCOPED_TRACE("dp " + std::to_string(d.dp) + " tp " + std::to_string(d.tp) + " pp " +
                 std::to_string(d.pp) + " ep " + std::to_string(d.ep) + " zero " +
                 std::to_string(d.zero));
    planner::Plan plan = plan_for(spec, d);
    Layout l = layout_of(space, plan);
    check_covers(space, l);
    const int world = l.world();
    for (int layer : bal->layers()) {
      StateId id = space.find(core::MoeBalance::bias_name(layer));
      std::set<int> replicas;
      for (int r = 0; r < world; ++r) {
        const RankLayout& rl = l.ranks[size_t(r)];
        int held = 0;
        for (const StateBox& b : rl.boxes) {
          if (b.state != id) continue;
          ++held;
          EXPECT_EQ(b.start, std::vector<int64_t>{0});
          EXPECT_EQ(b.extent, std::vector<int64_t>{E});
          EXPECT_EQ(b.local_start, std::vector<int64_t>{0});
          EXPECT_EQ(b.replicas, world);
          replicas.insert(b.replica);
          const LocalTensor& lt = rl.locals.at(size_t(b.local));
          EXPECT_EQ(lt.state, id);
          EXPECT_EQ(lt.shape, core::Shape{E});
          EXPECT_EQ(lt.dtype, core::DType::kF32);
          EXPECT_EQ(lt.plan_tensor, -1);
        }
        EXPECT_EQ(held, 1) << "rank " << r << " holds the bias of block " << layer << " once";
      }
      EXPECT_EQ(int(replicas.size()), world);
    }
    layouts.push_back(std::move(l));
  }
  // A reshard between two 4-rank layouts never sends a buffer: every rank holds it already.
  TransferPlan tp = transition(space, layouts[0], layouts[1]);
  int buffer_transfers = 0;
  for (const Transfer& t : tp.transfers)
    if (space.at(t.state).kind == StateKind::kBuffer) {
      ++buffer_transfers;
      EXPECT_TRUE(t.local()) << "a buffer crossed from rank " << t.src << " to " << t.dst;
    }
  EXPECT_EQ(buffer_transfers, 4 * int(bal->layers().size()));
}

TEST(VpsBuffer, OtherBalancesHaveNoBuffers) {
  for (const char* balance : {"aux_loss", "aux_loss_global"}) {
    core::JobSpec spec = moe_layout_spec(balance);
    std::unique_ptr<core::MoeBalance> bal = core::MoeBalance::for_model(spec.model);
    core::ModelGraph mg = planner::build_planning_graph(spec);
    StateSpace a = StateSpace::from_graph(mg.graph), b = StateSpace::from_graph(mg.graph, bal.get());
    EXPECT_EQ(a.size(), b.size()) << balance;
    for (const StateTensor& t : b.tensors()) EXPECT_NE(t.kind, StateKind::kBuffer) << balance;
  }
}

TEST(VpsBuffer, BufferTensorIsAViewOfTheLiveBias) {
  core::JobSpec spec = moe_layout_spec("loss_free");
  std::unique_ptr<core::MoeBalance> bal = core::MoeBalance::for_model(spec.model);
  core::ModelGraph mg = planner::build_planning_graph(spec);
  StateSpace space = StateSpace::from_graph(mg.graph, bal.get());
  const int layer = bal->layers().back();
  const StateTensor& t = space.at(space.find(core::MoeBalance::bias_name(layer)));
  core::Tensor v = buffer_tensor(bal.get(), t);
  v.data<float>()[1] = 0.5f;
  EXPECT_EQ(bal->bias(layer)[1], 0.5f);
  EXPECT_EQ(bal->bias(bal->layers().front())[1], 0.0f);

  EXPECT_THROW(buffer_tensor(nullptr, t), InternalError);
  core::JobSpec global = moe_layout_spec("aux_loss_global");
  std::unique_ptr<core::MoeBalance> g = core::MoeBalance::for_model(global.model);
  EXPECT_THROW(buffer_tensor(g.get(), t), InternalError);
  EXPECT_THROW(buffer_tensor(bal.get(), space.at(0)), InternalError) << "not a buffer";
}

}  // namespace
}  // namespace weft::parallel
