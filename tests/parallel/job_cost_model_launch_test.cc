// Every rank of a `weft train` job plans under one cost model, rank 0's choice, whatever the
// others' own machines would give (launch/job_cost_model.h): two ranks whose calibrations
// differ run the same program; a node joining an elastic job with another calibration plans
// every world under the job's; one process plans under its machine's calibration and says so.
// Each rank logs the fingerprint of its plan per world (WEFT_LOG_SUBSYS=planner), compared
// here with the plan this test makes under the job's model, and with the defaults' (which
// must differ, or the test would prove nothing).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>

#include "core/config/job_spec.h"
#include "launch/job_cost_model.h"
#include "planner/hardware.h"
#include "planner/plan_cache.h"
#include "planner/planner.h"
#include "planner/policy.h"
#include "tests/support/live_job.h"
#include "tests/support/test_calibration.h"

namespace weft::test {
namespace {

namespace fs = std::filesystem;
using namespace live;

const std::string kWeft = WEFT_BINARY;
const std::string kOneWorker = " run --standalone --nproc-per-node 1 -- weft train";
const std::string kPlanLog = "WEFT_LOG_LEVEL=debug WEFT_LOG_SUBSYS=planner";

// (the "[rank r]" of the line, the world size) -> the plan fingerprint, from every line of
// `text` that logs one; every such line is also returned in `n`.
std::multimap<std::pair<int, int>, uint64_t> plan_lines(const std::string& text, int* n = nullptr) {
  static const std::regex re(R"(rank (\d+): world of (\d+) ranks plans under .*: plan (\d+))");
  std::multimap<std::pair<int, int>, uint64_t> out;
  for (std::sregex_iterator it(text.begin(), text.end(), re), end; it != end; ++it)
    out.insert({{std::stoi((*it)[1]), std::stoi((*it)[2])}, std::stoull((*it)[3])});
  if (n) *n = int(out.size());
  return out;
}

// The fingerprint of the job's plan for `world` ranks under `model` (as PlanCache makes it).
uint64_t fingerprint(const core::JobSpec& spec, int world, const planner::CostModel& model) {
  planner::PlanCache cache(spec, planner::training_plan_options(model));
  return launch::plan_fingerprint(*cache.plan(world));
}

// The job a worker loads from these `weft train` arguments (its --set overrides).
core::JobSpec job_spec(const std::vector<std::string>& args) {
  std::vector<std::string> sets;
  for (size_t i = 1; i < args.size(); i += 2)
    if (args[i - 1] == "--set") sets.push_back(args[i]);
  return core::load_job_spec(config_path(kLayoutConfig), sets);
}

struct Dir {
  fs::path path;
  explicit Dir(const std::string& name)
      : path(fs::temp_directory_path() /
             ("weft_jobcost_" + name + "_" + std::to_string(::getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
};

// Rank 0's machine is calibrated, rank 1's cache is another machine's description (each
// rank its own $WEFT_COST_CACHE): both plan the tp2 program of rank 0's model and train.
TEST(WeftRun, RanksWithDifferentCalibrationsPlanUnderRankZerosModel) {
  Dir d("two");
  const planner::Hardware cal = cpu_host_calibration();
  planner::write_machine_cache(cal, (d.path / "cache0.yaml").string());
  planner::write_machine_cache(h200_calibration(), (d.path / "cache1.yaml").string());
  const std::vector<std::string> sets = {"parallel.tp=2", "train.steps=3"};
  std::string args;
  for (const std::string& a : train_args(d.path / "out", 3, sets)) args += " '" + a + "'";
  // Each worker picks its own cache by its rank (the launcher's WEFT_RANK).
  const std::string worker = "WEFT_COST_CACHE=" + d.path.string() +
                             "/cache\\$WEFT_RANK.yaml exec " + kWeft + " train" + args;
  CommandResult r = run_command("OMP_NUM_THREADS=1 " + kPlanLog + " " + kWeft +
                                " run --standalone --nproc-per-node 2 -- sh -c \"" + worker + "\"");
  ASSERT_EQ(r.code, 0) << r.out;
  const core::JobSpec spec = job_spec(train_args(d.path / "out", 3, sets));
  const launch::JobCostModel job =
      launch::job_cost_model_from_text("x\n" + planner::hardware_to_yaml(cal), "f32");
  const uint64_t expected = fingerprint(spec, 2, job.model);
  ASSERT_NE(expected, fingerprint(spec, 2, planner::CostModel{}))
      << "the calibration must plan another program than the defaults for this test to hold";
  ASSERT_NE(expected, fingerprint(spec, 2, h200_calibration().cost_model("f32")));
  int n = 0;
  const auto lines = plan_lines(r.out, &n);
  EXPECT_EQ(n, 2) << r.out;
  for (int rank : {0, 1}) {
    auto it = lines.find({rank, 2});
    ASSERT_NE(it, lines.end()) << "rank " << rank << "\n" << r.out;
    EXPECT_EQ(it->second, expected) << "rank " << rank << "\n" << r.out;
  }
  // Said once, by rank 0, naming rank 0's cache.
  const std::string said = "weft train: cost model: the calibration of";
  EXPECT_EQ(r.out.find(said), r.out.rfind(said)) << r.out;
  EXPECT_NE(r.out.find((d.path / "cache0.yaml").string()), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[rank 0] " + said), std::string::npos) << r.out;
  // The run folder's summary says it too.
  std::ifstream summary(d.path / "out" / "summary.txt");
  const std::string text((std::istreambuf_iterator<char>(summary)),
                         std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("cost model: the calibration of"), std::string::npos) << text;
  fs::remove_all(d.path);
}

// One process on the plan executor (as `weft bench` runs world 1): it plans under its
// machine's calibration and says so.
TEST(WeftRun, OneProcessPlansUnderItsCalibrationAndSaysSo) {
  Dir d("one");
  const fs::path cache = d.path / "cache.yaml";
  planner::write_machine_cache(cpu_host_calibration(), cache.string());
  std::string args;
  for (const std::string& a : train_args(d.path / "out", 2, {})) args += " '" + a + "'";
  CommandResult r =
      run_command("OMP_NUM_THREADS=1 WEFT_PLAN_EXECUTOR=1 " + kPlanLog +
                  " WEFT_COST_CACHE=" + cache.string() + " " + kWeft + kOneWorker + args);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("weft train: cost model: the calibration of"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(cache.string()), std::string::npos) << r.out;
  // The same without a cache: the defaults.
  CommandResult none = run_command("OMP_NUM_THREADS=1 WEFT_PLAN_EXECUTOR=1 " + kPlanLog +
                                   " WEFT_COST_CACHE=" + (d.path / "missing.yaml").string() + " " +
                                   kWeft + kOneWorker + args);
  ASSERT_EQ(none.code, 0) << none.out;
  EXPECT_NE(none.out.find("weft train: cost model: built-in defaults"), std::string::npos)
      << none.out;
  // One rank plans world 1 (no collective: the same program under either model).
  EXPECT_EQ(plan_lines(r.out).count({0, 1}), 1u) << r.out;
  fs::remove_all(d.path);
}

// An elastic job (online resize) of two nodes with one calibration; a third node joins with
// a calibration of its own. Every world (2, then 3) is planned on every rank under the job's
// model: the joiner takes it from the store, it does not choose its own. (Both first nodes
// hold the job's calibration because either may lead: which agent is rank 0 of the first
// epoch depends on which registers first. A rank without one taking rank 0's is
// WeftRun.RanksWithDifferentCalibrationsPlanUnderRankZerosModel.)
TEST(LiveResize, AJoinerWithAnotherCalibrationPlansUnderTheJobsModel) {
  LiveJob job;
  job.dir = agent_test_dir("live_resize", "jobcost");
  job.id = "live-jobcost";
  job.nnodes = "2:3";
  job.steps = 300;
  job.sets = {"parallel.dp=auto"};
  const planner::Hardware cal = cpu_host_calibration();
  planner::write_machine_cache(cal, (job.dir / "cache0.yaml").string());
  planner::write_machine_cache(h200_calibration(), (job.dir / "cache2.yaml").string());
  const std::vector<std::string> logging = {"WEFT_LOG_LEVEL=debug", "WEFT_LOG_SUBSYS=planner"};
  auto start_with = [&](const std::string& cache) {
    job.env = logging;
    job.env.push_back("WEFT_COST_CACHE=" + (job.dir / cache).string());
    job.start();
  };
  start_with("cache0.yaml");
  start_with("cache0.yaml");
  ASSERT_TRUE(job.wait_steps(10)) << job.all_logs();
  start_with("cache2.yaml");
  ASSERT_TRUE(job.wait_world(3, 5)) << phases_text(job.phases()) << job.all_logs();
  for (int k : {0, 1, 2}) {
    std::optional<int> code = job.wait(k);
    ASSERT_TRUE(code) << job.all_logs();
    EXPECT_EQ(*code, 0) << job.all_logs();
  }
  const core::JobSpec spec = job_spec(train_args(job.out(), job.steps, job.sets));
  const planner::CostModel model =
      launch::job_cost_model_from_text("x\n" + planner::hardware_to_yaml(cal), "f32").model;
  std::map<int, uint64_t> expected;
  for (int w : {2, 3}) {
    expected[w] = fingerprint(planner::fit_layout(spec, w), w, model);
    ASSERT_NE(expected[w],
              fingerprint(planner::fit_layout(spec, w), w, h200_calibration().cost_model("f32")))
        << "world " << w << ": the joiner's own calibration must plan another program";
  }
  std::set<std::pair<int, int>> seen;
  for (int k : {0, 1, 2})
    for (const auto& [rank_world, fp] : plan_lines(job.text(k))) {
      seen.insert(rank_world);
      EXPECT_EQ(fp, expected.at(rank_world.second))
          << "agent " << k << " rank " << rank_world.first << " world " << rank_world.second;
    }
  // Both worlds planned on every one of their ranks, the joiner's included (rank 2 of 3).
  for (const auto& rw : std::vector<std::pair<int, int>>{{0, 2}, {1, 2}, {0, 3}, {1, 3}, {2, 3}})
    EXPECT_TRUE(seen.count(rw)) << "rank " << rw.first << " world " << rw.second << "\n"
                                << job.all_logs();
  // The lead, whichever of the first two it was, said it plans under the job's calibration.
  const std::string said = "weft train: cost model: the calibration of";
  const std::string first_two = job.text(0) + job.text(1);
  EXPECT_NE(first_two.find(said), std::string::npos) << first_two;
  EXPECT_NE(first_two.find((job.dir / "cache0.yaml").string()), std::string::npos) << first_two;
  EXPECT_EQ(job.text(2).find(said), std::string::npos) << job.text(2);
  if (!::testing::Test::HasFailure()) fs::remove_all(job.dir);
}

}  // namespace
}  // namespace weft::test
