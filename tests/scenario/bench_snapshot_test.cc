// `weft bench snapshot` end to end: the encode part prints every row with positive numbers,
// the bytes each row accounts for, the target line and its progress; the overhead and
// recovery parts, on a tiny config S and a few steps (node-loss: on three loopback nodes), print every row of their tables with
// the ratio columns and the target lines, and end 0; bad options are ConfigErrors naming
// them. Behaviour, not timing: no number is compared with a threshold.
#include <gtest/gtest.h>

#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "base/config.h"
#include "tests/support/bench_output.h"
#include "tests/support/run_weft.h"

namespace {

using Result = weft::test::CommandResult;
Result run(const std::string& args) { return weft::test::run_weft(args); }

using weft::test::bench_section;

// The numbers after the row label (MiB, ms, GB/s, x memcpy); empty when the row is absent.
std::vector<double> row(const std::vector<std::string>& sec, const std::string& label) {
  for (const std::string& l : sec) {
    if (l.rfind(label, 0) != 0) continue;
    std::stringstream ss(l.substr(label.size()));
    std::vector<double> nums;
    for (double x; ss >> x;) nums.push_back(x);
    return nums;
  }
  return {};
}

TEST(BenchSnapshot, EncodePartPrintsEveryRow) {
  if (!WEFT_HAVE_ISAL) GTEST_SKIP() << "built without ISA-L: the erasure code is not there";
  Result r = run("bench snapshot --parts encode --mib 4");
  ASSERT_EQ(r.code, 0) << r.out;
  std::vector<std::string> sec = bench_section(r.out, "encode: 4 MiB per fragment");
  ASSERT_FALSE(sec.empty()) << r.out;
  // Label and the MiB it must account for: one fragment for memcpy and crc32c, the k data
  // fragments of the stripe for encode and rebuild.
  const std::vector<std::pair<std::string, double>> rows = {
      {"memcpy into touched memory", 4},   {"crc32c", 4},
      {"encode k=2 m=1 (data bytes)", 8},  {"rebuild 1 lost data fragment k=2 m=1", 8},
      {"encode k=4 m=2 (data bytes)", 16}, {"rebuild 1 lost data fragment k=4 m=2", 16},
  };
  for (const auto& [label, mib] : rows) {
    std::vector<double> nums = row(sec, label);
    ASSERT_EQ(nums.size(), 4u) << label << "\n" << r.out;
    EXPECT_DOUBLE_EQ(nums[0], mib) << label << "\n" << r.out;
    for (double v : nums) EXPECT_GT(v, 0.0) << label << "\n" << r.out;
    // GB/s and the ratio agree with the memcpy row's GB/s (both printed to 2 decimals).
    const double memcpy_gbps = row(sec, "memcpy into touched memory")[2];
    EXPECT_NEAR(nums[3], nums[2] / memcpy_gbps, 0.02 + 0.01 * nums[3]) << label << "\n" << r.out;
  }
  EXPECT_EQ(row(sec, "memcpy into touched memory")[3], 1.0) << r.out;
  EXPECT_NE(r.out.find("target: encode >= 5 GB/s per core: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[bench snapshot] k=4 m=2: encode"), std::string::npos) << r.out;
}

// Config S shrunk to a model that trains a step in milliseconds: the parts' machinery, not
// their numbers.
const std::string kTiny =
    " --configs S --set model.layers=1 --set model.dim=32 --set model.heads=2"
    " --set model.seq_len=16 --mib 4";

// The cells of a table row "a | b | c" whose first cell is `first` and second `second`
// (empty when absent).
std::vector<std::string> cells(const std::vector<std::string>& sec, const std::string& first,
                               const std::string& second = "") {
  for (const std::string& l : sec) {
    std::vector<std::string> c;
    std::stringstream ss(l);
    for (std::string x; std::getline(ss, x, '|');) {
      const size_t a = x.find_first_not_of(' '), b = x.find_last_not_of(' ');
      c.push_back(a == std::string::npos ? "" : x.substr(a, b - a + 1));
    }
    if (c.size() >= 2 && c[0] == first && (second.empty() || c[1] == second)) return c;
  }
  return {};
}

bool is_number(const std::string& s) {
  char* end = nullptr;
  std::strtod(s.c_str(), &end);
  return !s.empty() && end && *end == '\0';
}

bool has_line(const std::vector<std::string>& sec, const std::string& prefix) {
  for (const std::string& l : sec)
    if (l.rfind(prefix, 0) == 0) return true;
  return false;
}

TEST(BenchSnapshot, OverheadPartPrintsEveryRowAndTheRatios) {
  Result r = run("bench snapshot --parts overhead" + kTiny + " --steps 4 --copies 2 --every 2");
  ASSERT_EQ(r.code, 0) << r.out;
  std::vector<std::string> sec = bench_section(r.out, "overhead: per-step time");
  ASSERT_FALSE(sec.empty()) << r.out;
  EXPECT_TRUE(has_line(sec, "  config S: gpt 1 x 32")) << r.out;
  EXPECT_TRUE(has_line(sec, "  one thread in this process, 4 MiB per copy, best of 7: memcpy"))
      << r.out;
  const std::vector<std::string> head = cells(sec, "config", "every");
  ASSERT_EQ(head.size(), 11u) << r.out;
  EXPECT_EQ(head[5], "x base") << r.out;
  EXPECT_EQ(head[8], "x copy") << r.out;
  // The baseline, every 1 (two alternating runs each) and every 2, the interval named (one
  // run).
  for (const char* every : {"0", "1", "2"}) {
    const std::vector<std::string> c = cells(sec, "S", every);
    ASSERT_EQ(c.size(), 11u) << every << "\n" << r.out;
    EXPECT_EQ(c[2], std::string(every) == "2" ? "1" : "2") << every << "\n" << r.out;
    for (size_t i : {3, 4, 5, 9, 10})
      EXPECT_TRUE(is_number(c[i])) << every << " " << i << "\n" << r.out;
    for (size_t i : {6, 7, 8})  // +ms/snap, copy ms, x copy: none for the baseline
      EXPECT_TRUE(std::string(every) == "0" ? c[i] == "-" : is_number(c[i]))
          << every << " " << i << "\n"
          << r.out;
  }
  EXPECT_EQ(cells(sec, "S", "0")[5], "1.000") << r.out;
  EXPECT_TRUE(
      has_line(sec, "target: at every 1, what a snapshot adds <= 1.2 x the copy's own cost: "))
      << r.out;
  EXPECT_TRUE(has_line(sec, "target: <= 1% more step time at the default interval (2): ")) << r.out;
  // What a snapshot adds within the every-2 run, against the copy's cost.
  ASSERT_EQ(cells(sec, "S", "2").size(), 11u) << r.out;
  bool found = false;
  for (const std::string& l : sec) {
    std::vector<std::string> c = cells({l}, "S", "2");
    if (c.size() != 9u) continue;
    found = true;
    for (size_t i : {2, 3, 4, 6, 7}) EXPECT_TRUE(is_number(c[i])) << i << "\n" << r.out;
    for (size_t i : {5, 8}) EXPECT_EQ(c[i].back(), '%') << i << "\n" << r.out;
  }
  EXPECT_TRUE(found) << r.out;
  EXPECT_TRUE(has_line(sec, "  within a run")) << r.out;
  EXPECT_TRUE(has_line(sec, "interval: 2, as --every named it")) << r.out;
  EXPECT_NE(r.out.find("[bench snapshot] overhead S every=1 run 2: "), std::string::npos) << r.out;
}

TEST(BenchSnapshot, OverheadPartRecommendsAnInterval) {
  Result r = run("bench snapshot --parts overhead" + kTiny + " --steps 2 --rounds 1 --copies 1");
  ASSERT_EQ(r.code, 0) << r.out;
  std::vector<std::string> sec = bench_section(r.out, "overhead: per-step time");
  const std::string say = "recommended default: snapshot.every ";
  std::string line;
  for (const std::string& l : sec)
    if (l.rfind(say, 0) == 0) line = l;
  ASSERT_FALSE(line.empty()) << r.out;
  const int k = std::atoi(line.c_str() + say.size());
  ASSERT_GE(k, 1) << r.out;
  for (const char* every : {"0", "1", "2"})
    EXPECT_EQ(cells(sec, "S", every).size(), 11u) << every << "\n" << r.out;
  // The interval it chose is measured too (every 1 and 2 are already).
  if (k > 2) {
    EXPECT_EQ(cells(sec, "S", std::to_string(k)).size(), 11u) << r.out;
  }
  EXPECT_NE(line.find("under 1% of the step"), std::string::npos) << r.out;
}

TEST(BenchSnapshot, RecoveryPartPrintsEveryPhaseSideBySide) {
  Result r = run("bench snapshot --parts recovery" + kTiny);
  ASSERT_EQ(r.code, 0) << r.out;
  std::vector<std::string> sec = bench_section(r.out, "recovery: config S: SIGKILL of rank 1 of 2");
  ASSERT_FALSE(sec.empty()) << r.out;
  EXPECT_TRUE(has_line(sec, "  snapshots: snapshot.every 1")) << r.out;
  EXPECT_TRUE(has_line(sec, "  checkpoint: checkpoint.every 5, saved right before the kill"))
      << r.out;
  EXPECT_NE(r.out.find("its page cache dropped before the kill"), std::string::npos) << r.out;
  const std::vector<std::string> head = cells(sec, "phase");
  ASSERT_EQ(head.size(), 4u) << r.out;
  EXPECT_EQ(head[1], "snapshots s") << r.out;
  EXPECT_EQ(head[2], "checkpoint s") << r.out;
  // Both sides' phases, and the snapshot restore's five parts (the checkpoint has none).
  for (const char* phase : {"detect", "restart", "restore", "first step", "total", "ready"}) {
    const std::vector<std::string> c = cells(sec, phase);
    ASSERT_EQ(c.size(), 4u) << phase << "\n" << r.out;
    EXPECT_TRUE(is_number(c[1]) && is_number(c[2])) << phase << "\n" << r.out;
  }
  for (const char* part : {"communicators", "plan", "read snapshots", "transfer", "resume"}) {
    const std::vector<std::string> c = cells(sec, part);
    ASSERT_EQ(c.size(), 4u) << part << "\n" << r.out;
    EXPECT_TRUE(is_number(c[1])) << part << "\n" << r.out;
    EXPECT_EQ(c[2], "-") << part << "\n" << r.out;
  }
  EXPECT_TRUE(has_line(sec, "ratio checkpoint / snapshots: ")) << r.out;
  EXPECT_NE(r.out.find("target: recovery >= 20x faster than the disk restart: "), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("[bench snapshot] recovery S snapshots: killed rank 1"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("[bench snapshot] recovery S checkpoint: first step after the restart"),
            std::string::npos)
      << r.out;
}

// Three loopback nodes of a tiny model whose width dp 3 and dp 2 divide (so every ZeRO-3 shard
// exists once and the lost one must come from snapshots): each side's phases, the live sides'
// resize-line parts, the ec rebuild, and the survivors' processes kept.
TEST(BenchSnapshot, NodeLossPartPrintsThreeSidesFromTheFailureKnown) {
  Result r = run(
      "bench snapshot --parts node-loss --configs S --set model.layers=1 --set model.dim=48"
      " --set model.heads=2 --set model.seq_len=16");
  ASSERT_EQ(r.code, 0) << r.out;
  std::vector<std::string> sec = bench_section(r.out, "node-loss: config S: a node lost whole");
  ASSERT_FALSE(sec.empty()) << r.out;
  EXPECT_TRUE(has_line(sec, "  config S: gpt 1 x 48")) << r.out;
  for (const char* side : {"replica", "ec"}) {
    const std::string prefix = std::string("  ") + side + ": elastic.on_change reshard";
    bool found = false;
    for (const std::string& l : sec)
      if (l.rfind(prefix, 0) == 0) {
        found = true;
        EXPECT_NE(l.find("survivors' worker processes kept"), std::string::npos) << l;
        // Under auto, with the interval it chose (a number of steps >= 1).
        const size_t at = l.find("snapshot.every auto (chose ");
        EXPECT_NE(at, std::string::npos) << l;
        if (at != std::string::npos) {
          EXPECT_GE(std::atoll(l.c_str() + at + 27), 1) << l;
        }
        EXPECT_NE(l.find(std::string(side) == "ec" ? "1 rebuilt from parity" : "1 replica"),
                  std::string::npos)
            << l;
      }
    EXPECT_TRUE(found) << side << "\n" << r.out;
  }
  EXPECT_TRUE(has_line(sec, "  checkpoint: elastic.on_change restart, checkpoint.every 6")) << r.out;
  const std::vector<std::string> head = cells(sec, "phase");
  ASSERT_EQ(head.size(), 5u) << r.out;
  EXPECT_EQ(head[1], "replica s") << r.out;
  EXPECT_EQ(head[2], "ec s") << r.out;
  EXPECT_EQ(head[3], "checkpoint s") << r.out;
  for (const char* phase : {"detect", "ready", "first step", "total", "second step"}) {
    const std::vector<std::string> c = cells(sec, phase);
    ASSERT_EQ(c.size(), 5u) << phase << "\n" << r.out;
    for (int i : {1, 2, 3}) EXPECT_TRUE(is_number(c[size_t(i)])) << phase << "\n" << r.out;
  }
  for (const char* part : {"membership", "communicators", "plan", "read snapshots", "transfer"}) {
    const std::vector<std::string> c = cells(sec, part);
    ASSERT_EQ(c.size(), 5u) << part << "\n" << r.out;
    EXPECT_TRUE(is_number(c[1]) && is_number(c[2])) << part << "\n" << r.out;
    EXPECT_EQ(c[3], "-") << part << "\n" << r.out;
  }
  for (const char* part : {"rendezvous", "restart", "load"}) {
    const std::vector<std::string> c = cells(sec, part);
    ASSERT_EQ(c.size(), 5u) << part << "\n" << r.out;
    EXPECT_EQ(c[1], "-") << part << "\n" << r.out;
    EXPECT_TRUE(is_number(c[3])) << part << "\n" << r.out;
  }
  const std::vector<std::string> fd = cells(sec, "fetch + decode");
  ASSERT_EQ(fd.size(), 5u) << r.out;
  EXPECT_TRUE(is_number(fd[2]) && std::strtod(fd[2].c_str(), nullptr) > 0) << r.out;
  // The rebuild's own stamps, ec only: it begins once the failure is known, ends after.
  const std::vector<std::string> begins = cells(sec, "rebuild begins"),
                                 ends = cells(sec, "rebuild ends");
  ASSERT_EQ(begins.size(), 5u) << r.out;
  ASSERT_EQ(ends.size(), 5u) << r.out;
  EXPECT_EQ(begins[1], "-") << r.out;
  EXPECT_EQ(ends[3], "-") << r.out;
  ASSERT_TRUE(is_number(begins[2]) && is_number(ends[2])) << r.out;
  EXPECT_GE(std::strtod(begins[2].c_str(), nullptr), 0) << r.out;
  EXPECT_GE(std::strtod(ends[2].c_str(), nullptr), std::strtod(begins[2].c_str(), nullptr))
      << r.out;
  EXPECT_TRUE(has_line(sec, "ratio checkpoint / replica: ")) << r.out;
  EXPECT_TRUE(has_line(sec, "ratio checkpoint / ec: ")) << r.out;
  EXPECT_TRUE(has_line(sec, "  ec rebuild (the agent's line): ")) << r.out;
}

TEST(BenchSnapshot, BadOptionsAreConfigErrorsNamingThem) {
  Result r = run("bench snapshot --parts encode,nope --mib 4");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--parts"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("nope"), std::string::npos) << r.out;
  r = run("bench snapshot --mib 0");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--mib"), std::string::npos) << r.out;
  r = run("bench snapshot --parts overhead --configs S,lots");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--configs"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("lots"), std::string::npos) << r.out;
  r = run("bench snapshot --parts overhead --configs S --ranks 3");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--ranks"), std::string::npos) << r.out;
  r = run("bench snapshot --parts recovery --configs 5B");  // ~275 GB: nowhere near fits
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--configs"), std::string::npos) << r.out;
}

TEST(BenchSnapshot, HelpListsTheParts) {
  Result r = run("bench snapshot --help");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("--parts"), std::string::npos) << r.out;
  for (const char* part : {"encode", "overhead", "recovery", "node-loss"})
    EXPECT_NE(r.out.find(part), std::string::npos) << part << "\n" << r.out;
  r = run("bench --help");
  EXPECT_NE(r.out.find("weft bench snapshot"), std::string::npos) << r.out;
}

}  // namespace
