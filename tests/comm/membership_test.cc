// The elastic membership's pure parts: the record's text encoding, the quorum rules
// (decide), and the validation of options and the timeout hierarchy. The concurrent
// behaviour of Rendezvous is in rendezvous_test.cc.
#include <gtest/gtest.h>

#include <string>

#include "base/error.h"
#include "comm/elastic/membership_record.h"
#include "comm/elastic/quorum.h"
#include "comm/elastic/rendezvous_options.h"

namespace weft::test {
namespace {

using namespace std::chrono_literals;
using comm::decide;
using comm::Decision;
using comm::MembershipRecord;
using comm::RendezvousOptions;
using comm::Verdict;

MembershipRecord epoch_record(int64_t epoch, std::map<std::string, int> members,
                              std::vector<std::string> spares = {},
                              std::vector<std::string> left = {}) {
  MembershipRecord r;
  r.version = 7;
  r.writer = "a";
  r.epoch = epoch;
  r.members = std::move(members);
  r.spares = std::move(spares);
  r.left = std::move(left);
  return r;
}

// --- The record ---------------------------------------------------------------------

TEST(MembershipRecord, RoundTripsThroughItsTextEncoding) {
  MembershipRecord r = epoch_record(3, {{"a", 0}, {"c", 2}, {"b", 1}}, {"d", "e"}, {"b"});
  r.closed = true;
  r.close_reason = "training finished\nat step 9";
  std::string text = comm::encode(r);
  EXPECT_EQ(text,
            "weft-rdzv 1\nversion 7\nwriter a\nepoch 3\nmember 0 a\nmember 1 b\nmember 2 c\n"
            "spare d\nspare e\nleft b\nclosed training finished at step 9\n");
  MembershipRecord back = comm::decode(text, "rdzv/job/state");
  EXPECT_EQ(back.version, 7);
  EXPECT_EQ(back.writer, "a");
  EXPECT_EQ(back.epoch, 3);
  EXPECT_EQ(back.members, r.members);
  EXPECT_EQ(back.spares, r.spares);
  EXPECT_EQ(back.left, r.left);
  EXPECT_TRUE(back.closed);
  EXPECT_EQ(back.close_reason, "training finished at step 9");
  EXPECT_EQ(back.rank_of("a"), 0);
  EXPECT_EQ(back.rank_of("b"), std::nullopt) << "a member that left has no rank";
  EXPECT_TRUE(back.is_spare("e"));
}

// The restart round rides in the record (a line only once one was asked) and every new epoch
// carries it: restart counts, (epoch - 1) + round, never go back.
TEST(MembershipRecord, TheRestartRoundRoundTripsAndCarriesIntoTheNextEpoch) {
  MembershipRecord r = epoch_record(2, {{"a", 0}, {"b", 1}, {"c", 2}}, {}, {"c"});
  EXPECT_EQ(comm::encode(r).find("round"), std::string::npos) << "round 0 writes no line";
  r.round = 3;
  const std::string text = comm::encode(r);
  EXPECT_NE(text.find("\nround 3\n"), std::string::npos) << text;
  EXPECT_EQ(comm::decode(text, "rdzv/job/state").round, 3);
  Decision d = decide(comm::decode(text, "rdzv/job/state"), {"a", "b"}, 1, 3, false);
  ASSERT_EQ(d.verdict, Verdict::kForm) << d.why;
  EXPECT_EQ(d.next.epoch, 3);
  EXPECT_EQ(d.next.round, 3);
  for (const char* bad : {"round 0\n", "round -1\n", "round x\n"})
    EXPECT_THROW(comm::decode(std::string("weft-rdzv 1\nversion 1\nwriter a\nepoch 1\n") + bad,
                              "rdzv/job/state"),
                 CommError)
        << bad;
}

// A live job's graceful leave: the member that hands its state over is listed in the next
// epoch as departed, with its old node rank; one that merely left (its workers failed) is not.
TEST(MembershipRecord, HandsOverAndDepartedRoundTripAndCarryIntoTheNextEpoch) {
  MembershipRecord r = epoch_record(3, {{"a", 0}, {"b", 1}, {"c", 2}}, {}, {"b", "c"});
  r.hands_over = {"b"};
  const std::string text = comm::encode(r);
  EXPECT_NE(text.find("\nhands_over b\n"), std::string::npos) << text;
  MembershipRecord back = comm::decode(text, "rdzv/job/state");
  EXPECT_EQ(back.hands_over, r.hands_over);
  Decision d = decide(back, {"a"}, 1, 3, false);
  ASSERT_EQ(d.verdict, Verdict::kForm) << d.why;
  EXPECT_EQ(d.next.departed, (std::map<std::string, int>{{"b", 1}}));
  EXPECT_TRUE(d.next.hands_over.empty());
  MembershipRecord next = comm::decode(comm::encode(d.next), "rdzv/job/state");
  EXPECT_EQ(next.departed, d.next.departed);
  // A node that hands over must have left.
  EXPECT_THROW(comm::decode("weft-rdzv 1\nversion 1\nwriter a\nepoch 1\nmember 0 a\n"
                            "hands_over a\n",
                            "rdzv/job/state"),
               CommError);
}

TEST(MembershipRecord, RefusesTextThatIsNotARecordNamingTheKeyAndLine) {
  auto refused = [](const std::string& text, const std::string& needle) {
    try {
      comm::decode(text, "rdzv/job/state");
    } catch (const CommError& e) {
      std::string m = e.what();
      EXPECT_NE(m.find("rdzv/job/state"), std::string::npos) << m;
      EXPECT_NE(m.find(needle), std::string::npos) << m;
      return;
    }
    ADD_FAILURE() << "accepted: " << text;
  };
  const std::string head = "weft-rdzv 1\nversion 1\nwriter a\nepoch 1\n";
  refused("", "empty");
  refused("12", "weft-rdzv 1");
  refused("weft-rdzv 2\n", "weft-rdzv 1");
  refused("weft-rdzv 1\nversion x\nwriter a\nepoch 0\n", "integer");
  refused(head + "member 0 a\nmember 0 b\n", "rank given twice");
  refused(head + "member 0 a\nmember 1 a\n", "node given twice");
  refused(head + "member 0 a\nleft b\n", "must be a member");
  refused(head + "member -1 a\n", "out of range");
  refused(head + "color blue\n", "unknown field");
  refused("weft-rdzv 1\nversion 1\nwriter a\n", "missing");
  refused("weft-rdzv 1\nversion 1\nwriter a\nepoch 0\nmember 0 a\n", "before epoch 1");
}

TEST(MembershipRecord, NodeIdsAreCheckedBecauseTheyAreStoreKeys) {
  EXPECT_NO_THROW(comm::check_node_id("host-3_pid77.0", "node id"));
  for (const std::string& bad :
       std::vector<std::string>{"", "a b", "a/b", "a\nb", std::string(257, 'x')}) {
    try {
      comm::check_node_id(bad, "node id");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const ConfigError& e) {
      EXPECT_EQ(e.field(), "node id");
    }
  }
}

// --- The quorum rules ---------------------------------------------------------------

TEST(Quorum, FirstEpochWaitsForMinThenLastCallUnlessMaxIsReached) {
  MembershipRecord r = epoch_record(0, {}, {"a", "b", "c", "d"});
  EXPECT_EQ(decide(r, {"a"}, 2, 3, false).verdict, Verdict::kTooFew);
  EXPECT_EQ(decide(r, {"a", "b"}, 2, 3, false).verdict, Verdict::kLastCall);
  Decision d = decide(r, {"a", "c"}, 2, 3, true);
  ASSERT_EQ(d.verdict, Verdict::kForm) << d.why;
  EXPECT_EQ(d.next.epoch, 1);
  EXPECT_EQ(d.next.members, (std::map<std::string, int>{{"a", 0}, {"c", 1}}));
  EXPECT_TRUE(d.next.spares.empty()) << "dead spares are dropped";
  // MAX reached: no last call; arrival order decides who is in; the rest stay spares.
  d = decide(r, {"a", "b", "c", "d"}, 2, 3, false);
  ASSERT_EQ(d.verdict, Verdict::kForm);
  EXPECT_EQ(d.next.members, (std::map<std::string, int>{{"a", 0}, {"b", 1}, {"c", 2}}));
  EXPECT_EQ(d.next.spares, std::vector<std::string>{"d"});
}

TEST(Quorum, FastPathEveryoneHealthyChangesNothing) {
  MembershipRecord r = epoch_record(4, {{"a", 0}, {"b", 1}, {"c", 2}}, {"d"});
  EXPECT_EQ(decide(r, {"a", "b", "c"}, 2, 3, true).verdict, Verdict::kStable);
  EXPECT_EQ(decide(r, {"a", "b", "c", "d"}, 2, 3, true).verdict, Verdict::kStable)
      << "a spare waits while the membership is full";
}

TEST(Quorum, LostMemberWithMajorityFormsNextEpochRanksKeptSpareTakesFreedRank) {
  MembershipRecord r = epoch_record(1, {{"a", 0}, {"b", 1}, {"c", 2}}, {"d", "e"});
  Decision d = decide(r, {"a", "c"}, 2, 3, false);
  ASSERT_EQ(d.verdict, Verdict::kForm) << d.why;
  EXPECT_EQ(d.next.epoch, 2);
  EXPECT_EQ(d.next.members, (std::map<std::string, int>{{"a", 0}, {"c", 2}}))
      << "survivors keep ranks; no spare alive";
  d = decide(r, {"a", "c", "e", "d"}, 2, 3, false);
  ASSERT_EQ(d.verdict, Verdict::kForm);
  EXPECT_EQ(d.next.members, (std::map<std::string, int>{{"a", 0}, {"d", 1}, {"c", 2}}))
      << "the first spare in arrival order takes the lowest free rank, at once";
  EXPECT_EQ(d.next.spares, std::vector<std::string>{"e"});
}

TEST(Quorum, MinorityLosesQuorumEvenWhenMinAllowsIt) {
  MembershipRecord r = epoch_record(5, {{"a", 0}, {"b", 1}, {"c", 2}, {"d", 3}});
  Decision d = decide(r, {"a"}, 1, 4, true);
  EXPECT_EQ(d.verdict, Verdict::kQuorumLost) << d.why;
  EXPECT_NE(d.why.find("1 of 4 members of epoch 5 alive"), std::string::npos) << d.why;
  EXPECT_EQ(decide(r, {"a", "b"}, 1, 4, true).verdict, Verdict::kQuorumLost)
      << "2 of 4 is not a strict majority";
  EXPECT_EQ(decide(r, {"a", "b", "c"}, 1, 4, true).verdict, Verdict::kForm);
  // Spares do not make a majority: they were not members of the epoch.
  r.spares = {"x", "y", "z"};
  EXPECT_EQ(decide(r, {"a", "x", "y", "z"}, 1, 4, true).verdict, Verdict::kQuorumLost);
}

TEST(Quorum, MajorityBelowMinWaitsForJoiners) {
  MembershipRecord r = epoch_record(2, {{"a", 0}, {"b", 1}, {"c", 2}});
  EXPECT_EQ(decide(r, {"a", "b"}, 3, 3, true).verdict, Verdict::kTooFew);
  r.spares = {"d"};
  Decision d = decide(r, {"a", "b", "d"}, 3, 3, true);
  ASSERT_EQ(d.verdict, Verdict::kForm);
  EXPECT_EQ(d.next.members.at("d"), 2);
}

TEST(Quorum, GracefulLeaveIsNotCountedAgainstTheQuorum) {
  MembershipRecord r = epoch_record(3, {{"a", 0}, {"b", 1}}, {}, {"b"});
  Decision d = decide(r, {"a"}, 1, 2, false);
  ASSERT_EQ(d.verdict, Verdict::kForm) << "1 of 1 remaining member is a majority: " << d.why;
  EXPECT_EQ(d.next.members, (std::map<std::string, int>{{"a", 0}}));
  EXPECT_TRUE(d.next.left.empty());
  EXPECT_EQ(decide(r, {"a"}, 2, 2, false).verdict, Verdict::kTooFew);
}

// Departed nodes whose hand-over is not confirmed carry into the next epoch while alive,
// beside the new leaver; one that is gone forms an epoch without it even when nothing else
// changed (its workers will never come to the world that waits for them).
TEST(Quorum, DepartedNodesCarryWhileAliveAndOneGoneFormsAnEpoch) {
  MembershipRecord r = epoch_record(2, {{"a", 0}, {"b", 1}, {"c", 2}}, {}, {"c"});
  r.hands_over = {"c"};
  r.departed = {{"d", 3}};
  Decision d = decide(r, {"a", "b", "c", "d"}, 1, 4, false);
  ASSERT_EQ(d.verdict, Verdict::kForm) << d.why;
  EXPECT_EQ(d.next.departed, (std::map<std::string, int>{{"c", 2}, {"d", 3}}));
  d = decide(r, {"a", "b", "c"}, 1, 4, false);
  ASSERT_EQ(d.verdict, Verdict::kForm) << d.why;
  EXPECT_EQ(d.next.departed, (std::map<std::string, int>{{"c", 2}})) << "d is gone: dropped";
  MembershipRecord quiet = epoch_record(3, {{"a", 0}, {"b", 1}});
  quiet.departed = {{"d", 3}};
  EXPECT_EQ(decide(quiet, {"a", "b", "d"}, 1, 4, false).verdict, Verdict::kStable);
  d = decide(quiet, {"a", "b"}, 1, 4, false);
  ASSERT_EQ(d.verdict, Verdict::kForm) << d.why;
  EXPECT_EQ(d.next.epoch, 4);
  EXPECT_EQ(d.next.members, quiet.members);
  EXPECT_TRUE(d.next.departed.empty());
  EXPECT_NE(d.why.find("departing node d gone"), std::string::npos) << d.why;
}

TEST(Quorum, GrowsBelowMaxAfterLastCallOrAtOnceWhenFull) {
  MembershipRecord r = epoch_record(1, {{"a", 0}, {"b", 1}}, {"c"});
  EXPECT_EQ(decide(r, {"a", "b", "c"}, 2, 4, false).verdict, Verdict::kLastCall);
  Decision d = decide(r, {"a", "b", "c"}, 2, 4, true);
  ASSERT_EQ(d.verdict, Verdict::kForm);
  EXPECT_EQ(d.next.members.at("c"), 2);
  EXPECT_EQ(decide(r, {"a", "b", "c"}, 2, 3, false).verdict, Verdict::kForm)
      << "the spare fills the membership to MAX: no last call";
}

// --- Options and the timeout hierarchy ------------------------------------------------

RendezvousOptions good() {
  RendezvousOptions o;
  o.run_id = "job";
  o.node_id = "n0";
  o.min_nodes = 2;
  o.max_nodes = 4;
  return o;
}

std::string refused_field(const RendezvousOptions& o) {
  try {
    comm::validate(o);
  } catch (const ConfigError& e) {
    return e.field();
  }
  return "(accepted)";
}

TEST(RendezvousOptions, DefaultsHoldTheHierarchy) {
  EXPECT_NO_THROW(comm::validate(good()));
  RendezvousOptions o = good();
  o.collective_timeout = 1s;
  o.step_timeout = 3s;
  EXPECT_NO_THROW(comm::validate(o));
}

TEST(RendezvousOptions, BadCombinationsNameTheKey) {
  RendezvousOptions o = good();
  o.heartbeat_interval = 5s;  // == heartbeat_timeout
  EXPECT_EQ(refused_field(o), "--rdzv-conf heartbeat_interval");
  o = good();
  o.heartbeat_timeout = 900s;
  EXPECT_EQ(refused_field(o), "--rdzv-conf heartbeat_timeout");
  o = good();
  o.last_call = 600s;
  EXPECT_EQ(refused_field(o), "--rdzv-conf last_call_timeout");
  o = good();
  o.step_timeout = 10s;
  EXPECT_EQ(refused_field(o), "--rdzv-conf step_timeout");
  o = good();
  o.collective_timeout = 2s;
  o.step_timeout = 2s;
  EXPECT_EQ(refused_field(o), "--rdzv-conf collective_timeout");
  o = good();
  o.heartbeat_timeout = 0s;
  EXPECT_EQ(refused_field(o), "--rdzv-conf heartbeat_timeout");
  o = good();
  o.poll_interval = 5s;
  EXPECT_EQ(refused_field(o), "--rdzv-conf poll_interval");
  o = good();
  o.min_nodes = 3;
  o.max_nodes = 2;
  EXPECT_EQ(refused_field(o), "--nnodes");
  o = good();
  o.run_id = "";
  EXPECT_EQ(refused_field(o), "--rdzv-id");
  o = good();
  o.node_id = "has space";
  EXPECT_EQ(refused_field(o), "node id");
  // The message says what to do.
  o = good();
  o.heartbeat_interval = 6s;
  try {
    comm::validate(o);
  } catch (const ConfigError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("must be less than heartbeat_timeout (5 s)"), std::string::npos) << m;
    EXPECT_NE(m.find("raise heartbeat_timeout"), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace weft::test
