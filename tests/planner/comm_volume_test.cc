// Communication volume per rank over the layout matrix, against the volumes the planner's
// hand-written rules produced (DP sync, ZeRO reduce-scatter and gathers, tied embeddings,
// tp-partial gradients) before phase 3 derived all of them by one dependency-preservation
// pass. tests/planner/data/comm_volumes.txt was written by this test at 1ea5ffa (the last
// commit with those rules) with WEFT_WRITE_COMM_VOLUMES=<file>; it is never rewritten by a
// passing run. A derived plan may move fewer bytes than the rules did (the search can fuse
// two reductions into one), never more.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "planner/validate.h"
#include "tests/planner/util.h"

namespace weft::planner {
namespace {
using test_util::gpt_spec;

struct Layout {
  std::string name;
  core::JobSpec spec;
  int world;
};

std::vector<Layout> layout_matrix() {
  std::vector<Layout> out;
  auto add = [&](const std::string& name, int world, auto edit, core::JobSpec s = gpt_spec(4)) {
    edit(s.parallel);
    out.push_back({name, s, world});
  };
  using P = core::ParallelSpec;
  add("dp2", 2, [](P&) {});
  add("dp4", 4, [](P&) {});
  for (int z = 1; z <= 3; ++z) add("dp2-zero" + std::to_string(z), 2, [z](P& p) { p.zero = z; });
  add("dp4-zero3", 4, [](P& p) { p.zero = 3; });
  add("tp2", 2, [](P& p) { p.tp = 2; });
  add("tp2-dp2", 4, [](P& p) { p.tp = 2; });
  add("tp2-dp2-zero1", 4, [](P& p) { p.tp = 2, p.zero = 1; });
  add("tp2-dp2-zero3", 4, [](P& p) { p.tp = 2, p.zero = 3; });
  add("pp2", 2, [](P& p) { p.pp = 2; });
  add("pp2-dp2", 4, [](P& p) { p.pp = 2; });
  add("pp2-dp2-zero1", 4, [](P& p) { p.pp = 2, p.zero = 1; });
  add("pp2-dp2-zero2", 4, [](P& p) { p.pp = 2, p.zero = 2; });
  add("pp2-tp2-dp2-zero3", 8, [](P& p) { p.pp = 2, p.tp = 2, p.zero = 3; });
  add("pp2-interleaved", 2, [](P& p) { p.pp = 2, p.pipeline.schedule = "interleaved", p.pipeline.virtual_stages = 2; });
  add("pp4-tp2", 8, [](P& p) { p.pp = 4, p.tp = 2; });
  core::JobSpec moe = test_util::moe_spec(4, 2);
  add("ep2", 2, [](P& p) { p.ep = 2; }, moe);
  add("ep2-dp2", 4, [](P& p) { p.ep = 2; }, moe);
  add("ep2-dp2-zero1", 4, [](P& p) { p.ep = 2, p.zero = 1; }, moe);
  add("ep2-tp2", 4, [](P& p) { p.ep = 2, p.tp = 2; }, moe);
  core::JobSpec llama = gpt_spec(2, 64, 8);
  llama.model.arch = "llama";
  llama.model.kv_heads = 2;
  add("llama-tp2-dp2-zero1", 4, [](P& p) { p.tp = 2, p.zero = 1; }, llama);
  return out;
}

// Bytes one rank puts on the wire in a step, by what moves them: ring algorithms (an
// all-reduce is a reduce-scatter plus an all-gather: 2 (n-1)/n of its buffer; the others
// (n-1)/n), and every byte a send carries.
std::map<std::string, double> wire_bytes(const Plan& plan, int rank) {
  std::map<std::string, double> out;
  const Role& r = plan.role_of(rank);
  const int dp = plan.mesh.coord(rank).dp;
  for (const Instr& in : r.program) {
    if (in.kind == InstrKind::kSend) out["send"] += double(in.bytes);
    if (in.kind != InstrKind::kCollective) continue;
    const double n = double(plan.groups.at(size_t(plan.group_id(in.group, dp))).ranks.size());
    if (n < 2) continue;
    const double f = (n - 1) / n * (in.coll == CollKind::kAllReduce ? 2 : 1);
    out[coll_name(in.coll)] += f * double(in.bytes);
  }
  double total = 0;
  for (auto& [k, v] : out) total += v;
  out["total"] = total;
  return out;
}

std::string line_of(const std::string& layout, int rank, const std::map<std::string, double>& w) {
  std::ostringstream os;
  os << layout << " " << rank;
  for (auto& [k, v] : w) os << " " << k << "=" << int64_t(v + 0.5);
  return os.str();
}

std::map<std::string, std::string> golden(const std::string& file = "comm_volumes.txt") {
  std::map<std::string, std::string> out;  // "layout rank" -> line
  std::ifstream f(std::string(WEFT_SOURCE_DIR) + "/tests/planner/data/" + file);
  std::string line;
  while (std::getline(f, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream is(line);
    std::string layout, rank;
    is >> layout >> rank;
    out[layout + " " + rank] = line;
  }
  return out;
}

double field(const std::string& line, const std::string& key) {
  std::istringstream is(line);
  std::string tok;
  while (is >> tok)
    if (tok.rfind(key + "=", 0) == 0) return std::stod(tok.substr(key.size() + 1));
  return 0;
}

// The search minimises predicted time, and these test tensors are tens of KiB: under the
// default model's latency it may rightly fuse two collectives into one that moves more
// bytes. With latency and launch costs at zero, time is bytes over bandwidth.
PlanOptions bandwidth_only() {
  PlanOptions o;
  o.cost.alpha_intra = o.cost.alpha_inter = 0;
  o.cost.launch = o.cost.op_overhead = 0;
  return o;
}

TEST(CommVolume, EveryLayoutMovesNoMoreThanTheHandWrittenRules) {
  const char* write = std::getenv("WEFT_WRITE_COMM_VOLUMES");
  std::ofstream dump;
  if (write) dump.open(write);
  std::map<std::string, std::string> want = golden();
  if (!write) {
    ASSERT_FALSE(want.empty()) << "tests/planner/data/comm_volumes.txt is missing";
  }
  for (const Layout& l : layout_matrix()) {
    SCOPED_TRACE(l.name);
    core::ModelGraph mg = build_planning_graph(l.spec);
    // Bandwidth only: no derived plan may move more than the rules did.
    Plan plan = make_plan(l.spec, mg.graph, l.world, write ? PlanOptions{} : bandwidth_only());
    ValidationReport v = validate_plan(plan, mg.graph);
    for (const std::string& e : v.errors) ADD_FAILURE() << e;
    for (int rank = 0; rank < plan.world(); ++rank) {
      std::map<std::string, double> w = wire_bytes(plan, rank);
      std::string got = line_of(l.name, rank, w);
      if (write) {
        dump << got << "\n";
        continue;
      }
      auto it = want.find(l.name + " " + std::to_string(rank));
      ASSERT_NE(it, want.end()) << "no recorded volume for " << l.name << " rank " << rank;
      EXPECT_LE(w["total"], field(it->second, "total") + 1) << "derived: " << got << "\nrules:   " << it->second;
      // Activations, pipeline traffic and expert dispatch are not changed by the pass over
      // gradients and parameters: their bytes stay exactly what they were.
      for (const char* k : {"send", "all_to_all", "all_to_all_v"})
        EXPECT_EQ(int64_t(w[k] + 0.5), int64_t(field(it->second, k))) << k << "\nderived: " << got
                                                                     << "\nrules:   " << it->second;
      std::printf("%s\n   was %s\n", got.c_str(), it->second.c_str());
    }
  }
}

// The layout matrix's tp layouts with Megatron's sequence parallelism on, against the volumes
// recorded in tests/planner/data/comm_volumes_sp.txt (written by this test at 1126e4c with
// WEFT_WRITE_COMM_VOLUMES_SP=<file>, when SP joined the matrix; never rewritten by a passing
// run): a later plan may move fewer bytes, never more, and exactly the same activations
// between stages and experts. What SP moves against plain tp (printed side by side): each
// all-reduce of a tp-partial activation becomes a reduce-scatter and an all-gather (the same
// ring bytes), the backward gathers each column-parallel input again (its gathered copy is
// dropped after the forward for its memory, as Megatron does: a quarter more activation
// bytes), and the norms' now tp-partial weight gradients are summed over tp.
TEST(CommVolume, SequenceParallelMovesNoMoreThanWhenItJoinedTheMatrix) {
  const char* write = std::getenv("WEFT_WRITE_COMM_VOLUMES_SP");
  std::ofstream dump;
  if (write) dump.open(write);
  const std::map<std::string, std::string> want = golden("comm_volumes_sp.txt");
  if (!write) {
    ASSERT_FALSE(want.empty()) << "tests/planner/data/comm_volumes_sp.txt is missing";
  }
  int layouts = 0;
  for (const Layout& l : layout_matrix()) {
    if (l.spec.parallel.tp < 2) continue;
    ++layouts;
    SCOPED_TRACE(l.name);
    core::JobSpec sp = l.spec;
    sp.parallel.sequence_parallel = true;
    core::ModelGraph mg = build_planning_graph(l.spec), mg_sp = build_planning_graph(sp);
    const Plan plain = make_plan(l.spec, mg.graph, l.world, bandwidth_only());
    const Plan seq = make_plan(sp, mg_sp.graph, l.world, bandwidth_only());
    for (const std::string& e : validate_plan(seq, mg_sp.graph).errors) ADD_FAILURE() << e;
    for (int rank = 0; rank < seq.world(); ++rank) {
      std::map<std::string, double> tp = wire_bytes(plain, rank), w = wire_bytes(seq, rank);
      const std::string got = line_of(l.name + "-sp", rank, w);
      if (write) {
        dump << got << "\n";
        continue;
      }
      auto it = want.find(l.name + "-sp " + std::to_string(rank));
      ASSERT_NE(it, want.end()) << "no recorded volume for " << l.name << "-sp rank " << rank;
      EXPECT_LE(w["total"], field(it->second, "total") + 1) << "now: " << got << "\nthen: " << it->second;
      for (const char* k : {"send", "all_to_all", "all_to_all_v"})
        EXPECT_EQ(int64_t(w[k] + 0.5), int64_t(field(it->second, k))) << k << "\nnow: " << got
                                                                     << "\nthen: " << it->second;
      // Gathers and scatters carry the activations: SP has them wherever tp had a partial
      // activation to all-reduce.
      EXPECT_GT(w["reduce_scatter"], 0) << got;
      std::printf("%s\n   tp %s\n", got.c_str(), line_of(l.name, rank, tp).c_str());
    }
  }
  EXPECT_EQ(layouts, 8);
}

}  // namespace
}  // namespace weft::planner
