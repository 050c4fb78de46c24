// The least-squares link fit of `weft calibrate` (launch/link_fit.h) on samples made from
// known terms: it recovers them from every size and world at once, with noise, and says
// when the samples cannot determine the bandwidth.
#include "launch/link_fit.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "base/error.h"

namespace weft::launch {
namespace {

constexpr double kLaunch = 30e-6, kLatency = 20e-6, kBw = 2e9;

// The probes of `weft calibrate` at worlds 2 and 4 (all-reduce) and one-way messages, at its
// five sizes, timed by the model with a deterministic relative error of up to +-`noise`.
std::vector<LinkSample> probes(double noise) {
  std::vector<LinkSample> s;
  const double sizes[] = {4, 65536, 262144, 1048576, 4194304};
  int k = 0;
  auto wobble = [&] { return 1 + noise * ((k++ * 7919) % 11 - 5) / 5.0; };
  for (int n : {2, 4})
    for (double b : sizes) {
      LinkSample p{1, 2.0 * (n - 1), 2.0 * (n - 1) / n * b, 0, "ar n" + std::to_string(n)};
      p.seconds = (kLaunch + p.steps * kLatency + p.bytes / kBw) * wobble();
      s.push_back(p);
    }
  for (double b : sizes) {
    LinkSample p{0, 1, b, 0, "p2p"};
    p.seconds = (kLatency + b / kBw) * wobble();
    s.push_back(p);
  }
  return s;
}

TEST(LinkFit, RecoversTheModelsTermsFromEverySizeAtOnce) {
  const LinkFit f = fit_link(probes(0));
  EXPECT_NEAR(f.launch, kLaunch, 1e-9);
  EXPECT_NEAR(f.latency, kLatency, 1e-9);
  EXPECT_NEAR(f.bw / kBw, 1.0, 1e-9);
  EXPECT_LT(f.rms_relative_error, 1e-9);
}

TEST(LinkFit, FivePercentNoiseMovesTheTermsByLittle) {
  const LinkFit f = fit_link(probes(0.05));
  EXPECT_NEAR(f.launch / kLaunch, 1.0, 0.25) << f.launch;
  EXPECT_NEAR(f.latency / kLatency, 1.0, 0.15) << f.latency;
  EXPECT_NEAR(f.bw / kBw, 1.0, 0.08) << f.bw;
  EXPECT_GT(f.rms_relative_error, 0.01);
  EXPECT_LT(f.rms_relative_error, 0.06);
  EXPECT_FALSE(f.worst.empty());
}

// One-way messages alone carry no launch: it is 0, and latency and bandwidth still fit.
TEST(LinkFit, MessagesAloneFitLatencyAndBandwidthWithoutALaunch) {
  std::vector<LinkSample> s;
  for (const LinkSample& p : probes(0))
    if (p.launches == 0) s.push_back(p);
  const LinkFit f = fit_link(s);
  EXPECT_EQ(f.launch, 0);
  EXPECT_NEAR(f.latency, kLatency, 1e-9);
  EXPECT_NEAR(f.bw / kBw, 1.0, 1e-9);
}

// A term the samples put below zero is fixed at 0 and the others fitted again: a link
// whose messages cost their bytes alone, with the smallest 3% fast, fits a latency of about
// -1 us unconstrained (computed by hand); the fit gives 0 and the bandwidth.
TEST(LinkFit, ATermFittedNegativeIsZeroAndTheRestRefit) {
  std::vector<LinkSample> s;
  for (double b : {65536.0, 1048576.0, 4194304.0}) s.push_back({0, 1, b, b / kBw, "p2p"});
  s[0].seconds *= 0.97;
  const LinkFit f = fit_link(s);
  EXPECT_EQ(f.latency, 0);
  // The relative fit of rates 1/0.97, 1 and 1 (x kBw): sum(q) / sum(q^2) = 1 / 1.0105.
  EXPECT_NEAR(f.bw / kBw, 1.0105, 0.0005);
}

// A calibration on a busy machine: two small calls waited for a core (a time slice, 4 ms,
// on top of their tens of microseconds), as the 4 B all-reduce that once fitted a 3.7 ms
// launch. The fit leaves both out and recovers the terms as from the clean samples.
TEST(LinkFit, LoadOutliersAreLeftOutAndTheTermsRecovered) {
  std::vector<LinkSample> s = probes(0.05);
  ASSERT_EQ(s[0].name, "ar n2");  // the 4 B all-reduce at 2 ranks
  ASSERT_EQ(s[10].name, "p2p");   // the 4 B message
  s[0].seconds += 4e-3, s[0].name = "ar n2 4B (loaded)";
  s[11].seconds += 4e-3, s[11].name = "p2p 64KiB (loaded)";
  const LinkFit f = fit_link(s);
  std::vector<std::string> rejected = f.rejected;
  std::sort(rejected.begin(), rejected.end());
  EXPECT_EQ(rejected, (std::vector<std::string>{"ar n2 4B (loaded)", "p2p 64KiB (loaded)"}));
  // Exactly the fit of the samples that did not wait.
  std::vector<LinkSample> rest = probes(0.05);
  rest.erase(rest.begin() + 11);
  rest.erase(rest.begin());
  const LinkFit clean = fit_link(rest);
  EXPECT_NEAR(f.launch / clean.launch, 1.0, 1e-9) << f.launch;
  EXPECT_NEAR(f.latency / clean.latency, 1.0, 1e-9) << f.latency;
  EXPECT_NEAR(f.bw / clean.bw, 1.0, 1e-9) << f.bw;
  // The fit's misfit over the samples it kept (synthetic times, no clock: the +-5% wobble
  // of probes() leaves 0.0225); with either outlier kept it would be far larger.
  EXPECT_NEAR(f.rms_relative_error, 0.0225, 0.001);
  EXPECT_NEAR(f.launch / kLaunch, 1.0, 0.25) << f.launch;
  // The outliers are ones: each took over kLoadOutlier times what the true terms give.
  EXPECT_GT(s[0].seconds / (kLaunch + 2 * kLatency + s[0].bytes / kBw), kLoadOutlier);
  EXPECT_GT(s[11].seconds / (kLatency + s[11].bytes / kBw), kLoadOutlier);
}

// On samples without load, nothing is left out (the model's own misfit stays within
// kLoadOutlier): the rejection never moves an idle machine's fit.
TEST(LinkFit, NothingIsRejectedWithoutLoad) {
  EXPECT_TRUE(fit_link(probes(0)).rejected.empty());
  EXPECT_TRUE(fit_link(probes(0.05)).rejected.empty());
  // A misfit of 80% on the largest all-reduce (Gloo's ring above 512 KiB) is no outlier.
  std::vector<LinkSample> s = probes(0.05);
  s[4].seconds *= 1.8;
  EXPECT_TRUE(fit_link(s).rejected.empty());
}

// The launch from the busy all-reduce: kept on an idle machine (its peer computing costs a
// little more than the idle call), the fit's where it is a load outlier (3.8 ms in every
// repeat of a busy calibration, which fitted the tp2 rows 4x over their measurement).
TEST(LinkFit, TheBusyAllReduceGivesTheLaunchUnlessLoadHeldIt) {
  const LinkFit f = fit_link(probes(0));
  const double idle_call = kLaunch + 2 * kLatency;
  const BusyLaunch idle = busy_launch(f, 1.4 * idle_call, kLatency);
  EXPECT_FALSE(idle.load_outlier);
  EXPECT_NEAR(idle.launch, 1.4 * idle_call - 2 * kLatency, 1e-12);
  EXPECT_NEAR(idle.idle_call, idle_call, 1e-12);
  const BusyLaunch edge = busy_launch(f, 0.99 * kLoadOutlier * idle_call, kLatency);
  EXPECT_FALSE(edge.load_outlier);
  const BusyLaunch loaded = busy_launch(f, 3.8e-3, kLatency);
  EXPECT_TRUE(loaded.load_outlier);
  EXPECT_NEAR(loaded.launch, kLaunch, 1e-12);
}

// The step-like loops' level (load_robust_level): 24 segments of a loop whose calls cost
// 0.40 ms on a quiet machine (+-10%), and as much again as their threads waited for a core:
// 0 to 3.45 ms, in no order. The level is the mean of the 6 least-delayed segments as
// measured (their delay included: a step pays what the quietest loops paid); every
// segment's mean is several times it.
TEST(LoadRobustLevel, TheLeastDelayedQuarterGivesTheLevel) {
  std::vector<LoadSample> s;
  double quiet = 0;
  for (int i = 0; i < 24; ++i) {
    const int order = (i * 5) % 24;  // a permutation of 0..23: the delays in no order
    const double base = 0.4e-3 * (1 + 0.1 * ((i * 7) % 5 - 2) / 2.0), delay = 0.15e-3 * order;
    s.push_back({base + delay, delay});
    if (order < 6) quiet += (base + delay) / 6;
  }
  const LoadRobustLevel l = load_robust_level(s);
  EXPECT_NEAR(l.value, quiet, 1e-12);
  EXPECT_EQ(l.kept, 6);
  EXPECT_EQ(l.rejected, 18);
  EXPECT_GT(l.raw, 2.5 * l.value);  // about what the median of the loops' means read before
  // No delay recorded (the curves over the cores): every sample is kept, less outliers
  // (8 ms is not 3x the median 5 ms; 16 ms is), and averaged, not the least.
  std::vector<LoadSample> none = {{1e-3, 0}, {2e-3, 0}, {3e-3, 0}, {4e-3, 0},
                                  {5e-3, 0}, {6e-3, 0}, {8e-3, 0}, {16e-3, 0}};
  const LoadRobustLevel all = load_robust_level(none);
  EXPECT_NEAR(all.value, 29e-3 / 7, 1e-15);
  EXPECT_EQ(all.kept, 7);
  EXPECT_EQ(all.rejected, 1);
}

// Among the quiet quarter, a segment whose wait the run delay did not see (its peer's: 4 ms
// where its calls cost 0.4) is left out by the rule every estimate shares (is_load_outlier
// against the median); an idle machine's scatter (a scheduler tick in one segment: 1.6x) is
// kept, and averaged.
TEST(LoadRobustLevel, AWaitTheDelayMissedIsAnOutlierAnIdleTickIsNot) {
  std::vector<LoadSample> s(8, LoadSample{0.4e-3, 0});
  s[2].value = 0.64e-3;
  s[5].value = 4.4e-3;
  for (int i = 0; i < 24; ++i) s.push_back({9e-3, 5e-3});  // the delayed rest
  const LoadRobustLevel l = load_robust_level(s);
  EXPECT_EQ(l.rejected, 24 + 1);
  EXPECT_EQ(l.kept, 7);
  EXPECT_NEAR(l.value, (6 * 0.4e-3 + 0.64e-3) / 7, 1e-12);
  EXPECT_TRUE(is_load_outlier(4.4e-3, 0.4e-3));
  EXPECT_FALSE(is_load_outlier(0.64e-3, 0.4e-3));
}

TEST(LoadRobustLevel, NoPositiveSampleIsAnError) {
  EXPECT_THROW(load_robust_level({}), Error);
  EXPECT_THROW(load_robust_level({{0, 0}, {-1, 0}}), Error);
}

// loop_segments: every segment of one loop over the repeats, each with its own repeat's
// delay, whatever the world (over the cores the delays were dropped before the short slice,
// so every segment was averaged); another loop's segments and names sharing a prefix stay out.
TEST(LoadRobustLevel, EveryLoopsSegmentsCarryTheirDelaysAtEveryWorld) {
  std::map<std::string, std::vector<double>> probe;
  double quiet = 0;
  for (int k = 0; k < 8; ++k) {
    const std::string seg = "sync_pair_4B_b1@" + std::to_string(k);
    // Three repeats; repeat 0 of segments 0-5 is the quiet quarter (6 of 24).
    for (int r = 0; r < 3; ++r) {
      const bool calm = r == 0 && k < 6;
      const double delay = calm ? 1e-5 * k : 1e-3 * (1 + k + 8 * r);
      probe[seg].push_back(1.5e-3 + delay);
      probe[seg + "_delay"].push_back(delay);
      if (calm) quiet += (1.5e-3 + delay) / 6;
    }
    probe["sync_pair_4B_b100@" + std::to_string(k)] = {9.0, 9.0, 9.0};
  }
  probe["sync_pair_4B_b1_burst"] = {7e-5, 7e-5, 7e-5};
  const std::vector<LoadSample> s = loop_segments(probe, "sync_pair_4B_b1");
  ASSERT_EQ(s.size(), 24u);
  for (const LoadSample& p : s) EXPECT_NEAR(p.value - p.delay, 1.5e-3, 1e-15);
  const LoadRobustLevel l = load_robust_level(s);
  EXPECT_NEAR(l.value, quiet, 1e-15);
  EXPECT_EQ(l.kept, 6);
  EXPECT_LT(l.value, 0.2 * l.raw);  // every segment's mean: what the curves over the cores read
  // A loop without delays keeps every segment (0 delay each).
  probe.clear();
  probe["sync_ar_4B_b4@0"] = {2e-3, 3e-3};
  const std::vector<LoadSample> bare = loop_segments(probe, "sync_ar_4B_b4");
  ASSERT_EQ(bare.size(), 2u);
  EXPECT_EQ(bare[0].delay, 0.0);
  EXPECT_EQ(bare[1].value, 3e-3);
}

// A wait curve that falls (a short burst's point loaded: 3.7 ms, then 1.4 and 1.5 ms
// after longer bursts) is pooled into the closest non-decreasing curve: the first three
// points take their mean, the rest stay; a plausible curve is left as it is.
TEST(WaitCurveRefit, AFallingCurveIsPooledAPlausibleOneKept) {
  std::vector<std::pair<double, double>> c = {
      {0.08e-3, 3.7e-3}, {0.3e-3, 1.4e-3}, {1.4e-3, 1.5e-3}, {8.8e-3, 4.0e-3}, {45e-3, 9.6e-3}};
  EXPECT_EQ(refit_non_decreasing(c), 3);
  const double pooled = (3.7e-3 + 1.4e-3 + 1.5e-3) / 3;
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(c[size_t(i)].second, pooled, 1e-15);
  EXPECT_EQ(c[3].second, 4.0e-3);
  EXPECT_EQ(c[4].second, 9.6e-3);
  EXPECT_EQ(c[0].first, 0.08e-3);  // the bursts stay
  std::vector<std::pair<double, double>> ok = {{1e-4, 1e-4}, {1e-3, 1e-4}, {1e-2, 2e-3}};
  const auto before = ok;
  EXPECT_EQ(refit_non_decreasing(ok), 0);
  EXPECT_EQ(ok, before);
  // A dip later on pools backwards as far as it must: 1, 5, 2, 3 -> 1, 3.33, 3.33, 3.33.
  std::vector<std::pair<double, double>> dip = {{1, 1}, {2, 5}, {3, 2}, {4, 3}};
  EXPECT_EQ(refit_non_decreasing(dip), 3);
  EXPECT_EQ(dip[0].second, 1);
  for (int i = 1; i < 4; ++i) EXPECT_NEAR(dip[size_t(i)].second, 10.0 / 3, 1e-12);
}

TEST(LinkFit, OneSizeCannotGiveABandwidth) {
  try {
    fit_link({{1, 2, 4, 50e-6, "a"}, {0, 1, 4, 20e-6, "b"}});
    ADD_FAILURE() << "a fit from one size";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("at least two message sizes"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace weft::launch
