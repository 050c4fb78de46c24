// `weft bench store` end to end, small: 200 authenticated clients complete a rendezvous (all
// connected at once) and the load table has a row per op. Structure and counts, not timing.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "tests/support/run_weft.h"

namespace {

// The cells of each table line, split at '|' and spaces
// ("    200 |       200       200       200 |     0.035 ..." -> {"200", "200", ...}).
std::vector<std::vector<std::string>> table_lines(const std::string& out) {
  std::vector<std::vector<std::string>> rows;
  std::stringstream lines(out);
  for (std::string l; std::getline(lines, l);) {
    if (l.find('|') == std::string::npos) continue;
    std::stringstream cells(l);
    std::vector<std::string> v;
    for (std::string c; cells >> c;)
      if (c != "|") v.push_back(c);
    rows.push_back(v);
  }
  return rows;
}

// The line with `size` cells whose cell `at` is `value`; empty when there is none.
std::vector<std::string> row(const std::string& out, size_t size, size_t at,
                             const std::string& value) {
  for (const auto& v : table_lines(out))
    if (v.size() == size && v[at] == value) return v;
  return {};
}

TEST(BenchStore, SmallRunCompletesTheRendezvousForEveryClient) {
  weft::test::CommandResult r =
      weft::test::run_weft("bench store --clients 200 --seconds 0.2 --load-clients 200");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("rendezvous of 200 clients: completed 200 of 200"), std::string::npos)
      << r.out;

  // clients | completed, peak conn, srv peak | all conn, barrier, wall | clients/s |
  // conn p50, p99, max | retries
  std::vector<std::string> v = row(r.out, 12, 0, "200");
  ASSERT_EQ(v.size(), 12u) << r.out;
  EXPECT_EQ(v[1], "200") << "completed";
  EXPECT_EQ(v[2], "200") << "not all clients were connected at once (clients' count)";
  EXPECT_EQ(v[3], "200") << "not all clients were connected at once (server's count)";
  for (size_t i = 4; i <= 10; ++i) EXPECT_GT(std::stod(v[i]), 0) << "cell " << i << "\n" << r.out;
  EXPECT_NE(r.out.find("vs PyTorch's libuv TCPStore"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("x that rate"), std::string::npos) << r.out;

  for (const char* op : {"set", "get", "add"}) {
    // clients, op | p50 us, p99 us | ops/s
    std::vector<std::string> l = row(r.out, 5, 1, op);
    ASSERT_EQ(l.size(), 5u) << op << "\n" << r.out;
    EXPECT_EQ(l[0], "200") << op;
    EXPECT_GT(std::stod(l[2]), 0) << op;  // p50 us
    EXPECT_GT(std::stod(l[4]), 0) << op;  // ops/s
  }
}

TEST(BenchStore, HelpNamesTheOptionsAndACountPastTheFileLimitIsRefused) {
  weft::test::CommandResult help = weft::test::run_weft("bench store --help");
  ASSERT_EQ(help.code, 0) << help.out;
  for (const char* opt : {"--clients", "--seconds", "--load-clients", "--threads"})
    EXPECT_NE(help.out.find(opt), std::string::npos) << opt;
  weft::test::CommandResult too_many =
      weft::test::run_weft("bench store --clients 2000000000 --scenarios rendezvous");
  EXPECT_EQ(too_many.code, 2) << too_many.out;
  EXPECT_NE(too_many.out.find("RLIMIT_NOFILE"), std::string::npos) << too_many.out;
}

}  // namespace
