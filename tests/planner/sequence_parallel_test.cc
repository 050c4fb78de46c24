// Megatron's sequence parallelism as a phase-1 choice only: with parallel.sequence_parallel
// the norms and residual adds split on the sequence over the tp lanes, and the layout search
// of lowering derives the communication by itself: reduce_scatter after each row-parallel
// matmul, all_gather before each column-parallel one, and no activation all_reduce left in
// the layer body; the plan's peak memory per rank drops. The key is refused where it would
// do nothing (tp 1) or cannot split the sequence.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>

#include "planner/memory_estimate.h"
#include "planner/plan_json.h"
#include "planner/policy.h"
#include "planner/search.h"
#include "planner/simulate.h"
#include "planner/validate.h"
#include "tests/planner/util.h"
#include "tests/support/run_weft.h"

namespace weft::planner {
namespace {

using test_util::config_error;

// Activations well above parameters (seq 64, micro-batch 4), so that the memory comparison
// is about what sequence parallelism changes.
core::JobSpec gpt_sp(int64_t tp, int64_t pp, bool sp) {
  core::JobSpec s = test_util::gpt_spec(2 * pp, 64, 4, 256, 64);
  s.train.micro_batch = 4;
  s.train.global_batch = 8;
  s.parallel.tp = tp, s.parallel.pp = pp;
  s.parallel.sequence_parallel = sp;
  return s;
}

core::JobSpec llama_sp(int64_t tp, int64_t pp, bool sp) {
  core::JobSpec s = gpt_sp(tp, pp, sp);
  s.model.arch = "llama";
  s.model.heads = 8;
  s.model.kv_heads = 2;
  return s;
}

struct Built {
  core::ModelGraph mg;
  Plan plan;
  explicit Built(const core::JobSpec& s, int world)
      : mg(build_planning_graph(s)), plan(make_plan(s, mg.graph, world, PlanOptions{})) {}
  const core::Graph& g() const { return mg.graph; }
};

// Conversions of activations (collectives with no custom-rule part, i.e. derived by the
// layout search) on rank 0 for micro-batch 0, counted by kind, for ops inside the layers
// (layer >= 0) or all.
std::map<std::string, int> conversions(const Built& b, bool layers_only, Stage stage) {
  std::map<std::string, int> n;
  for (const Instr& in : b.plan.role_of(0).program) {
    if (in.kind != InstrKind::kCollective || !in.part.empty() || in.stage != stage) continue;
    if (layers_only && b.g().op(in.op).layer < 0) continue;
    if (in.mb != 0) continue;
    if (std::getenv("SP_DUMP"))
      std::printf("%s %s %s %s\n", stage_name(stage), coll_name(in.coll),
                  b.g().op(in.op).type.c_str(),
                  b.g().value(b.g().op(in.op).outputs[0]).name.c_str());
    ++n[coll_name(in.coll)];
  }
  return n;
}

TEST(SequenceParallel, RefusedWhereItWouldDoNothing) {
  core::JobSpec s = gpt_sp(1, 1, true);
  ConfigError e = config_error([&] { core::validate_job_spec(s); });
  EXPECT_EQ(e.field(), "parallel.sequence_parallel");
  EXPECT_NE(std::string(e.what()).find("parallel.tp to 2 or more"), std::string::npos) << e.what();
  // tp auto passes the file's validation; the resolved tp 1 is refused by the planner.
  s.parallel.tp = 0;
  EXPECT_NO_THROW(core::validate_job_spec(s));
  s.parallel.tp = 1;
  e = config_error([&] { resolve_parallel(s, 2); });
  EXPECT_EQ(e.field(), "parallel.sequence_parallel");
  // tp must divide the sequence it splits.
  s = gpt_sp(2, 1, true);
  s.model.seq_len = 63;
  e = config_error([&] { core::validate_job_spec(s); });
  EXPECT_EQ(e.field(), "parallel.sequence_parallel");
  EXPECT_NE(std::string(e.what()).find("model.seq_len (63)"), std::string::npos) << e.what();
  e = config_error([&] { resolve_parallel(s, 2); });
  EXPECT_EQ(e.field(), "parallel.sequence_parallel");
  // Off by default; accepted with tp 2.
  EXPECT_FALSE(resolve_parallel(gpt_sp(2, 1, false), 2).sequence_parallel);
  EXPECT_TRUE(resolve_parallel(gpt_sp(2, 1, true), 2).sequence_parallel);
}

// The key survives the job file's round trip (the run folder's config.yaml, a checkpoint's
// job), as true, false or auto; plan: search without it searches it.
TEST(SequenceParallel, JobFileRoundTrip) {
  core::JobSpec s = gpt_sp(2, 1, true);
  EXPECT_TRUE(core::parse_job_spec(core::job_spec_to_yaml(s), "/").parallel.sequence_parallel);
  s.parallel.sequence_parallel = false;
  EXPECT_FALSE(core::parse_job_spec(core::job_spec_to_yaml(s), "/").parallel.sequence_parallel);
  s.parallel.sequence_parallel_auto = true;
  const std::string yaml = core::job_spec_to_yaml(s);
  EXPECT_NE(yaml.find("sequence_parallel: auto"), std::string::npos) << yaml;
  core::JobSpec back = core::parse_job_spec(yaml, "/");
  EXPECT_TRUE(back.parallel.sequence_parallel_auto);
  EXPECT_TRUE(needs_search(back));
  // Planning it without the search is refused, naming the key.
  EXPECT_EQ(config_error([&] { resolve_parallel(back, 2); }).field(), "parallel.sequence_parallel");
  s.parallel.sequence_parallel_auto = false;
  s.parallel.plan = "search";
  std::string text = core::job_spec_to_yaml(s);
  const std::string line = "  sequence_parallel: false\n";
  const size_t at = text.find(line);
  ASSERT_NE(at, std::string::npos) << text;
  text.erase(at, line.size());
  EXPECT_TRUE(core::parse_job_spec(text, "/").parallel.sequence_parallel_auto);
}

TEST(SequenceParallel, NormsAndResidualsSplitOnTheSequence) {
  for (const core::JobSpec& s : {gpt_sp(2, 1, true), llama_sp(2, 1, true)}) {
    SCOPED_TRACE(s.model.arch);
    Built b(s, 2);
    int norms = 0, adds = 0;
    for (const OpDecision& d : b.plan.decisions) {
      const core::Op& op = b.g().op(d.op);
      std::string sym;
      for (const AxisSplit& a : d.splits)
        if (a.axis == Axis::kTp) sym = a.symbol;
      if (op.type == "layernorm" || op.type == "rmsnorm") {
        ++norms;
        EXPECT_EQ(sym, "t");
      }
      if (op.type == "add") {
        ++adds;
        EXPECT_EQ(sym, "t");
      }
      // The matmuls keep Megatron's column and row splits.
      if (op.type == "linear") {
        EXPECT_TRUE(sym == "n" || sym == "k") << b.g().value(op.outputs[0]).name;
      }
      if (op.type == "matmul") {
        EXPECT_EQ(sym, "n");
      }
    }
    EXPECT_EQ(norms, 2 * 2 + 1);
    EXPECT_EQ(adds, 2 * 2);
  }
}

// The layout search, given the new splits, turns every activation all_reduce of the layer
// body into reduce_scatter + all_gather; without the option the same plan has all_reduces.
TEST(SequenceParallel, LayerBodyCommunicatesByGatherAndScatter) {
  for (bool llama : {false, true}) {
    SCOPED_TRACE(llama ? "llama" : "gpt");
    Built tp(llama ? llama_sp(2, 1, false) : gpt_sp(2, 1, false), 2);
    Built sp(llama ? llama_sp(2, 1, true) : gpt_sp(2, 1, true), 2);
    require_valid(sp.plan, sp.g());
    auto tp_f = conversions(tp, true, Stage::kForward),
         sp_f = conversions(sp, true, Stage::kForward);
    auto sp_b = conversions(sp, true, Stage::kBackward);
    const int layers = 2;
    // Plain tp: one all_reduce after each row-parallel matmul (attention out, MLP out).
    EXPECT_EQ(tp_f["all_reduce"], 2 * layers);
    EXPECT_EQ(tp_f["reduce_scatter"] + tp_f["all_gather"], 0);
    // Sequence parallel: each becomes a reduce_scatter, and each column-parallel input is
    // gathered once per norm output (Llama's q, k and v share theirs).
    EXPECT_EQ(sp_f["all_reduce"], 0);
    EXPECT_EQ(sp_f["reduce_scatter"], 2 * layers);
    EXPECT_EQ(sp_f["all_gather"], 2 * layers);
    // Backward: the mirror (the column inputs' gradients reduce-scattered, the row inputs'
    // gathered) plus the re-gather of each norm output for the weight gradients.
    EXPECT_EQ(sp_b["all_reduce"], 0);
    EXPECT_EQ(sp_b["reduce_scatter"], 2 * layers);
    // (+1: the embedding's backward reads its gradient whole, gathered from the split sum;
    // the gather is attributed to layer 0's residual add, which writes that gradient.)
    EXPECT_EQ(sp_b["all_gather"], 2 * 2 * layers + 1);
    // Outside the layers: the embedding's partial sums are reduce-scattered and the final
    // norm's output gathered for the head, in place of the all_reduce.
    auto sp_all = conversions(sp, false, Stage::kForward);
    EXPECT_EQ(sp_all["all_reduce"], 0);
    EXPECT_EQ(sp_all["reduce_scatter"], 2 * layers + 1);
    EXPECT_EQ(sp_all["all_gather"], 2 * layers + 1);
  }
}

// MoE layers under tp x ep: the router and the experts read the norm's output whole (gathered),
// their partial sums are reduce-scattered into the split residual; the plan validates.
TEST(SequenceParallel, MoeUnderTpAndEp) {
  core::JobSpec s = test_util::moe_spec();
  s.parallel.dp = 1, s.parallel.tp = 2, s.parallel.ep = 2;
  s.parallel.sequence_parallel = true;
  Built b(s, 4);
  require_valid(b.plan, b.g());
  auto f = conversions(b, true, Stage::kForward);
  EXPECT_EQ(f["all_reduce"], 0);
  EXPECT_EQ(f["reduce_scatter"], 2 * 2);
  EXPECT_EQ(f["all_gather"], 2 * 2);
}

// The same volume per rank for the forward's conversions (a ring all_reduce is a
// reduce_scatter then an all_gather), less memory: the residual stream and the norms'
// saved inputs and outputs are 1/tp per rank.
TEST(SequenceParallel, LessPeakMemoryPerRank) {
  for (bool llama : {false, true})
    for (int64_t pp : {1, 2}) {
      SCOPED_TRACE(std::string(llama ? "llama" : "gpt") + " pp" + std::to_string(pp));
      const int world = int(2 * pp);
      Built tp(llama ? llama_sp(2, pp, false) : gpt_sp(2, pp, false), world);
      Built sp(llama ? llama_sp(2, pp, true) : gpt_sp(2, pp, true), world);
      ValidationReport vt = validate_plan(tp.plan, tp.g()), vs = validate_plan(sp.plan, sp.g());
      ASSERT_TRUE(vs.ok) << vs.errors.front();
      ASSERT_TRUE(vt.ok);
      for (int r = 0; r < world; ++r) {
        EXPECT_LT(vs.peak_bytes[size_t(r)], vt.peak_bytes[size_t(r)]) << "rank " << r;
        EXPECT_LT(sp.plan.costs.ranks[size_t(r)].peak_bytes,
                  tp.plan.costs.ranks[size_t(r)].peak_bytes);
        std::printf("%s pp%lld rank %d peak: tp %.3f MiB, tp+sp %.3f MiB\n",
                    llama ? "llama" : "gpt", (long long)pp, r,
                    double(vt.peak_bytes[size_t(r)]) / (1 << 20),
                    double(vs.peak_bytes[size_t(r)]) / (1 << 20));
      }
      // Wire bytes per step on rank 0 by kind: the activation all_reduces become
      // reduce_scatters and all_gathers (what is left of all_reduce: the norms' weight
      // gradients over tp, the cross-entropy's row statistics).
      const RankCost& a = tp.plan.costs.ranks[0];
      const RankCost& c = sp.plan.costs.ranks[0];
      auto k = [](CollKind x) { return size_t(x); };
      EXPECT_LT(c.comm_bytes[k(CollKind::kAllReduce)], a.comm_bytes[k(CollKind::kAllReduce)] / 10);
      EXPECT_GT(c.comm_bytes[k(CollKind::kReduceScatter)], 0);
      EXPECT_GT(c.comm_bytes[k(CollKind::kAllGather)], 0);
      auto total = [&](const RankCost& x) {
        return x.comm_bytes[k(CollKind::kAllReduce)] + x.comm_bytes[k(CollKind::kReduceScatter)] +
               x.comm_bytes[k(CollKind::kAllGather)];
      };
      std::printf(
          "%s pp%lld rank 0 wire bytes/step: tp all_reduce %lld; tp+sp all_reduce %lld, "
          "reduce_scatter %lld, all_gather %lld; total %lld -> %lld; p2p %lld -> %lld\n",
          llama ? "llama" : "gpt", (long long)pp, (long long)a.comm_bytes[k(CollKind::kAllReduce)],
          (long long)c.comm_bytes[k(CollKind::kAllReduce)],
          (long long)c.comm_bytes[k(CollKind::kReduceScatter)],
          (long long)c.comm_bytes[k(CollKind::kAllGather)], (long long)total(a),
          (long long)total(c), (long long)a.p2p_bytes, (long long)c.p2p_bytes);
      // Pipeline transfers carry 1/tp of the sequence.
      if (pp > 1) {
        EXPECT_EQ(sp.plan.costs.ranks[0].p2p_bytes * 2, tp.plan.costs.ranks[0].p2p_bytes);
      }
    }
}

// The key on the command line: weft plan prints it with the other parallel choices and
// carries it in the plan JSON (read back equal); tp 1 exits 2 naming it.
TEST(SequenceParallel, WeftPlanCarriesTheKey) {
  const std::string cfg = "--config " + std::string(WEFT_SOURCE_DIR) + "/configs/gpt-layout.yaml";
  const std::string sets = " --world 2 --set parallel.dp=1 --set parallel.tp=2";
  test::CommandResult r =
      test::run_weft("plan " + cfg + sets + " --set parallel.sequence_parallel=true");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("sequence parallel (norms and residuals split over tp)"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("layernorm by t"), std::string::npos) << r.out;
  const std::string out = (std::filesystem::temp_directory_path() /
                           ("weft_sp_plan_" + std::to_string(::getpid()) + ".json"))
                              .string();
  r = test::run_weft("plan " + cfg + sets + " --set parallel.sequence_parallel=true --out " + out);
  ASSERT_EQ(r.code, 0) << r.out;
  std::ifstream in(out);
  const std::string json((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::filesystem::remove(out);
  EXPECT_NE(json.find("\"sequence_parallel\":true"), std::string::npos);
  Plan back = plan_from_json(json);
  EXPECT_TRUE(back.config.sequence_parallel);
  r = test::run_weft("plan " + cfg +
                     " --world 2 --set parallel.dp=2 --set parallel.sequence_parallel=true");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("parallel.sequence_parallel"), std::string::npos) << r.out;
}

// The search weighs it like any other choice: sequence_parallel: auto costs two candidates
// per tp > 1; off is faster (one all_reduce is cheaper than its reduce_scatter + all_gather,
// and the backward gathers the norms' outputs again), on needs less memory, so it is chosen
// exactly when the cap leaves only it.
TEST(SequenceParallel, SearchChoosesItUnderAMemoryCap) {
  core::JobSpec s = gpt_sp(2, 1, false);
  s.parallel.dp = 1;
  s.parallel.sequence_parallel_auto = true;
  ASSERT_TRUE(needs_search(s));
  SearchOptions opt;
  opt.top = 10;
  SearchResult all = search_plan(s, 2, opt);
  ASSERT_EQ(all.top.size(), 2u);
  const Candidate& fast = all.top[0];
  const Candidate& small = all.top[1];
  EXPECT_FALSE(fast.layout.sequence_parallel);
  EXPECT_TRUE(small.layout.sequence_parallel);
  EXPECT_LT(small.pred.memory_bytes, fast.pred.memory_bytes);
  EXPECT_GT(small.pred.step_s, fast.pred.step_s);
  EXPECT_NE(search_table(all, 2).find("1 x 2 x 1 x 1 sp"), std::string::npos)
      << search_table(all, 2);
  // A cap between the two.
  s.memory.limit_gib =
      (small.pred.memory_bytes + fast.pred.memory_bytes) / 2 / double(int64_t(1) << 30);
  core::JobSpec chosen = searched_spec(s, 2);
  EXPECT_TRUE(chosen.parallel.sequence_parallel);
  EXPECT_FALSE(chosen.parallel.sequence_parallel_auto);
  EXPECT_TRUE(resolve_parallel(chosen, 2).sequence_parallel);
  // The closed-form estimate agrees with the search's.
  EXPECT_LT(estimate_memory(chosen, 2).activations,
            estimate_memory(apply_layout(s, fast.layout), 2).activations);
  // Without the cap: off.
  s.memory.limit_gib = 0;
  EXPECT_FALSE(searched_spec(s, 2).parallel.sequence_parallel);
}

// fit_layout's fallback (elastic.layout: auto) that lowers tp to 1 turns sequence
// parallelism off with it and says so.
TEST(SequenceParallel, FallbackToTpOneTurnsItOff) {
  core::JobSpec s = gpt_sp(2, 1, true);
  s.parallel.dp = 0;
  s.train.micro_batch = 2, s.train.global_batch = 12;  // fits 3 ranks (tp 1) and 4 (tp 2)
  s.elastic.layout = "auto";
  std::string changed;
  core::JobSpec fit = fit_layout(s, 3, &changed);
  EXPECT_EQ(fit.parallel.tp, 1);
  EXPECT_FALSE(fit.parallel.sequence_parallel);
  EXPECT_NE(changed.find("sequence_parallel off"), std::string::npos) << changed;
  // Where tp stays, so does sequence parallelism.
  fit = fit_layout(s, 4, &changed);
  EXPECT_TRUE(fit.parallel.sequence_parallel);
  EXPECT_EQ(changed, "");
}

}  // namespace
}  // namespace weft::planner
