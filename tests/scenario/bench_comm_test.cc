// `weft bench comm --quick` end to end: it runs real ranks (Gloo, and MPI where mpirun
// exists) and prints a table row with positive numbers for every size. Behaviour, not timing.
#include <gtest/gtest.h>

#include "tests/support/run_weft.h"
#include <sys/wait.h>

#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

namespace {


using Result = weft::test::CommandResult;
Result run(const std::string& args) { return weft::test::run_weft(args); }

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string l; std::getline(ss, l);) out.push_back(l);
  return out;
}

// The lines of the section whose "== title" line starts with `title`, up to the next blank line.
std::vector<std::string> section(const std::vector<std::string>& lines, const std::string& title) {
  std::vector<std::string> out;
  bool in = false;
  for (const std::string& l : lines) {
    if (l.rfind("== " + title, 0) == 0)
      in = true;
    else if (in && (l.empty() || l.rfind("== ", 0) == 0))
      break;
    else if (in)
      out.push_back(l);
  }
  return out;
}

// The numbers of the row labelled `label` ("4 KiB", "      8  set"), or empty when absent.
std::vector<double> row(const std::vector<std::string>& sec, const std::string& label) {
  for (const std::string& l : sec) {
    size_t at = l.find_first_not_of(' ');
    if (at == std::string::npos || l.compare(at, label.size(), label) != 0) continue;
    std::stringstream ss(l.substr(at + label.size()));
    std::vector<double> nums;
    for (std::string tok; ss >> tok;)
      if (tok != "|") nums.push_back(std::stod(tok));
    return nums;
  }
  return {};
}

TEST(BenchComm, QuickRunPrintsARowPerSizeWithPositiveNumbers) {
  Result r = run("bench comm --quick --ranks 2 --sizes 4096,65536");
  ASSERT_EQ(r.code, 0) << r.out;
  const std::vector<std::string> lines = lines_of(r.out);
  EXPECT_NE(r.out.find("memcpy:"), std::string::npos) << r.out;
  for (const char* op : {"all_reduce", "all_gather"}) {
    std::vector<std::string> sec = section(lines, op);
    ASSERT_GE(sec.size(), 4u) << op << "\n" << r.out;
    // One column of (us, busbw, frac) per backend run; Gloo always builds here.
    ASSERT_NE(sec[0].find("gloo n=2"), std::string::npos) << sec[0];
    size_t runs = 0;
    for (size_t at = 0; (at = sec[0].find("n=", at)) != std::string::npos; ++at) ++runs;
    for (const char* size : {"4 KiB", "64 KiB"}) {
      std::vector<double> nums = row(sec, size);
      ASSERT_EQ(nums.size(), 3 * runs) << op << " " << size << "\n" << r.out;
      for (double v : nums) EXPECT_GT(v, 0.0) << op << " " << size << "\n" << r.out;
    }
  }
  std::vector<std::string> store = section(lines, "store:");
  for (const char* op : {"set", "get", "add"}) {
    std::vector<double> nums = row(store, std::string("8  ") + op);
    ASSERT_EQ(nums.size(), 3u) << op << "\n" << r.out;
    for (double v : nums) EXPECT_GT(v, 0.0) << op << "\n" << r.out;
  }
}

TEST(BenchComm, UnknownBackendIsAConfigError) {
  Result r = run("bench comm --quick --backends nccl");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--backends"), std::string::npos) << r.out;
}

}  // namespace
