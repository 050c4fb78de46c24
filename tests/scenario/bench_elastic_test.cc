// `weft bench elastic` end to end with a tiny model: --mode restart (three agents, one killed
// after the first checkpoint, a table with the five phases and the total) and --mode both
// (that baseline, then one live job shrinks, grows and loses a node; a row per change in each
// table, with its ratios to the baseline). Structure
// and non-negative times, not timing.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "tests/support/run_weft.h"

namespace {

// The cells of the table line whose first cell is `name` ("detect    |  1.791 | 73.2% | a
// survivor's ..." -> {"detect", "1.791", "73.2%", "a survivor's ..."}); empty when none.
// Phases have 4 cells, the published references 3 (reference | seconds | this / it).
std::vector<std::string> row(const std::string& out, const std::string& name) {
  std::stringstream lines(out);
  for (std::string l; std::getline(lines, l);) {
    std::vector<std::string> cells;
    std::stringstream parts(l);
    for (std::string c; std::getline(parts, c, '|');) {
      size_t a = c.find_first_not_of(' '), b = c.find_last_not_of(' ');
      cells.push_back(a == std::string::npos ? "" : c.substr(a, b - a + 1));
    }
    if (cells.size() >= 3 && cells[0] == name) return cells;
  }
  return {};
}

TEST(BenchElastic, TinyRestartPrintsFivePhasesAndTheTotal) {
  weft::test::CommandResult r = weft::test::run_weft(
      "bench elastic --mode restart --set model.layers=2 --set model.dim=32 --set model.heads=2 "
      "--set model.vocab=256 --heartbeat-timeout 2 --timeout 240");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("3 nodes x 1 worker on 127.0.0.1: weft run --nnodes 2:3 --max-restarts 1"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("killed node "), std::string::npos) << r.out;
  ASSERT_FALSE(row(r.out, "phase").empty()) << r.out;
  double sum = 0;
  for (const char* phase : {"detect", "rendezvous", "restart", "load", "first step"}) {
    std::vector<std::string> v = row(r.out, phase);
    ASSERT_EQ(v.size(), 4u) << phase << "\n" << r.out;
    EXPECT_GE(std::stod(v[1]), 0) << phase;
    EXPECT_EQ(v[2].back(), '%') << phase;
    EXPECT_GE(std::stod(v[2]), 0) << phase;
    EXPECT_FALSE(v[3].empty()) << phase;
    sum += std::stod(v[1]);
  }
  std::vector<std::string> total = row(r.out, "total");
  ASSERT_EQ(total.size(), 4u) << r.out;
  EXPECT_GT(std::stod(total[1]), 0);
  EXPECT_NEAR(sum, std::stod(total[1]), 0.01) << r.out;  // the phases split the total
  // It resumed from the checkpoint in a world of two, and says what it is the baseline of.
  EXPECT_NE(r.out.find("every survivor is a node of epoch 2 (2 nodes)"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("online resharding must beat"), std::string::npos) << r.out;
  std::vector<std::string> ref = row(r.out, "DynaTrain online switch, 235B MoE");
  ASSERT_EQ(ref.size(), 3u) << r.out;
  EXPECT_EQ(std::stod(ref[1]), 4.36);
  EXPECT_NE(ref[2].find("x (total)"), std::string::npos) << ref[2];
}

// --mode both: the restart baseline first, then the live job, with both ratios per change.
TEST(BenchElastic, TinyBothPrintsEveryChangeBothRatiosAndEndsOk) {
  weft::test::CommandResult r = weft::test::run_weft(
      "bench elastic --mode both --set model.layers=2 --set model.dim=32 --set model.heads=2 "
      "--set model.vocab=256 --heartbeat-timeout 2 --timeout 240");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("weft bench elastic --mode restart"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("weft run --nnodes 2:4 --max-restarts 0"), std::string::npos) << r.out;
  for (const char* table : {"change", "phases", "bytes"})
    EXPECT_FALSE(row(r.out, table).empty()) << table;
  // Each change has a row in each table (the first row with the name: the downtime table).
  const std::pair<const char*, const char*> worlds[] = {
      {"shrink", "4 -> 2"}, {"grow", "2 -> 3"}, {"failure", "3 -> 2"}};
  for (const auto& [name, world] : worlds) {
    std::vector<std::string> d = row(r.out, name);
    ASSERT_EQ(d.size(), 7u) << name << "\n" << r.out;
    EXPECT_EQ(d[1], world) << name;
    EXPECT_GT(std::stod(d[2]), 0) << name;
    if (std::string(name) == "failure") EXPECT_GE(std::stod(d[3]), 0);
    // The ratio is the restart's time (to the first step logged) over this downtime.
    ASSERT_EQ(d[5].back(), 'x') << name;
    EXPECT_NEAR(std::stod(d[5]), std::stod(d[4]) / std::stod(d[2]), 0.051) << name;
  }
  // The phases and the bytes: the rows after the tables' headers.
  std::stringstream lines(r.out);
  int phases = 0, bytes = 0, ready = 0;
  std::string table;
  for (std::string l; std::getline(lines, l);) {
    if (l.rfind("phases ", 0) == 0 || l.rfind("bytes ", 0) == 0 || l.rfind("change ", 0) == 0 ||
        l.rfind("ready ", 0) == 0)
      table = l.substr(0, l.find(' '));
    else if (l.empty())
      table.clear();
    else if (table == "ready") {
      // change | reshard | restart | ratio | what each side counts: without the first step,
      // so the live side's ready is within its downtime above.
      std::stringstream parts(l);
      std::vector<std::string> cells;
      for (std::string c; std::getline(parts, c, '|');) cells.push_back(c);
      ASSERT_EQ(cells.size(), 5u) << l;
      const double ours = std::stod(cells[1]), base = std::stod(cells[2]);
      EXPECT_GT(ours, 0) << l;
      EXPECT_GT(base, 0) << l;
      std::string name = cells[0].substr(0, cells[0].find(' '));
      EXPECT_LE(ours, std::stod(row(r.out, name)[2])) << l;
      // The ratio of the unrounded times, to one decimal; the cells are rounded to 1 ms.
      const double slack = 0.051 + base / ours * (0.0005 / ours + 0.0005 / base);
      EXPECT_NEAR(std::stod(cells[3]), base / ours, slack) << l;
      ++ready;
    } else if (table == "phases") {
      std::stringstream parts(l);
      std::vector<std::string> cells;
      for (std::string c; std::getline(parts, c, '|');) cells.push_back(c);
      ASSERT_EQ(cells.size(), 8u) << l;
      for (size_t k = 1; k < 7; ++k) EXPECT_GE(std::stod(cells[k]), 0) << l;
      ++phases;
    } else if (table == "bytes" && l.find('|') != std::string::npos) {
      std::stringstream parts(l);
      std::vector<std::string> cells;
      for (std::string c; std::getline(parts, c, '|');) cells.push_back(c);
      ASSERT_EQ(cells.size(), 7u) << l;
      EXPECT_GT(std::stoi(cells[1]), 0) << l;  // holders
      for (size_t k = 2; k < 6; ++k) EXPECT_GE(std::stod(cells[k]), 0) << l;
      // A shrink of data parallelism keeps every byte where it is: nothing moves, nothing
      // is copied (the router adopts the survivors' tensors).
      if (cells[0].rfind("shrink", 0) == 0) {
        EXPECT_EQ(std::stod(cells[2]), 0) << l;  // between ranks
        EXPECT_EQ(std::stod(cells[5]), 0) << l;  // copied
        EXPECT_GT(std::stod(cells[4]), 0) << l;  // kept
      }
      ++bytes;
    }
  }
  EXPECT_EQ(phases, 3) << r.out;
  EXPECT_EQ(bytes, 3) << r.out;
  EXPECT_EQ(ready, 3) << r.out;
  EXPECT_NE(r.out.find("job: ok: every change resharded live"), std::string::npos) << r.out;
}

TEST(BenchElastic, BadOptionsAreRefused) {
  weft::test::CommandResult r = weft::test::run_weft("bench elastic --mode sideways");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("expected restart, reshard or both"), std::string::npos) << r.out;
  weft::test::CommandResult five = weft::test::run_weft("bench elastic --mode reshard --nodes 5");
  EXPECT_EQ(five.code, 2) << five.out;
  EXPECT_NE(five.out.find("--nodes"), std::string::npos) << five.out;
  weft::test::CommandResult two = weft::test::run_weft("bench elastic --mode restart --nodes 2");
  EXPECT_EQ(two.code, 2) << two.out;
  EXPECT_NE(two.out.find("--nodes"), std::string::npos) << two.out;
  // A model this machine cannot hold for its ranks is refused before anything starts.
  for (const char* mode : {"restart", "reshard"}) {
    weft::test::CommandResult big =
        weft::test::run_weft(std::string("bench elastic --params 1000B --mode ") + mode);
    EXPECT_EQ(big.code, 2) << big.out;
    EXPECT_NE(big.out.find("available"), std::string::npos) << big.out;
  }
}

TEST(BenchElastic, HelpNamesTheOptions) {
  weft::test::CommandResult help = weft::test::run_weft("bench elastic --help");
  ASSERT_EQ(help.code, 0) << help.out;
  for (const char* opt : {"--mode", "--nodes", "--config", "--params", "--set", "--threads",
                          "--heartbeat-timeout", "--timeout", "--dir"})
    EXPECT_NE(help.out.find(opt), std::string::npos) << opt;
  weft::test::CommandResult all = weft::test::run_weft("bench --help");
  EXPECT_NE(all.out.find("weft bench elastic"), std::string::npos) << all.out;
}

}  // namespace
