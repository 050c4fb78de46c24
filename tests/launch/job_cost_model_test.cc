// The job's cost model through the store (launch/job_cost_model.h): the lead publishes its
// machine's calibration, a rank without one (or with another) takes the lead's; a restarted
// lead and a survivor republishing in a fresh store never replace the job's; nobody
// publishing is a timeout naming the key. The model matters: plans under it differ from
// the defaults'.
#include "launch/job_cost_model.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "base/error.h"
#include "comm/store/in_memory_store.h"
#include "core/config/job_spec.h"
#include "planner/hardware.h"
#include "planner/planner.h"
#include "tests/support/test_calibration.h"

namespace weft::launch {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

// Points $WEFT_COST_CACHE at a file of this test's folder for the test's length.
class CacheEnv {
 public:
  explicit CacheEnv(const std::string& name)
      : dir_(fs::temp_directory_path() / ("weft_job_cost_" + std::to_string(::getpid()))) {
    fs::create_directories(dir_);
    path_ = (dir_ / name).string();
    ::setenv("WEFT_COST_CACHE", path_.c_str(), 1);
  }
  ~CacheEnv() {
    ::unsetenv("WEFT_COST_CACHE");
    fs::remove_all(dir_);
  }
  const std::string& path() const { return path_; }

 private:
  fs::path dir_;
  std::string path_;
};

const std::string kKey = "rdzv/job-cost-test/job_cost_model";

TEST(JobCostModel, LeadPublishesItsCalibrationAndAnUncalibratedRankTakesIt) {
  CacheEnv env("lead.yaml");
  const planner::Hardware hw = test::cpu_host_calibration();
  planner::write_machine_cache(hw, env.path());
  comm::InMemoryStore store;
  const JobCostModel lead =
      share_job_cost_model(store, kKey, true, std::nullopt, "f32", milliseconds(1000));
  EXPECT_NE(lead.used.find(env.path()), std::string::npos) << lead.used;
  EXPECT_EQ(lead.model,
            planner::hardware_from_yaml(planner::hardware_to_yaml(hw), "x").cost_model("f32"));
  EXPECT_FALSE(lead.model == planner::CostModel{});
  // Another host: no cache at all.
  ::setenv("WEFT_COST_CACHE", (env.path() + ".missing").c_str(), 1);
  const JobCostModel other =
      share_job_cost_model(store, kKey, false, std::nullopt, "f32", milliseconds(1000));
  EXPECT_EQ(other.model, lead.model);
  EXPECT_EQ(other.used, lead.used);
  // A restarted lead on that host would choose the defaults: the job's stays.
  const JobCostModel restarted =
      share_job_cost_model(store, kKey, true, std::nullopt, "f32", milliseconds(1000));
  EXPECT_EQ(restarted.model, lead.model);
}

TEST(JobCostModel, WithoutACacheTheLeadChoosesTheDefaults) {
  CacheEnv env("none.yaml");
  comm::InMemoryStore store;
  const JobCostModel m =
      share_job_cost_model(store, kKey, true, std::nullopt, "f32", milliseconds(1000));
  EXPECT_EQ(m.model, planner::CostModel{});
  EXPECT_EQ(m.used.rfind("built-in defaults", 0), 0u) << m.used;
  EXPECT_NE(m.used.find(env.path()), std::string::npos) << m.used;  // where it looked
}

// This machine's 07:19 calibration of 2026-12-05 (every idle all-reduce at 2 processes about
// 4 ms: the 64 KiB one 6.9x its reduce-scatter + all-gather) misled the planner: a cache
// that records such collectives is not the job's model; the job plans under the defaults.
TEST(JobCostModel, ACacheWhoseCollectivesContradictThemselvesLeavesTheJobOnTheDefaults) {
  CacheEnv env("contradicting.yaml");
  planner::Hardware hw = test::cpu_host_calibration();
  hw.measurements = {{"gloo_n2_ar_world_64KiB_s", 0.004078842},
                     {"gloo_n2_rs_world_64KiB_s", 0.000413775},
                     {"gloo_n2_ag_world_64KiB_s", 0.0001779095}};
  planner::write_machine_cache(hw, env.path());
  comm::InMemoryStore store;
  const JobCostModel lead =
      share_job_cost_model(store, kKey, true, std::nullopt, "f32", milliseconds(1000));
  EXPECT_EQ(lead.model, planner::CostModel{});
  EXPECT_EQ(lead.used.rfind("built-in defaults", 0), 0u) << lead.used;
  for (const std::string& w :
       {env.path() + " is not used", std::string("all-reduce <= reduce-scatter + all-gather"),
        std::string("6.89x")})
    EXPECT_NE(lead.used.find(w), std::string::npos) << w << " in: " << lead.used;
  // The same calibration with consistent collectives (the all-reduce 200 us) is the job's.
  hw.measurements[0].second = 200e-6;
  planner::write_machine_cache(hw, env.path());
  comm::InMemoryStore fresh;
  const JobCostModel ok =
      share_job_cost_model(fresh, kKey, true, std::nullopt, "f32", milliseconds(1000));
  EXPECT_FALSE(ok.model == planner::CostModel{});
  EXPECT_NE(ok.used.find(env.path()), std::string::npos) << ok.used;
}

// An epoch whose store is new (an etcd job's new node 0): the survivor publishes the job's
// model there, a joiner waiting meanwhile takes it, a joiner with its own calibration too.
TEST(JobCostModel, ASurvivorRepublishesInAFreshStoreAndAJoinerWithAnotherCacheTakesIt) {
  CacheEnv env("joiner.yaml");
  planner::write_machine_cache(test::h200_calibration(), env.path());
  const std::string job = "the job's\n" + planner::hardware_to_yaml(test::cpu_host_calibration());
  comm::InMemoryStore fresh;
  JobCostModel joined;
  std::thread joiner([&] {
    joined = share_job_cost_model(fresh, kKey, false, std::nullopt, "f32", milliseconds(10'000));
  });
  std::this_thread::sleep_for(milliseconds(50));  // the joiner waits first (either order works)
  const JobCostModel survivor =
      share_job_cost_model(fresh, kKey, false, job, "f32", milliseconds(1000));
  joiner.join();
  EXPECT_EQ(survivor.text, job);
  EXPECT_EQ(joined.text, job);
  EXPECT_EQ(joined.model, job_cost_model_from_text(job, "f32").model);
  EXPECT_FALSE(joined.model == choose_job_cost_model("f32").model);  // not the joiner's own
}

TEST(JobCostModel, NobodyPublishingIsATimeoutNamingTheKey) {
  comm::InMemoryStore store;
  try {
    share_job_cost_model(store, kKey, false, std::nullopt, "f32", milliseconds(50));
    FAIL() << "expected a timeout";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find(kKey), std::string::npos) << e.what();
  }
}

TEST(JobCostModel, AMalformedTextNamesWhereItCameFrom) {
  try {
    job_cost_model_from_text("no newline", "f32", "store key k");
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.field(), "store key k");
  }
  EXPECT_THROW(job_cost_model_from_text("used\nflops: [1, 2]\n", "f32"), ConfigError);
}

TEST(JobCostModel, KeyIsTheRendezvousIdsUnderWeftRun) {
  ::setenv("TORCHELASTIC_RUN_ID", "job7", 1);
  EXPECT_EQ(job_cost_model_key(), "rdzv/job7/job_cost_model");
  ::unsetenv("TORCHELASTIC_RUN_ID");
  EXPECT_EQ(job_cost_model_key(), "train/job_cost_model");
}

// What makes agreeing necessary: the same job plans as another program under the
// calibration than under the defaults (and the fingerprint tells them apart).
TEST(JobCostModel, PlansUnderTheCalibrationAreAnotherProgramThanTheDefaults) {
  core::JobSpec spec =
      core::load_job_spec(std::string(WEFT_SOURCE_DIR) + "/configs/gpt-layout.yaml", {});
  const planner::CostModel cal = test::cpu_host_calibration().cost_model("f32");
  for (const auto& [key, world] : std::vector<std::pair<std::string, int>>{
           {"parallel.dp", 2}, {"parallel.tp", 2}, {"parallel.pp", 2}}) {
    core::JobSpec s = core::load_job_spec(std::string(WEFT_SOURCE_DIR) + "/configs/gpt-layout.yaml",
                                          {key + "=" + std::to_string(world)});
    const uint64_t a =
        plan_fingerprint(planner::make_plan(s, world, planner::training_plan_options(cal)));
    const uint64_t b =
        plan_fingerprint(planner::make_plan(s, world, planner::training_plan_options()));
    const uint64_t a2 =
        plan_fingerprint(planner::make_plan(s, world, planner::training_plan_options(cal)));
    EXPECT_NE(a, b) << key;
    EXPECT_EQ(a, a2) << key;  // planning_s and the rest of the costs are left out
  }
}

}  // namespace
}  // namespace weft::launch
