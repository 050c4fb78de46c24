// The plan file: JSON round trip (decisions and costs), costs apart from decisions, and
// stale plans refused by their model and shape hashes.
#include <gtest/gtest.h>

#include <cstdio>

#include "planner/plan_json.h"
#include "planner/validate.h"
#include "tests/planner/util.h"

namespace weft::planner {
namespace {

bool same_decisions(const Plan& a, const Plan& b) {
  return a.mesh == b.mesh && a.config.deg == b.config.deg && a.config.chunks == b.config.chunks &&
         a.config.micro_batches == b.config.micro_batches && a.config.schedule == b.config.schedule &&
         a.config.zero == b.config.zero && a.config.recompute == b.config.recompute && a.decisions == b.decisions &&
         a.families == b.families && a.roles == b.roles && a.model_hash == b.model_hash &&
         a.shape_hash == b.shape_hash;
}

TEST(PlanJson, RoundTripKeepsEveryDecision) {
  for (bool moe : {false, true}) {
    core::JobSpec s = moe ? test_util::moe_spec(4, 2) : test_util::gpt_spec(2);
    s.parallel.tp = 2;
    s.parallel.pp = moe ? 1 : 2;
    s.parallel.ep = moe ? 2 : 1;
    s.parallel.zero = 1;
    s.parallel.recompute = "selective";
    core::ModelGraph mg = build_planning_graph(s);
    Plan p = make_plan(s, mg.graph, moe ? 4 : 8);
    std::string text = plan_to_json(p);
    Plan q = plan_from_json(text);
    EXPECT_TRUE(same_decisions(p, q));
    ASSERT_EQ(q.groups.size(), p.groups.size());
    for (size_t i = 0; i < p.groups.size(); ++i) EXPECT_EQ(q.groups[i].ranks, p.groups[i].ranks);
    EXPECT_EQ(plan_to_json(q), text);  // the second write is byte-identical
    EXPECT_EQ(q.costs.step_s, p.costs.step_s);
    ASSERT_EQ(q.costs.ranks.size(), p.costs.ranks.size());
    EXPECT_EQ(q.costs.ranks[0].peak_bytes, p.costs.ranks[0].peak_bytes);
    EXPECT_TRUE(validate_plan(q, mg.graph).ok);
    // A materialised program is the same from either copy.
    RankProgram a = p.program(p.world() - 1), b = q.program(q.world() - 1);
    EXPECT_EQ(a.program, b.program);
    EXPECT_EQ(a.tensors, b.tensors);
  }
}

TEST(PlanJson, DecisionsAreKeptApartFromCosts) {
  core::JobSpec s = test_util::gpt_spec(2);
  s.parallel.tp = 2;
  core::ModelGraph mg = build_planning_graph(s);
  Plan p = make_plan(s, mg.graph, 2);
  Plan cheap = p;
  cheap.costs.step_s *= 10;
  cheap.costs.model.flops /= 10;
  std::string a = plan_to_json(p), b = plan_to_json(cheap);
  EXPECT_NE(a, b);
  EXPECT_EQ(a.substr(0, a.find("\"costs\"")), b.substr(0, b.find("\"costs\"")));
  EXPECT_TRUE(same_decisions(plan_from_json(a), plan_from_json(b)));
}

TEST(PlanJson, CalibratedRatesByOpSizeRoundTrip) {
  core::JobSpec s = test_util::gpt_spec(2);
  PlanOptions o;
  o.cost.flops_by_size = {{1e6, 2e9}, {1e9, 4.5e10}};
  core::ModelGraph mg = build_planning_graph(s);
  Plan p = make_plan(s, mg.graph, 1, o);
  ASSERT_EQ(p.costs.model.flops_by_size, o.cost.flops_by_size);
  Plan q = plan_from_json(plan_to_json(p));
  EXPECT_EQ(q.costs.model.flops_by_size, o.cost.flops_by_size);
  EXPECT_EQ(plan_to_json(q), plan_to_json(p));
  // A plan written before the field reads as uncalibrated.
  std::string old = plan_to_json(p);
  const size_t at = old.find(",\"flops_by_size\"");
  ASSERT_NE(at, std::string::npos);
  old.erase(at, old.find(']', old.find("]]", at) + 1) + 1 - at);
  EXPECT_TRUE(plan_from_json(old).costs.model.flops_by_size.empty());
}

TEST(PlanJson, FilesRoundTripAndStalePlansAreRefused) {
  core::JobSpec s = test_util::gpt_spec(2);
  core::ModelGraph mg = build_planning_graph(s);
  Plan p = make_plan(s, mg.graph, 2);
  std::string path = ::testing::TempDir() + "/weft_plan_test.json";
  write_plan_file(p, path);
  Plan q = read_plan_file(path);
  std::remove(path.c_str());
  EXPECT_TRUE(same_decisions(p, q));
  EXPECT_NO_THROW(check_plan_matches(q, s, mg.graph));

  core::JobSpec other = s;
  other.model.dim = 128;
  core::ModelGraph mg2 = build_planning_graph(other);
  EXPECT_EQ(test_util::config_error([&] { check_plan_matches(q, other, mg2.graph); }).field(), "plan");
  core::JobSpec bigger = s;
  bigger.train.global_batch = 16;
  core::ModelGraph mg3 = build_planning_graph(bigger);
  ConfigError e = test_util::config_error([&] { check_plan_matches(q, bigger, mg3.graph); });
  EXPECT_NE(std::string(e.what()).find("shapes"), std::string::npos);

  EXPECT_THROW(plan_from_json("{\"format\": \"other\"}"), IoError);
  {
    // An operand's slot is stored in 16 bits (planner/operands.h): one outside them is
    // refused by name, not wrapped around.
    core::JobSpec s = test_util::gpt_spec(2);
    core::ModelGraph mg = build_planning_graph(s);
    std::string text = plan_to_json(make_plan(s, mg.graph, 1));
    const std::string first = "\"in\":[[0,";
    const size_t at = text.find(first);
    ASSERT_NE(at, std::string::npos);
    text.replace(at, first.size(), "\"in\":[[40000,");
    try {
      plan_from_json(text);
      FAIL() << "a slot of 40000 was accepted";
    } catch (const IoError& e) {
      EXPECT_NE(std::string(e.what()).find("operand slot 40000 outside -1..32767"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(plan_from_json("not json"), IoError);
  EXPECT_THROW(read_plan_file("/nonexistent/plan.json"), IoError);
}

}  // namespace
}  // namespace weft::planner
