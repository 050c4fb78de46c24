// `weft bench checkpoint --quick` end to end: small sizes, every row of the three tables
// present with positive numbers, scratch files removed. Behaviour, not timing.
#include <gtest/gtest.h>

#include "tests/support/bench_output.h"
#include "tests/support/run_weft.h"
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

using Result = weft::test::CommandResult;
Result run(const std::string& args) { return weft::test::run_weft(args); }

using weft::test::bench_section;

// The numbers after the row label; "-" (no reference) is skipped. Empty when absent.
std::vector<double> row(const std::vector<std::string>& sec, const std::string& label) {
  for (const std::string& l : sec) {
    if (l.rfind(label, 0) != 0) continue;
    std::stringstream ss(l.substr(label.size()));
    std::vector<double> nums;
    for (std::string tok; ss >> tok;)
      if (tok != "-") nums.push_back(std::stod(tok));
    return nums;
  }
  return {};
}

void expect_positive(const std::vector<std::string>& sec, const std::string& label, size_t count,
                     const std::string& out) {
  std::vector<double> nums = row(sec, label);
  ASSERT_EQ(nums.size(), count) << label << "\n" << out;
  for (double v : nums) EXPECT_GT(v, 0.0) << label << "\n" << out;
}

TEST(BenchCheckpoint, QuickRunPrintsEveryRowWithPositiveNumbers) {
  // A scratch root of our own: the bench must leave nothing behind in it.
  fs::path tmp = fs::temp_directory_path() / ("weft-ckbench-test-" + std::to_string(::getpid()));
  fs::create_directories(tmp);
  Result r = run("bench checkpoint --quick --dir " + tmp.string());
  ASSERT_EQ(r.code, 0) << r.out;

  std::vector<std::string> disk = bench_section(r.out, "disk:");
  expect_positive(disk, "raw sequential write (fsync)", 3, r.out);
  expect_positive(disk, "raw sequential read (cold)", 3, r.out);
  expect_positive(disk, "checkpoint save (sync, fsync)", 4, r.out);
  expect_positive(disk, "checkpoint load (cold)", 4, r.out);

  std::vector<std::string> steps = bench_section(r.out, "step time:");
  for (const char* mode : {"save none", "save sync", "save async"}) {
    std::vector<double> nums = row(steps, mode);
    ASSERT_EQ(nums.size(), 4u) << mode << "\n" << r.out;
    EXPECT_GT(nums[0], 0.0) << mode << ": median step ms\n" << r.out;
    if (std::string(mode) != "save none") {
      EXPECT_GT(nums[1], 0.0) << mode << ": time inside the save hook\n" << r.out;
    }
  }

  std::vector<std::string> reshard = bench_section(r.out, "reshard:");
  expect_positive(reshard, "memcpy (1 thread, 256 MiB)", 3, r.out);
  for (const char* t : {"gloo", "shm"}) {
    expect_positive(reshard, std::string("reshard ") + t + ": bytes between ranks", 4, r.out);
    expect_positive(reshard, std::string("reshard ") + t + ": all bytes (+ local)", 4, r.out);
  }
  expect_positive(reshard, "memcpy bound (all bytes, 1 copy)", 4, r.out);
  expect_positive(reshard, "memcpy into fresh memory", 4, r.out);
  expect_positive(reshard, "shm channel, 2 ranks, warm memory", 4, r.out);
  expect_positive(reshard, "shm speed-up over gloo (x)", 1, r.out);
  expect_positive(reshard, "shm all bytes vs fresh memcpy", 1, r.out);
  // The router's peak per rank, each run's within the larger holding plus the budget (all
  // three rounded alike, so the order survives the rounding).
  const std::regex peak(R"(r(\d) ([\d.]+) / ([\d.]+) / ([\d.]+))");
  int ranks = 0;
  for (std::sregex_iterator it(r.out.begin(), r.out.end(), peak), end; it != end; ++it, ++ranks) {
    const double gloo = std::stod((*it)[2]), shm = std::stod((*it)[3]), bound = std::stod((*it)[4]);
    EXPECT_GT(gloo, 0.0) << it->str();
    EXPECT_LE(gloo, bound) << it->str();
    EXPECT_LE(shm, bound) << it->str();
  }
  EXPECT_EQ(ranks, 4) << "no peak per rank for each of the 4 ranks\n" << r.out;

  EXPECT_TRUE(fs::is_empty(tmp)) << "scratch files left under " << tmp;
  fs::remove_all(tmp);
}

TEST(BenchCheckpoint, ZeroStepsIsAConfigError) {
  Result r = run("bench checkpoint --quick --steps 0");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--steps"), std::string::npos) << r.out;
}

}  // namespace
