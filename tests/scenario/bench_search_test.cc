// `weft bench search --quick` end to end: the plan search's candidates are trained on real
// ranks and the table is consistent with itself (every candidate predicted and measured, the
// ranks permutations that agree with the times, the ratio and median error recomputed from
// the rows). Structure only: no timing thresholds, the machine is shared.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/bench_output.h"
#include "tests/support/run_weft.h"

namespace {

struct Row {
  std::string layout;
  double predicted = 0, measured = 0, error = 0;
  int rank_pred = 0, rank_meas = 0;
};

std::vector<std::string> cells(const std::string& line) {
  std::vector<std::string> out;
  std::stringstream ss(line);
  for (std::string c; std::getline(ss, c, '|');) out.push_back(c);
  return out;
}

// The number after `key` on the line that starts with `key`; NaN when there is none.
double after(const std::string& text, const std::string& key) {
  std::stringstream ss(text);
  for (std::string l; std::getline(ss, l);)
    if (l.rfind(key, 0) == 0) return std::stod(l.substr(key.size()));
  return std::nan("");
}

std::vector<int> sorted(std::vector<int> v) {
  std::sort(v.begin(), v.end());
  return v;
}

TEST(BenchSearch, QuickTableIsConsistent) {
  const weft::test::CommandResult r = weft::test::run_weft("bench search --quick");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("cost model: "), std::string::npos) << r.out;

  const std::vector<std::string> section = weft::test::bench_section(r.out, "candidates");
  ASSERT_GE(section.size(), 2u) << r.out;  // the header and at least one candidate
  EXPECT_NE(section[0].find("predicted ms"), std::string::npos) << section[0];
  std::vector<Row> rows;
  for (size_t i = 1; i < section.size(); ++i) {
    const std::vector<std::string> c = cells(section[i]);
    // #, layout, predicted, measured, error, rank by prediction, rank by measurement
    ASSERT_EQ(c.size(), 7u) << section[i];
    EXPECT_EQ(std::stoi(c[0]), int(i)) << section[i];
    Row row;
    row.layout = c[1];
    row.predicted = std::stod(c[2]);
    row.measured = std::stod(c[3]);
    row.error = std::stod(c[4]);
    row.rank_pred = std::stoi(c[5]);
    row.rank_meas = std::stoi(c[6]);
    EXPECT_NE(row.layout.find("dp"), std::string::npos) << section[i];
    EXPECT_GT(row.predicted, 0) << section[i];
    EXPECT_GT(row.measured, 0) << section[i];
    // The error is the row's own (pred - meas) / meas, to its printed precision.
    EXPECT_NEAR(row.error, (row.predicted - row.measured) / row.measured * 100, 0.1) << section[i];
    rows.push_back(row);
  }
  // One progress line per candidate came before the table.
  for (size_t i = 1; i <= rows.size(); ++i) {
    char progress[32];
    std::snprintf(progress, sizeof progress, "[%zu/%zu] ", i, rows.size());
    EXPECT_NE(r.out.find(progress), std::string::npos) << progress << "\n" << r.out;
  }
  // The search's top predicted is first; the Megatron-style default is among the rows (the
  // quick model's default, tp = every rank with micro_batch 1, differs from the searched).
  EXPECT_EQ(rows[0].rank_pred, 1) << r.out;
  EXPECT_NE(r.out.find("(Megatron-style)"), std::string::npos) << r.out;

  // Ranks are permutations of 1..n that order the times (ties: either order).
  std::vector<int> pred, meas, want(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) want[i] = int(i) + 1;
  for (const Row& x : rows) pred.push_back(x.rank_pred), meas.push_back(x.rank_meas);
  EXPECT_EQ(sorted(pred), want) << r.out;
  EXPECT_EQ(sorted(meas), want) << r.out;
  for (const Row& x : rows)
    for (const Row& y : rows) {
      if (x.predicted < y.predicted) {
        EXPECT_LT(x.rank_pred, y.rank_pred) << r.out;
      }
      if (x.measured < y.measured) {
        EXPECT_LT(x.rank_meas, y.rank_meas) << r.out;
      }
    }

  // The ratio line: measured(top predicted) / min(measured), from the table's own rows.
  double best = rows[0].measured, searched = 0;
  for (const Row& x : rows) {
    best = std::min(best, x.measured);
    if (x.rank_pred == 1) searched = x.measured;
  }
  const double ratio = after(r.out, "searched / best measured: ");
  ASSERT_TRUE(std::isfinite(ratio)) << r.out;
  EXPECT_GE(ratio, 1.0) << r.out;
  // Printed to 4 decimals from times printed to 3 (ms): a few 1e-4 of rounding.
  EXPECT_NEAR(ratio, searched / best, 1e-3 * ratio) << r.out;

  // The median |error| over the rows, to its printed precision.
  std::vector<double> errs;
  for (const Row& x : rows) errs.push_back(std::fabs(x.error));
  std::sort(errs.begin(), errs.end());
  const size_t n = errs.size();
  const double med = n % 2 ? errs[n / 2] : 0.5 * (errs[n / 2 - 1] + errs[n / 2]);
  EXPECT_NEAR(after(r.out, "median |prediction error|: "), med, 0.1) << r.out;
}

TEST(BenchSearch, HelpAndBadInput) {
  weft::test::CommandResult help = weft::test::run_weft("bench search --help");
  ASSERT_EQ(help.code, 0) << help.out;
  for (const char* opt : {"--quick", "--steps", "--config", "--world", "--top", "--rounds", "--set",
                          "--all-variants"})
    EXPECT_NE(help.out.find(opt), std::string::npos) << opt;
  weft::test::CommandResult all = weft::test::run_weft("bench --help");
  EXPECT_NE(all.out.find("weft bench search"), std::string::npos) << all.out;
  // Refused before anything runs: exit 2, naming the option.
  weft::test::CommandResult bad = weft::test::run_weft("bench search --steps 1");
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find("--steps"), std::string::npos) << bad.out;
}

}  // namespace
