// `weft bench snapshot --mib 4` end to end: the encode part prints every row with positive
// numbers, the bytes each row accounts for, the target line and its progress; bad options
// are ConfigErrors naming them. Behaviour, not timing.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "base/config.h"
#include "tests/support/run_weft.h"

namespace {

using Result = weft::test::CommandResult;
Result run(const std::string& args) { return weft::test::run_weft(args); }

// The lines after the "== title" line that starts with `title`, up to a blank line.
std::vector<std::string> section(const std::string& text, const std::string& title) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  bool in = false;
  for (std::string l; std::getline(ss, l);) {
    if (l.rfind("== " + title, 0) == 0)
      in = true;
    else if (in && (l.empty() || l.rfind("== ", 0) == 0))
      break;
    else if (in)
      out.push_back(l);
  }
  return out;
}

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
  Result r = run("bench snapshot --mib 4");
  ASSERT_EQ(r.code, 0) << r.out;
  std::vector<std::string> sec = section(r.out, "encode: 4 MiB per fragment");
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

TEST(BenchSnapshot, BadOptionsAreConfigErrorsNamingThem) {
  Result r = run("bench snapshot --parts encode,nope --mib 4");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--parts"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("nope"), std::string::npos) << r.out;
  r = run("bench snapshot --mib 0");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--mib"), std::string::npos) << r.out;
}

TEST(BenchSnapshot, HelpListsTheParts) {
  Result r = run("bench snapshot --help");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("--parts"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("encode"), std::string::npos) << r.out;
  r = run("bench --help");
  EXPECT_NE(r.out.find("weft bench snapshot"), std::string::npos) << r.out;
}

}  // namespace
