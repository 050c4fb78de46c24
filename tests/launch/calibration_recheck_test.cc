// `weft calibrate`'s re-measure of collectives that contradict themselves
// (launch/calibration_recheck.h), with an injected probe in place of the Gloo one: a
// consistent set is not probed again; a disturbed world is probed again until its least
// times agree, and only that world; one that stays disturbed is probed kMaxRemeasures times
// and refused with a message naming the collective, the world, the size and the numbers.
#include "launch/calibration_recheck.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "base/error.h"

namespace weft::launch {
namespace {

constexpr double us(double x) { return x * 1e-6; }

// One probe's calls at a world (probe_collectives' names), consistent: each all-reduce about
// half its reduce-scatter + all-gather, every kind slower with more bytes; and a step-like
// loop's segments, which the check leaves to their own estimate.
std::map<std::string, double> quiet_probe() {
  return {{"ar_world_4B", us(100)},         {"ar_world_64KiB", us(200)},
          {"ar_world_256KiB", us(350)},     {"ar_world_1MiB", us(700)},
          {"ar_world_4MiB", us(2500)},      {"rs_world_64KiB", us(300)},
          {"rs_world_256KiB", us(450)},     {"rs_world_1MiB", us(800)},
          {"rs_world_4MiB", us(3000)},      {"ag_world_64KiB", us(120)},
          {"ag_world_256KiB", us(180)},     {"ag_world_1MiB", us(320)},
          {"ag_world_4MiB", us(1400)},      {"p2p_4B", us(80)},
          {"p2p_64KiB", us(100)},           {"p2p_1MiB", us(340)},
          {"p2p_4MiB", us(1200)},           {"sync_ar_4B_b1@0", us(9000)},
          {"sync_ar_4B_b1@0_delay", us(10)}};
}

// The same probe with every idle all-reduce at about 4 ms (the 07:19 calibration's probes).
std::map<std::string, double> disturbed_probe() {
  std::map<std::string, double> p = quiet_probe();
  for (const char* k :
       {"ar_world_4B", "ar_world_64KiB", "ar_world_256KiB", "ar_world_1MiB", "ar_world_4MiB"})
    p[k] = us(4000) + p[k];
  return p;
}

// The probes' values by world, as calibrate_machine collects them.
ProbeRuns runs_of(const std::map<int, std::vector<std::map<std::string, double>>>& probes) {
  ProbeRuns r;
  for (const auto& [n, list] : probes)
    for (const auto& one : list)
      for (const auto& [k, v] : one) r[n][k].push_back(v);
  return r;
}

TEST(CalibrationRecheck, LeastTimesLeaveTheLoopsSegmentsOut) {
  const ProbeRuns runs = runs_of({{2, {disturbed_probe(), quiet_probe()}}});
  const planner::CollectiveTimes t = least_times(runs);
  EXPECT_DOUBLE_EQ(t.at(2).at("ar_world_64KiB"), us(200));
  EXPECT_EQ(t.at(2).count("sync_ar_4B_b1@0"), 0u);
  EXPECT_EQ(t.at(2).size(), quiet_probe().size() - 2);
}

TEST(CalibrationRecheck, AConsistentSetIsNotProbedAgain) {
  ProbeRuns runs = runs_of({{2, {quiet_probe(), quiet_probe(), quiet_probe()}}});
  int calls = 0;
  const CollectiveRecheck r =
      recheck_collectives(runs, 2, [&](int) { return ++calls, quiet_probe(); });
  EXPECT_EQ(calls, 0);
  EXPECT_TRUE(r.found.empty());
  EXPECT_TRUE(r.left.empty());
  EXPECT_TRUE(r.remeasured.empty());
}

TEST(CalibrationRecheck, ADisturbedWorldIsProbedAgainUntilItsCallsAgree) {
  // Three disturbed probes at 2 processes; world 4 is consistent (4 cores: both judged).
  ProbeRuns runs = runs_of({{2, {disturbed_probe(), disturbed_probe(), disturbed_probe()}},
                            {4, {quiet_probe(), quiet_probe(), quiet_probe()}}});
  // The disturbance outlasts one more probe, not two.
  std::vector<int> asked;
  std::vector<std::string> lines;
  const CollectiveRecheck r = recheck_collectives(
      runs, 4,
      [&](int n) {
        asked.push_back(n);
        return asked.size() < 2 ? disturbed_probe() : quiet_probe();
      },
      kMaxRemeasures, [&](const std::string& s) { lines.push_back(s); });
  EXPECT_EQ(asked, (std::vector<int>{2, 2}));
  EXPECT_FALSE(r.found.empty());
  for (const auto& c : r.found) EXPECT_EQ(c.world, 2);
  EXPECT_TRUE(r.left.empty()) << planner::describe(r.left);
  EXPECT_EQ(r.remeasured, (std::map<int, int>{{2, 2}}));
  // The new probes joined the least of the others.
  EXPECT_EQ(runs[2]["ar_world_64KiB"].size(), 5u);
  EXPECT_EQ(runs[4]["ar_world_64KiB"].size(), 3u);
  EXPECT_DOUBLE_EQ(least_times(runs).at(2).at("ar_world_64KiB"), us(200));
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_NE(lines[0].find("2 processes: measured again (1 of at most 3)"), std::string::npos)
      << lines[0];
  EXPECT_NE(lines[0].find(planner::kDecompositionRule), std::string::npos) << lines[0];
}

TEST(CalibrationRecheck, AContradictionThatOutlastsTheProbesRefusesTheCalibration) {
  ProbeRuns runs = runs_of({{2, {disturbed_probe(), disturbed_probe(), disturbed_probe()}}});
  int calls = 0;
  const CollectiveRecheck r =
      recheck_collectives(runs, 2, [&](int) { return ++calls, disturbed_probe(); });
  EXPECT_EQ(calls, kMaxRemeasures);
  EXPECT_EQ(r.remeasured, (std::map<int, int>{{2, kMaxRemeasures}}));
  ASSERT_FALSE(r.left.empty());
  const std::string m = refusal_message(r);
  // The collective, the world, the size, the numbers, what happened and what to do.
  for (const char* w : {"3 more probes at 2 processes", "not written", "previous calibration",
                        "the 64KiB all-reduce took 4200 us", "reduce-scatter 300 us",
                        "all-gather 120 us", "10.00x", "run `weft calibrate` again"})
    EXPECT_NE(m.find(w), std::string::npos) << w << " in: " << m;
}

TEST(CalibrationRecheck, AProbeThatFailsIsAnError) {
  ProbeRuns runs = runs_of({{2, {disturbed_probe()}}});
  EXPECT_THROW(recheck_collectives(runs, 2, [](int) { return std::map<std::string, double>{}; }),
               Error);
}

}  // namespace
}  // namespace weft::launch
