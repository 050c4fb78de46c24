// Expert-parallel MoE as edges: the dispatch and return all_to_all_v exchanges are derived by
// phase 3's pass (a ragged row dim regrouped within the ep team), not written by a rule. The
// derived programs must be the ones the hand rule emitted: every instruction of every MoE op,
// per rank, with its collective (kind, group ranks, data_dependent, dim, bytes) and its
// operands (name, shape, dtype, data_dependent). tests/planner/data/moe_exchanges.txt was
// written by this test at the last commit with the hand rule (StageBuilder::emit_moe's
// collectives) with WEFT_WRITE_MOE_EXCHANGES=<file>; a passing run never rewrites it.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "planner/validate.h"
#include "tests/planner/util.h"

namespace weft::planner {
namespace {

struct Layout {
  std::string name;
  core::JobSpec spec;
  int world;
};

std::vector<Layout> moe_layouts() {
  std::vector<Layout> out;
  auto add = [&](const std::string& name, int world, auto edit, int64_t experts = 4) {
    core::JobSpec s = test_util::moe_spec(experts, 2);
    edit(s.parallel);
    out.push_back({name, s, world});
  };
  using P = core::ParallelSpec;
  add("ep2", 2, [](P& p) { p.ep = 2; });
  add("ep4", 4, [](P& p) { p.ep = 4; });
  add("ep2-dp2", 4, [](P& p) { p.ep = 2; });
  add("ep2-dp2-zero1", 4, [](P& p) { p.ep = 2, p.zero = 1; });
  add("ep2-dp2-zero3", 4, [](P& p) { p.ep = 2, p.zero = 3; });
  add("ep2-tp2", 4, [](P& p) { p.ep = 2, p.tp = 2; });
  add("ep2-pp2", 4, [](P& p) { p.ep = 2, p.pp = 2; });
  add("ep2-tp2-sp", 4, [](P& p) { p.ep = 2, p.tp = 2, p.sequence_parallel = true; });
  add("ep2-recompute", 2, [](P& p) { p.ep = 2, p.recompute = "full"; });
  add(
      "ep4-experts8", 4, [](P& p) { p.ep = 4; }, 8);
  return out;
}

std::string shape_str(const Box& b) {
  std::ostringstream os;
  core::Shape s = box_shape(b);
  for (size_t i = 0; i < s.size(); ++i) os << (i ? "x" : "") << s[i];
  return os.str();
}

std::string operand_str(const Role& r, const Operand& o, const core::Graph& g) {
  const TensorDesc& t = r.tensors.at(size_t(o.tensor));
  std::ostringstream os;
  os << o.slot << ":" << (t.value >= 0 ? g.value(t.value).name : t.name) << ":"
     << shape_str(t.piece.box) << ":" << core::dtype_name(t.dtype)
     << (t.data_dependent ? ":dd" : "") << (o.accumulate ? ":acc" : "");
  return os.str();
}

// One line per instruction of a MoE op (moe or moe.bwd) in program order.
std::vector<std::string> moe_lines(const Plan& plan, const core::Graph& g, int rank) {
  const Role& r = plan.role_of(rank);
  const int dp = plan.mesh.coord(rank).dp;
  std::vector<std::string> out;
  for (const Instr& in : r.program) {
    if (in.op < 0 || (g.op(in.op).type != "moe" && g.op(in.op).type != "moe.bwd")) continue;
    std::ostringstream os;
    os << g.op(in.op).type << " " << int(in.kind) << " " << in.part << " s" << int(in.stage)
       << " mb" << in.mb << (in.recompute ? " rc" : "");
    if (in.kind == InstrKind::kCollective) {
      os << " " << coll_name(in.coll) << " ranks";
      for (int rk : plan.groups.at(size_t(plan.group_id(in.group, dp))).ranks) os << "," << rk;
      os << " dd" << in.data_dependent << " dim" << in.dim << " dim2_" << in.dim2 << " g"
         << in.groups << " bytes" << in.bytes;
    }
    os << " in";
    for (const Operand& o : in.in) os << " " << operand_str(r, o, g);
    os << " out";
    for (const Operand& o : in.out) os << " " << operand_str(r, o, g);
    out.push_back(os.str());
  }
  return out;
}

TEST(MoeEdges, DerivedExchangesAreTheHandRulesInstructionForInstruction) {
  const char* write = std::getenv("WEFT_WRITE_MOE_EXCHANGES");
  std::ofstream dump;
  if (write) dump.open(write);
  std::ifstream f(std::string(WEFT_SOURCE_DIR) + "/tests/planner/data/moe_exchanges.txt");
  std::vector<std::string> want;
  for (std::string line; std::getline(f, line);)
    if (!line.empty() && line[0] != '#') want.push_back(line);
  if (!write) {
    ASSERT_FALSE(want.empty()) << "tests/planner/data/moe_exchanges.txt is missing";
  }
  size_t at = 0, exchanges = 0;
  for (const Layout& l : moe_layouts()) {
    SCOPED_TRACE(l.name);
    core::ModelGraph mg = build_planning_graph(l.spec);
    Plan plan = make_plan(l.spec, mg.graph, l.world);
    ValidationReport v = validate_plan(plan, mg.graph);
    for (const std::string& e : v.errors) ADD_FAILURE() << e;
    for (int rank = 0; rank < plan.world(); ++rank)
      for (const std::string& line : moe_lines(plan, mg.graph, rank)) {
        const std::string got = l.name + " r" + std::to_string(rank) + " " + line;
        exchanges += line.find(" all_to_all_v ") != std::string::npos;
        if (write) {
          dump << got << "\n";
          continue;
        }
        ASSERT_LT(at, want.size()) << "more MoE instructions than the hand rule emitted: " << got;
        EXPECT_EQ(got, want[at]);
        ++at;
      }
  }
  EXPECT_GT(exchanges, 0u);
  if (!write) {
    EXPECT_EQ(at, want.size()) << "fewer MoE instructions than the hand rule emitted";
  }
}

}  // namespace
}  // namespace weft::planner
