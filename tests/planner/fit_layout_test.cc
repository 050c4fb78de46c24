// elastic.layout: the layout each world trains: the job's own when it fits, a ConfigError
// naming the degree (with the auto hint) when it does not under `fixed`, and under `auto` the
// nearest layout that fits, the same for every caller.
#include <gtest/gtest.h>

#include "planner/policy.h"
#include "tests/planner/util.h"

namespace weft::planner {
namespace {
using test_util::config_error;
using test_util::gpt_spec;

core::JobSpec tp2_job(const std::string& layout) {
  core::JobSpec s = gpt_spec(4);
  s.train.global_batch = 24;
  s.train.micro_batch = 4;
  s.parallel.dp = 0;
  s.parallel.tp = 2;
  s.elastic.layout = layout;
  return s;
}

TEST(FitLayout, AJobThatFitsIsItselfUnderEitherSetting) {
  for (const char* layout : {"fixed", "auto"}) {
    std::string changed = "stale";
    core::JobSpec fit = fit_layout(tp2_job(layout), 4, &changed);
    EXPECT_EQ(fit.parallel.tp, 2) << layout;
    EXPECT_EQ(fit.parallel.dp, 0) << layout;
    EXPECT_EQ(changed, "") << layout;
  }
}

TEST(FitLayout, FixedStopsNamingTheDegreeAndHintsAtAuto) {
  ConfigError e = config_error([&] { fit_layout(tp2_job("fixed"), 3); });
  EXPECT_EQ(e.field(), "parallel.tp");
  const std::string m = e.what();
  EXPECT_NE(m.find("or set elastic.layout: auto"), std::string::npos) << m;
  EXPECT_EQ(m.find("parallel.tp: parallel.tp"), std::string::npos) << m;  // said once
}

TEST(FitLayout, AutoLowersTheFixedDegreesToWhatFits) {
  std::string changed;
  core::JobSpec fit = fit_layout(tp2_job("auto"), 3, &changed);  // 3 ranks: no tp=2
  EXPECT_EQ(fit.parallel.tp, 1);
  EXPECT_EQ(resolve_parallel(fit, 3).deg.dp, 3);
  EXPECT_EQ(changed, "tp 2 -> 1");
  // As much model parallelism as fits, tp kept before pp: tp2 x pp2 on 2 ranks is tp2.
  core::JobSpec s = tp2_job("auto");
  s.parallel.pp = 2;
  fit = fit_layout(s, 2, &changed);
  EXPECT_EQ(fit.parallel.tp, 2);
  EXPECT_EQ(fit.parallel.pp, 1);
  EXPECT_EQ(changed, "pp 2 -> 1");
  // A fixed dp becomes auto when the world cannot hold it.
  s = tp2_job("auto");
  s.parallel.dp = 2;
  fit = fit_layout(s, 2, &changed);
  EXPECT_EQ(resolve_parallel(fit, 2).deg.tp * resolve_parallel(fit, 2).deg.dp, 2);
  EXPECT_NE(changed.find("dp 2 -> auto"), std::string::npos) << changed;
  // The world grows back: the asked layout again.
  EXPECT_EQ(fit_layout(tp2_job("auto"), 4).parallel.tp, 2);
}

TEST(FitLayout, NothingFitsIsTheOriginalError) {
  // 24 sequences cannot split over 5 data-parallel ranks, with or without tp.
  ConfigError e = config_error([&] { fit_layout(tp2_job("auto"), 5); });
  EXPECT_EQ(e.field(), "parallel.tp");
}

}  // namespace
}  // namespace weft::planner
