// The timeline SVG (timeline_svg): a labelled time axis; a bounded number of rectangles per
// rank however many micro-batches; a zoom window that keeps only what lies inside it; a cap
// on the ranks drawn.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include "planner/report.h"
#include "planner/simulate.h"
#include "tests/planner/util.h"
#include "tests/support/run_weft.h"

namespace weft::planner {
namespace {
using test_util::gpt_spec;

struct Drawn {
  Plan plan;
  std::vector<std::vector<Span>> spans;
};

// A two-stage 1F1B pipeline of `micro_batches` micro-batches on dp x 2 ranks.
Drawn pipeline(int micro_batches, int dp = 1) {
  core::JobSpec s = gpt_spec();
  s.parallel.pp = 2;
  s.parallel.dp = dp;
  s.parallel.pipeline.schedule = "1f1b";
  s.train.micro_batch = 1;
  s.train.global_batch = micro_batches * dp;
  core::ModelGraph mg = build_planning_graph(s);
  PlanOptions opt;
  opt.simulate = false;
  Drawn d{make_plan(s, mg.graph, 2 * dp, opt), {}};
  d.plan.costs = simulate_plan(d.plan, mg.graph, opt.cost, &d.spans);
  EXPECT_TRUE(d.plan.costs.valid);
  return d;
}

struct Rect {
  double x, y, w;
};
std::vector<Rect> rects(const std::string& svg) {
  std::vector<Rect> out;
  std::regex re("<rect x='([0-9.]+)' y='([0-9.]+)' width='([0-9.]+)'");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), re); it != std::sregex_iterator(); ++it)
    out.push_back({std::stod((*it)[1]), std::stod((*it)[2]), std::stod((*it)[3])});
  return out;
}
std::map<double, int> per_row(const std::vector<Rect>& rs) {
  std::map<double, int> n;
  for (const Rect& r : rs) ++n[r.y];
  return n;
}
std::vector<std::string> ticks(const std::string& svg) {
  std::vector<std::string> out;
  std::regex re("<text class='tick'[^>]*>([^<]*)</text>");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), re); it != std::sregex_iterator(); ++it)
    out.push_back((*it)[1]);
  return out;
}

TEST(Timeline, HasALabelledTimeAxis) {
  Drawn d = pipeline(4);
  const std::string svg = timeline_svg(d.plan, d.spans);
  std::vector<std::string> t = ticks(svg);
  ASSERT_GE(t.size(), 4u) << svg.substr(0, 2000);
  ASSERT_LE(t.size(), 14u);
  std::smatch m;
  const std::regex label("([0-9.e+-]+) (us|ms|s)");
  for (const std::string& l : t) {
    EXPECT_TRUE(std::regex_match(l, m, label)) << l;
    EXPECT_NE(l[0], '-') << l;  // the first tick is "0", not "-0"
  }
  EXPECT_EQ(std::stod(t[0]), 0.0);  // the axis starts at the step's start
  // Evenly spaced round values.
  const double step = std::stod(t[1]) - std::stod(t[0]);
  EXPECT_GT(step, 0);
  for (size_t i = 2; i < t.size(); ++i) EXPECT_NEAR(std::stod(t[i]) - std::stod(t[i - 1]), step, 1e-6 * step);
  EXPECT_NE(svg.find("time (" + std::string(std::regex_match(t[0], m, label) ? m[2].str() : "?") + ")"),
            std::string::npos);
}

TEST(Timeline, ManyMicroBatchesStayBoundedPerRank) {
  Drawn d = pipeline(64);
  TimelineOptions exact;
  exact.max_bars = 1 << 30;
  std::map<double, int> all = per_row(rects(timeline_svg(d.plan, d.spans, exact)));
  ASSERT_EQ(all.size(), 2u);
  TimelineOptions few;
  few.max_bars = 40;
  for (auto [y, n] : all) EXPECT_GT(n, few.max_bars) << "the test needs rows that must be aggregated";
  const std::string svg = timeline_svg(d.plan, d.spans, few);
  std::map<double, int> agg = per_row(rects(svg));
  ASSERT_EQ(agg.size(), 2u);
  for (auto [y, n] : agg) {
    EXPECT_LE(n, few.max_bars) << y;
    EXPECT_GE(n, 2) << y;  // still a picture, not one bar
  }
  EXPECT_TRUE(std::regex_search(svg, std::regex(">x[0-9]+</text>"))) << "aggregated bars say how many spans";
  // The default bound holds too.
  for (auto [y, n] : per_row(rects(timeline_svg(d.plan, d.spans)))) EXPECT_LE(n, TimelineOptions{}.max_bars);
}

TEST(Timeline, ZoomKeepsOnlySpansInsideTheWindow) {
  Drawn d = pipeline(16);
  const double step = d.plan.costs.step_s;
  TimelineOptions exact;
  exact.max_bars = 1 << 30;
  TimelineOptions zoom = exact;
  zoom.zoom_start_s = step / 3, zoom.zoom_end_s = step / 2;
  const std::string svg = timeline_svg(d.plan, d.spans, zoom);
  std::vector<Rect> in = rects(svg), whole = rects(timeline_svg(d.plan, d.spans, exact));
  ASSERT_FALSE(in.empty());
  EXPECT_LT(in.size(), whole.size() / 2);
  for (const Rect& r : in) {  // the plot spans x 70..1400
    EXPECT_GE(r.x, 70 - 1e-6);
    EXPECT_LE(r.x + r.w, 1400 + 0.31);  // a bar is at least 0.3 wide
  }
  // As many bars as the spans overlapping the window make when drawn alone: nothing
  // outside it is drawn, nothing inside is lost.
  size_t expected = 0;
  for (const auto& row : d.spans) {
    std::vector<Span> inside;
    for (const Span& s : row)
      if (s.end > zoom.zoom_start_s && s.start < zoom.zoom_end_s) inside.push_back(s);
    expected += rects(timeline_svg(d.plan, {inside}, exact)).size();
  }
  EXPECT_EQ(in.size(), expected);
  std::vector<std::string> t = ticks(svg);
  ASSERT_FALSE(t.empty());
  EXPECT_GE(std::stod(t.front()), 0.0);
  EXPECT_NE(svg.find("window"), std::string::npos);
}

TEST(Timeline, LargeWorldsDrawOneReplicaOrTheRanksAsked) {
  Drawn d = pipeline(4, 32);  // world 64 = dp 32 x pp 2
  std::string svg = timeline_svg(d.plan, d.spans);
  EXPECT_EQ(per_row(rects(svg)).size(), 2u);
  const int stage1 = d.plan.mesh.rank_of(1, 0, 0);
  EXPECT_NE(svg.find(">rank 0<"), std::string::npos);
  EXPECT_NE(svg.find(">rank " + std::to_string(stage1) + "<"), std::string::npos);
  EXPECT_EQ(svg.find(">rank 1<"), std::string::npos);
  EXPECT_NE(svg.find("data-parallel replica 0"), std::string::npos);
  TimelineOptions o;
  o.ranks = {3, 5, 7};
  svg = timeline_svg(d.plan, d.spans, o);
  EXPECT_EQ(per_row(rects(svg)).size(), 3u);
  EXPECT_NE(svg.find(">rank 5<"), std::string::npos);
  EXPECT_NE(svg.find("3 of 64 ranks"), std::string::npos);
  o.ranks = {64};
  EXPECT_EQ(test_util::config_error([&] { timeline_svg(d.plan, d.spans, o); }).field(), "--timeline-ranks");
}

TEST(Timeline, PlanFlagsZoomAndRefuseBadRanks) {
  const std::string svg = ::testing::TempDir() + "/weft_timeline_flags.svg";
  const std::string base = "plan --config " + std::string(WEFT_SOURCE_DIR) +
                           "/configs/gpt-layout.yaml --world 2 --set parallel.dp=1 --set parallel.pp=2 "
                           "--hardware h100 --timeline " + svg;
  std::filesystem::remove(svg);
  test::CommandResult r = test::run_weft(base + " --timeline-zoom 0:0.01 --timeline-ranks 1");
  ASSERT_EQ(r.code, 0) << r.out;
  std::ifstream f(svg);
  std::stringstream ss;
  ss << f.rdbuf();
  EXPECT_NE(ss.str().find("window 0.000-0.010 ms"), std::string::npos) << ss.str().substr(0, 400);
  EXPECT_FALSE(ticks(ss.str()).empty());
  EXPECT_EQ(per_row(rects(ss.str())).size(), 1u);  // rank 1 only
  std::filesystem::remove(svg);
  r = test::run_weft(base + " --timeline-ranks 0-9");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--timeline-ranks"), std::string::npos) << r.out;
  EXPECT_FALSE(std::filesystem::exists(svg)) << "a refused timeline writes no file";
  r = test::run_weft(base + " --timeline-zoom 3:1");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--timeline-zoom"), std::string::npos) << r.out;
}

// Each span names the instruction it times (Span::pc, what `weft bench scaling --attribute`
// sums per instruction group), in the engine's run and in its re-timing alike (a host with
// more ranks than cores re-times the run at its runnable ranks): the kind at that position.
TEST(Timeline, EverySpanNamesItsInstruction) {
  core::JobSpec s = gpt_spec();
  s.parallel.pp = 2, s.parallel.dp = 2, s.parallel.pipeline.schedule = "1f1b";
  core::ModelGraph mg = build_planning_graph(s);
  PlanOptions opt;
  opt.simulate = false;
  const Plan plan = make_plan(s, mg.graph, 4, opt);
  for (const CostModel& cm : {CostModel{}, test_util::two_core_host(1e-4)}) {
    std::vector<std::vector<Span>> spans;
    simulate_plan(plan, mg.graph, cm, &spans);
    ASSERT_EQ(spans.size(), 4u);
    for (int r = 0; r < 4; ++r) {
      const RankProgram prog = plan.program(r);
      ASSERT_FALSE(spans[size_t(r)].empty());
      int last = -1;
      for (const Span& sp : spans[size_t(r)]) {
        ASSERT_GE(sp.pc, 0) << "rank " << r;
        ASSERT_LT(size_t(sp.pc), prog.program.size()) << "rank " << r;
        EXPECT_EQ(prog.program[size_t(sp.pc)].kind, sp.kind) << "rank " << r << " at " << sp.pc;
        EXPECT_GT(sp.pc, last) << "rank " << r << ": in program order, once each";
        last = sp.pc;
      }
    }
  }
}

}  // namespace
}  // namespace weft::planner
