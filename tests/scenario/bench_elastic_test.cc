// `weft bench elastic` end to end with a tiny model: --mode restart (three agents, one killed
// after the first checkpoint, a table with the five phases and the total) and --mode both
// (one job per side, checkpoint-restart and live, through a graceful leave, a join and a
// failure; a row per change in each table, each ratio against its cells). Structure,
// positive times and bytes against the minimum, not timing.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "tests/support/run_weft.h"

namespace {

template <typename... A>
std::string str_of(const A&... a) {
  std::ostringstream s;
  (s << ... << a);
  return s.str();
}

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

// The cells of a table line split at '|', trimmed.
std::vector<std::string> cells_of(const std::string& l) {
  std::vector<std::string> cells;
  std::stringstream parts(l);
  for (std::string c; std::getline(parts, c, '|');) {
    size_t a = c.find_first_not_of(' '), b = c.find_last_not_of(' ');
    cells.push_back(a == std::string::npos ? "" : c.substr(a, b - a + 1));
  }
  return cells;
}

// "12.3x" of two times printed to 1 ms: the ratio of the unrounded times, to one decimal.
void expect_ratio(const std::string& cell, double base, double ours, const std::string& where) {
  ASSERT_FALSE(cell.empty()) << where;
  ASSERT_EQ(cell.back(), 'x') << where;
  const double slack = 0.051 + base / ours * (0.0005 / ours + 0.0005 / base);
  EXPECT_NEAR(std::stod(cell), base / ours, slack) << where;
}

// --mode both: one job per side through two graceful leaves one at a time (4 -> 3 -> 2), a
// join (2 -> 4) and a failure (4 -> 3); the downtime side by side in both measures, the path of each change on
// each side, and the live side's phases and bytes.
TEST(BenchElastic, TinyBothPrintsEveryChangeOnBothSidesAndEndsOk) {
  weft::test::CommandResult r = weft::test::run_weft(
      "bench elastic --mode both --set model.layers=2 --set model.dim=32 --set model.heads=2 "
      "--set model.vocab=256 --heartbeat-timeout 2 --timeout 240");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("4 nodes x 1 worker on 127.0.0.1: weft run --nnodes 2:4"),
            std::string::npos)
      << r.out;
  // dp alone at zero 0: nothing a kill could lose, so no snapshots.
  EXPECT_NE(r.out.find("snapshots: none on either side: at world 4 every state box is held by 4 "
                       "ranks"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("restart leave-a: the job stopped; relaunched 3 agents with --resume"),
            std::string::npos)
      << r.out;
  const std::pair<const char*, const char*> worlds[] = {
      {"leave-a", "4 -> 3"}, {"leave-b", "3 -> 2"}, {"join", "2 -> 4"}, {"failure", "4 -> 3"}};
  // downtime | world | reshard | restart | ratio | reshard | restart | ratio | change: the
  // first row with the name is the downtime table's.
  for (const auto& [name, world] : worlds) {
    std::vector<std::string> d = row(r.out, name);
    ASSERT_EQ(d.size(), 9u) << name << "\n" << r.out;
    EXPECT_EQ(d[1], world) << name;
    const double live = std::stod(d[2]), restart = std::stod(d[3]);
    EXPECT_GT(live, 0) << name;
    EXPECT_GT(restart, 0) << name;
    expect_ratio(d[4], restart, live, str_of(name, " from the notice"));
    const double live_idle = std::stod(d[5]), restart_idle = std::stod(d[6]);
    EXPECT_GT(live_idle, 0) << name;  // the new world is ready after the old one's last step
    EXPECT_GT(restart_idle, 0) << name;
    expect_ratio(d[7], restart_idle, live_idle, str_of(name, " no rank trains"));
    EXPECT_FALSE(d[8].empty()) << name;
    // Each side's path of the change, from the notice to the first step.
    for (const char* side : {"reshard", "restart"}) {
      const std::string head = std::string("  ") + side + " " + name + ":";
      const size_t at = r.out.find(head);
      ASSERT_NE(at, std::string::npos) << head << "\n" << r.out;
      const std::string line = r.out.substr(at, r.out.find('\n', at) - at);
      EXPECT_NE(line.find("last old step ("), std::string::npos) << line;
      EXPECT_NE(line.find(", first step +"), std::string::npos) << line;
      // The restart side resumes a checkpoint and says at which step.
      if (std::string(side) == "restart") {
        EXPECT_NE(line.find("resumed at step "), std::string::npos) << line;
      }
    }
  }
  // The phases and the bytes: the rows after the tables' headers.
  std::stringstream lines(r.out);
  int phases = 0, bytes = 0;
  std::string table;
  for (std::string l; std::getline(lines, l);) {
    if (l.rfind("phases ", 0) == 0 || l.rfind("bytes ", 0) == 0)
      table = l.substr(0, l.find(' '));
    else if (l.empty() || l.find('|') == std::string::npos)
      table.clear();
    else if (table == "phases") {
      std::vector<std::string> c = cells_of(l);
      ASSERT_EQ(c.size(), 8u) << l;
      for (size_t k = 1; k < 7; ++k) EXPECT_GE(std::stod(c[k]), 0) << l;
      ++phases;
    } else if (table == "bytes") {
      std::vector<std::string> c = cells_of(l);
      ASSERT_EQ(c.size(), 10u) << l;
      EXPECT_GT(std::stoi(c[1]), 0) << l;  // holders
      for (size_t k = 2; k < 6; ++k) EXPECT_GE(std::stod(c[k]), 0) << l;
      // The transfer's rate and its ratio to memcpy where bytes moved between ranks, "-" else;
      // the ratio once all ranks were in is over a part of the same phase: never lower, and
      // "-" where the resize line's 10 ms resolution leaves nothing of the phase after the
      // wait (the tiny join moves 0.8 MiB in about as long as its ranks take to arrive).
      if (std::stod(c[2]) > 0 && c[6] != "-") {
        EXPECT_GT(std::stod(c[6]), 0) << l;
        ASSERT_FALSE(c[7].empty()) << l;
        EXPECT_EQ(c[7].back(), 'x') << l;
        EXPECT_GT(std::stod(c[7]), 0) << l;
        if (c[8] != "-") {
          EXPECT_EQ(c[8].back(), 'x') << l;
          EXPECT_GE(std::stod(c[8]), std::stod(c[7])) << l;
        }
      } else {
        EXPECT_EQ(c[6], "-") << l;
        EXPECT_EQ(c[7], "-") << l;
        EXPECT_EQ(c[8], "-") << l;
      }
      // Never less than the minimum between ranks (what the new layout needs that its rank
      // does not hold); a DP shrink keeps every byte where it is: nothing moves or is copied.
      EXPECT_GE(std::stod(c[2]), std::stod(c[3]) - 0.05) << l;
      // A leave ends the old world at a step boundary: every survivor holds the same step. A
      // failure may catch the step's statistics exchange done on some survivors and not on
      // another (the victim died as the last of it went round): those go on to update and
      // hold the next step, the other stays one behind and is sent a replica (the suite saw
      // holders 2 of 3 once: 0.4 MiB between ranks, the new rank 0 kept nothing).
      const bool all_hold = c[0] != "failure" || std::stoi(c[1]) == 3;
      if (c[0] == "leave-a" || c[0] == "leave-b" || (c[0] == "failure" && all_hold)) {
        EXPECT_EQ(std::stod(c[2]), 0) << l;  // between ranks
        EXPECT_EQ(std::stod(c[5]), 0) << l;  // copied
        EXPECT_GT(std::stod(c[4]), 0) << l;  // kept
      } else if (c[0] == "failure") {
        EXPECT_EQ(std::stoi(c[1]), 2) << l;  // two of the three survivors, one behind
        EXPECT_GT(std::stod(c[2]), 0) << l;  // a replica to the one behind
      }
      if (c[0] == "join") {
        EXPECT_GT(std::stod(c[3]), 0) << l;  // two newcomers need replicas
      }
      ++bytes;
    }
  }
  EXPECT_EQ(phases, 4) << r.out;
  EXPECT_EQ(bytes, 4) << r.out;
  // Each leave was one epoch, and both leaving agents handed over and exited 0.
  EXPECT_NE(r.out.find("leaves: epochs per resize leave-a 1, leave-b 1; the leaving agents "
                       "exited with 0, 0\n"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("job: ok: every change resharded live"), std::string::npos) << r.out;
}

// --mode reshard under ZeRO-3 (every rank's shards exist once): the bench takes in-memory
// snapshots on its own (auto, replica), says why in its header, and its failure row resumes
// from them, at a step after 0, instead of starting over; "read snapshots" is a column.
TEST(BenchElastic, TinyZero3FailureResumesFromSnapshotsNotFromStepZero) {
  weft::test::CommandResult r = weft::test::run_weft(
      "bench elastic --mode reshard --set parallel.zero=3 --set model.layers=2 --set model.dim=32 "
      "--set model.heads=2 --set model.vocab=256 --heartbeat-timeout 2 --timeout 300");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("snapshots (live side only): snapshot.every auto, snapshot.redundancy "
                       "replica (the bench's): at world 4 the plan holds "),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find(" of state on one rank only ("), std::string::npos) << r.out;
  std::vector<std::string> d = row(r.out, "failure");
  ASSERT_EQ(d.size(), 9u) << r.out;
  EXPECT_EQ(d[1], "4 -> 3");
  EXPECT_GT(std::stod(d[2]), 0);
  // "...; state from in-memory snapshots (3 own, 1 replica) of step S, N steps back"
  const size_t at = d[8].find("; state from in-memory snapshots (");
  ASSERT_NE(at, std::string::npos) << d[8];
  EXPECT_NE(d[8].find("replica", at), std::string::npos) << d[8];  // the lost node's copy
  const size_t of = d[8].find(") of step ", at);
  ASSERT_NE(of, std::string::npos) << d[8];
  long long step = -1, back = -1;
  ASSERT_EQ(std::sscanf(d[8].c_str() + of, ") of step %lld, %lld", &step, &back), 2) << d[8];
  EXPECT_NE(d[8].find(back == 1 ? " step back" : " steps back", of), std::string::npos) << d[8];
  EXPECT_GT(step, 0) << d[8];  // not started over
  EXPECT_GE(back, 0) << d[8];
  // The phases table has "read snapshots" as a column of its own.
  std::stringstream lines(r.out);
  bool in_phases = false;
  int phases = 0;
  for (std::string l; std::getline(lines, l);) {
    if (l.rfind("phases ", 0) == 0) {
      std::vector<std::string> h = cells_of(l);
      ASSERT_EQ(h.size(), 9u) << l;
      EXPECT_EQ(h[4], "read snapshots") << l;
      in_phases = true;
    } else if (in_phases && l.find('|') != std::string::npos) {
      std::vector<std::string> c = cells_of(l);
      ASSERT_EQ(c.size(), 9u) << l;
      for (size_t k = 1; k < 8; ++k) EXPECT_GE(std::stod(c[k]), 0) << l;
      ++phases;
    } else {
      in_phases = false;
    }
  }
  EXPECT_EQ(phases, 4) << r.out;
  // The snapshots' cost: the first world's steady steps before and after the first snapshot.
  EXPECT_NE(r.out.find("snapshots' cost on the live side"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("snapshot.every auto: a snapshot every "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("job: ok: every change resharded live"), std::string::npos) << r.out;
}

// A snapshot choice that cannot survive the failure row of a layout that shards state is
// refused before anything starts, naming the key; zero 0 takes no snapshots.
TEST(BenchElastic, ASnapshotChoiceThatCannotSurviveTheFailureIsRefused) {
  const std::string tiny =
      " --set model.layers=2 --set model.dim=32 --set model.heads=2 --set model.vocab=256";
  for (const char* bad : {"snapshot.redundancy=none", "snapshot.every=0"}) {
    weft::test::CommandResult r = weft::test::run_weft(
        std::string("bench elastic --mode reshard --set parallel.zero=3 --set ") + bad + tiny);
    EXPECT_EQ(r.code, 2) << bad << "\n" << r.out;
    const std::string key = std::string(bad).substr(0, std::string(bad).find('='));
    EXPECT_NE(r.out.find(key), std::string::npos) << bad << "\n" << r.out;
    EXPECT_NE(r.out.find("cannot survive the failure row"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("on one rank only"), std::string::npos) << r.out;
  }
  weft::test::CommandResult wide = weft::test::run_weft(
      "bench elastic --mode reshard --set parallel.zero=1 --set snapshot.redundancy=ec "
      "--set snapshot.ec.k=4" + tiny);
  EXPECT_EQ(wide.code, 2) << wide.out;
  EXPECT_NE(wide.out.find("snapshot.ec"), std::string::npos) << wide.out;
}

// The live side's snapshots are checked against this machine's memory beside the workers,
// before anything starts: a ZeRO-3 job whose workers fit but not with their snapshots
// (replica: three slots of a rank's payload and a copy of the next node's) is refused naming
// snapshot.every. The size is taken from MemAvailable: about 29 bytes a parameter for the
// workers and 61 for the snapshots at world 4 (printed by the refusals), so 0.9 x MemAvailable
// / 50 parameters leaves a wide margin on both sides whatever this machine has free.
TEST(BenchElastic, LiveSnapshotsThatDoNotFitBesideTheWorkersAreRefusedBeforeAnythingStarts) {
  const weft::test::CommandResult mem =
      weft::test::run_command("awk '/^MemAvailable:/ {print $2}' /proc/meminfo");
  const double avail = std::stod(mem.out) * 1024;
  ASSERT_GT(avail, 1e9) << mem.out;
  const long params = long(0.9 * avail / 50);
  // timeout: were the check gone, the bench would start its jobs; SIGTERM lets it reap them.
  const weft::test::CommandResult r = weft::test::run_command(
      str_of("timeout 120 ", WEFT_BINARY, " bench elastic --mode reshard --set parallel.zero=3 ",
             "--params ", params));
  EXPECT_EQ(r.code, 2) << params << " parameters\n" << r.out;
  EXPECT_NE(r.out.find("snapshot.every: the live side's in-memory snapshots (replica) take about"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("with the workers'"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("--params: the job needs"), std::string::npos) << r.out;
}

TEST(BenchElastic, BadOptionsAreRefused) {
  weft::test::CommandResult r = weft::test::run_weft("bench elastic --mode sideways");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("expected restart, reshard, both or spare"), std::string::npos) << r.out;
  weft::test::CommandResult five = weft::test::run_weft("bench elastic --mode reshard --nodes 5");
  EXPECT_EQ(five.code, 2) << five.out;
  EXPECT_NE(five.out.find("--nodes"), std::string::npos) << five.out;
  weft::test::CommandResult two = weft::test::run_weft("bench elastic --mode restart --nodes 2");
  EXPECT_EQ(two.code, 2) << two.out;
  EXPECT_NE(two.out.find("--nodes"), std::string::npos) << two.out;
  // A model this machine cannot hold for its ranks is refused before anything starts.
  weft::test::CommandResult leaves =
      weft::test::run_weft("bench elastic --mode both --leaves sideways");
  EXPECT_EQ(leaves.code, 2) << leaves.out;
  EXPECT_NE(leaves.out.find("--leaves"), std::string::npos) << leaves.out;
  // A fixed tp that one of the worlds (4, 3, 2) cannot hold is refused before anything
  // starts, naming the way out; under elastic.layout: auto it would be lowered instead.
  weft::test::CommandResult tp =
      weft::test::run_weft("bench elastic --mode reshard --set parallel.tp=2");
  EXPECT_EQ(tp.code, 2) << tp.out;
  EXPECT_NE(tp.out.find("elastic.layout: auto"), std::string::npos) << tp.out;
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
  for (const char* opt : {"--mode", "--leaves", "--nodes", "--config", "--params", "--set",
                          "--threads", "--heartbeat-timeout", "--timeout", "--dir"})
    EXPECT_NE(help.out.find(opt), std::string::npos) << opt;
  weft::test::CommandResult all = weft::test::run_weft("bench --help");
  EXPECT_NE(all.out.find("weft bench elastic"), std::string::npos) << all.out;
}

}  // namespace
