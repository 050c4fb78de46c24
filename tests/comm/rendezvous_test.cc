// Rendezvous with real concurrency: agents as threads over one InMemoryStore, and as forked
// processes over a TCPStore (run_ranks). Failures are simulated the way they happen: a node
// whose heartbeat stops (thread) or that is SIGKILLed (process), a partition (a Store view
// that hides the other side's heartbeats and drops its own), a graceful leave, a close.
// Assertions are on what happened; durations are printed, never asserted.
#include "comm/elastic/rendezvous.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "comm/store/in_memory_store.h"
#include "comm/store/prefix_store.h"
#include "tests/support/multiprocess.h"

namespace weft::test {
namespace {

using namespace std::chrono_literals;
using comm::Bytes;
using comm::InMemoryStore;
using comm::Membership;
using comm::Millis;
using comm::Rendezvous;
using comm::RendezvousOptions;
using comm::Store;
using Clock = std::chrono::steady_clock;

// 0.2 s / 1 s heartbeats: a lost node is noticed within about a second.
RendezvousOptions options(const std::string& node, int min, int max) {
  RendezvousOptions o;
  o.run_id = "job";
  o.node_id = node;
  o.min_nodes = min;
  o.max_nodes = max;
  o.heartbeat_interval = 200ms;
  o.heartbeat_timeout = 1s;
  o.poll_interval = 20ms;
  o.last_call = 5s;
  o.join_timeout = 30s;
  return o;
}

// "n" + std::to_string(i) without GCC 12's false -Wrestrict warning on that expression.
std::string name(const char* stem, int64_t i) {
  std::string s = stem;
  s += std::to_string(i);
  return s;
}

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// Joins every agent on its own thread; returns the memberships in agent order.
std::vector<Membership> join_all(std::vector<std::unique_ptr<Rendezvous>>& agents) {
  std::vector<std::future<Membership>> f;
  for (auto& a : agents) f.push_back(std::async(std::launch::async, [&a] { return a->join(); }));
  std::vector<Membership> out;
  for (auto& x : f) out.push_back(x.get());
  return out;
}

std::vector<std::unique_ptr<Rendezvous>> make_agents(Store& store, int n, int min, int max,
                                                     const std::string& stem = "node") {
  std::vector<std::unique_ptr<Rendezvous>> agents;
  for (int i = 0; i < n; ++i)
    agents.push_back(
        std::make_unique<Rendezvous>(store, options(stem + std::to_string(i), min, max)));
  return agents;
}

// The graceful leave the hand-over tests start from: node0..node2 (MIN 2, MAX 3) form epoch
// 1, node2 leaves handing its state over, and agent `watcher` sees epoch 2 form with node2
// departing. Returns the agents and that epoch (nullopt: it did not form within 5 s).
struct Departing {
  std::vector<std::unique_ptr<Rendezvous>> agents;
  std::vector<Membership> epoch1;
  std::optional<Membership> epoch2;
};
Departing node2_departs(Store& store, int watcher = 0) {
  Departing d{make_agents(store, 3, 2, 3), {}, std::nullopt};
  d.epoch1 = join_all(d.agents);
  d.agents[2]->leave(/*hands_over=*/true);
  d.epoch2 = d.agents[size_t(watcher)]->watch(5s);
  return d;
}

std::map<std::string, int> ranks_of(const Membership& m) {
  std::map<std::string, int> out;
  for (const auto& x : m.members) out[x.node_id] = x.node_rank;
  return out;
}

// A store as one side of a partition sees it: alive keys of the other side look absent
// (their heartbeats cannot reach us), and our own heartbeat writes are dropped (they cannot
// reach the store). Everything else goes through. Thread-safe.
class PartitionedView : public Store {
 public:
  explicit PartitionedView(Store& base) : base_(base) {}
  void hide(const std::string& key) {
    std::lock_guard<std::mutex> l(mu_);
    hidden_.insert(key);
  }
  void drop_writes(const std::string& key) {
    std::lock_guard<std::mutex> l(mu_);
    dropped_.insert(key);
  }

  void set(const std::string& k, const Bytes& v, std::optional<Millis> ttl) override {
    if (!dropped(k)) base_.set(k, v, ttl);
  }
  Bytes get(const std::string& k) override {
    if (hidden(k)) throw TimeoutError("partitioned: " + k);
    return base_.get(k);
  }
  int64_t add(const std::string& k, int64_t d) override { return base_.add(k, d); }
  Bytes compare_set(const std::string& k, const Bytes& e, const Bytes& d) override {
    return base_.compare_set(k, e, d);
  }
  void wait(const std::vector<std::string>& ks, Millis t) override { base_.wait(ks, t); }
  bool check(const std::vector<std::string>& ks) override {
    for (const auto& k : ks)
      if (hidden(k)) return false;
    return base_.check(ks);
  }
  bool erase(const std::string& k) override { return dropped(k) ? false : base_.erase(k); }
  int64_t num_keys() override { return base_.num_keys(); }
  int64_t num_keys_with_prefix(const std::string& p) override {
    return base_.num_keys_with_prefix(p);
  }
  void append(const std::string& k, const Bytes& v) override { base_.append(k, v); }
  std::vector<Bytes> multi_get(const std::vector<std::string>& ks) override {
    return base_.multi_get(ks);
  }
  void multi_set(const std::vector<std::string>& ks, const std::vector<Bytes>& vs) override {
    base_.multi_set(ks, vs);
  }
  Millis timeout() const override { return base_.timeout(); }
  void set_timeout(Millis t) override { base_.set_timeout(t); }

 private:
  bool hidden(const std::string& k) {
    std::lock_guard<std::mutex> l(mu_);
    return hidden_.count(k) > 0;
  }
  bool dropped(const std::string& k) {
    std::lock_guard<std::mutex> l(mu_);
    return dropped_.count(k) > 0;
  }
  Store& base_;
  std::mutex mu_;
  std::set<std::string> hidden_, dropped_;
};

// --- Threads over one in-memory store --------------------------------------------------

TEST(Rendezvous, ThreeNodesFormEpochOneAndStayThereWhileHealthy) {
  InMemoryStore store;
  auto agents = make_agents(store, 3, 2, 3);
  std::vector<Membership> ms = join_all(agents);
  std::set<int> ranks;
  for (const auto& m : ms) {
    EXPECT_EQ(m.epoch, 1);
    EXPECT_EQ(m.world(), 3);
    EXPECT_EQ(m.members, ms[0].members) << "every agent sees the same membership";
    EXPECT_EQ(m.members[m.index].node_rank, m.node_rank);
    EXPECT_EQ(m.store_prefix, "rdzv/job/epoch/1");
    ranks.insert(m.node_rank);
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2}));
  // The fast path: many polls over several heartbeats, no write at all.
  const int64_t version = agents[0]->read_record().version;
  for (int round = 0; round < 20; ++round) {
    for (auto& a : agents) EXPECT_EQ(a->poll_change(), std::nullopt);
    std::this_thread::sleep_for(75ms);
  }
  EXPECT_EQ(agents[0]->read_record().version, version) << "the record was rewritten";
  EXPECT_EQ(agents[0]->read_record().epoch, 1);
  for (auto& a : agents) EXPECT_GT(a->heartbeat().beats(), 3u);
}

TEST(Rendezvous, LostHeartbeatSurvivorsFormEpochTwoKeepingTheirRanks) {
  InMemoryStore store;
  auto agents = make_agents(store, 3, 2, 3);
  std::vector<Membership> ms = join_all(agents);
  // "SIGKILL" the agent with rank 1: its heartbeat stops, it never polls again.
  int victim = 0;
  while (ms[victim].node_rank != 1) ++victim;
  const auto killed = Clock::now();
  agents[victim]->heartbeat().stop();
  std::vector<std::future<std::pair<std::optional<Membership>, double>>> f;
  for (int i = 0; i < 3; ++i) {
    if (i == victim) continue;
    f.push_back(std::async(std::launch::async, [&, i] {
      auto m = agents[i]->watch(20s);
      return std::make_pair(m, ms_since(killed));
    }));
  }
  for (auto& x : f) {
    auto [m, elapsed] = x.get();
    ASSERT_TRUE(m.has_value()) << "no new epoch";
    EXPECT_EQ(m->epoch, 2);
    EXPECT_EQ(m->world(), 2);
    auto r = ranks_of(*m);
    EXPECT_EQ(r.count(agents[victim]->options().node_id), 0u);
    for (int i = 0; i < 3; ++i) {
      if (i == victim) continue;
      EXPECT_EQ(r.at(agents[i]->options().node_id), ms[i].node_rank);
    }
    std::printf(
        "[ measure ] lost heartbeat -> epoch 2 seen: %.0f ms (interval 0.2 s, timeout "
        "1 s, poll 20 ms)\n",
        elapsed);
  }
}

TEST(Rendezvous, SpareBeyondMaxWaitsThenTakesTheLostNodesRank) {
  InMemoryStore store;
  auto agents = make_agents(store, 3, 2, 3);
  std::vector<Membership> ms = join_all(agents);
  Rendezvous spare(store, options("spare", 2, 3));
  auto spare_join = std::async(std::launch::async, [&] { return spare.join(); });
  // It registers as a spare and is not admitted while everyone is healthy.
  for (int i = 0; i < 2000 && !agents[0]->read_record().is_spare("spare"); ++i)
    std::this_thread::sleep_for(5ms);
  ASSERT_TRUE(agents[0]->read_record().is_spare("spare"));
  for (int round = 0; round < 10; ++round) {
    for (auto& a : agents) EXPECT_EQ(a->poll_change(), std::nullopt);
    std::this_thread::sleep_for(30ms);
  }
  EXPECT_EQ(spare_join.wait_for(0s), std::future_status::timeout) << "admitted beyond MAX";
  int victim = 0;
  while (ms[victim].node_rank != 0) ++victim;
  agents[victim]->heartbeat().stop();
  Membership admitted = spare_join.get();
  EXPECT_EQ(admitted.epoch, 2);
  EXPECT_EQ(admitted.node_rank, 0) << "the spare takes the lost node's rank";
  EXPECT_EQ(admitted.world(), 3);
  for (int i = 0; i < 3; ++i) {
    if (i == victim) continue;
    auto m = agents[i]->watch(20s);
    ASSERT_TRUE(m.has_value());
    EXPECT_EQ(m->members, admitted.members);
    EXPECT_EQ(m->node_rank, ms[i].node_rank);
  }
}

TEST(Rendezvous, PartitionedMinorityStopsItselfAndTheMajorityGoesOn) {
  InMemoryStore store;
  std::vector<std::unique_ptr<PartitionedView>> views;
  std::vector<std::unique_ptr<Rendezvous>> agents;
  for (int i = 0; i < 3; ++i) {
    views.push_back(std::make_unique<PartitionedView>(store));
    agents.push_back(std::make_unique<Rendezvous>(*views[i], options(name("n", i), 2, 3)));
  }
  join_all(agents);
  // Cut n2 off: it cannot see n0's and n1's heartbeats, and its own no longer arrive.
  views[2]->hide(agents[2]->alive_key("n0"));
  views[2]->hide(agents[2]->alive_key("n1"));
  views[2]->drop_writes(agents[2]->alive_key("n2"));
  try {
    agents[2]->poll_change();
    ADD_FAILURE() << "the minority went on";
  } catch (const comm::QuorumLostError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("lost quorum"), std::string::npos) << m;
    EXPECT_NE(m.find("1 of 3 members of epoch 1 alive"), std::string::npos) << m;
    EXPECT_NE(m.find("split brain"), std::string::npos) << m;
  }
  EXPECT_FALSE(agents[2]->heartbeat().running()) << "a minority stops its heartbeat";
  // The majority notices n2's key expire and goes on without it.
  for (int i = 0; i < 2; ++i) {
    auto m = agents[i]->watch(20s);
    ASSERT_TRUE(m.has_value());
    EXPECT_EQ(m->epoch, 2);
    EXPECT_EQ(m->world(), 2);
  }
  EXPECT_EQ(agents[0]->read_record().epoch, 2) << "one epoch 2, written once";
}

TEST(Rendezvous, MinorityThatWakesAfterTheMajorityMovedOnIsToldItWasRemoved) {
  InMemoryStore store;
  auto agents = make_agents(store, 3, 2, 3);
  join_all(agents);
  agents[2]->heartbeat().stop();  // a long GC pause, say: no beats, no polls
  ASSERT_TRUE(agents[0]->watch(20s).has_value());
  agents[2]->heartbeat().start();  // it wakes up
  try {
    agents[2]->poll_change();
    ADD_FAILURE() << "a removed node went on";
  } catch (const comm::QuorumLostError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("removed"), std::string::npos) << m;
    EXPECT_NE(m.find("epoch 2 was formed without it"), std::string::npos) << m;
  }
  // It may come back as a newcomer: the free rank is its old one.
  Membership back = agents[2]->join();
  EXPECT_EQ(back.epoch, 3);
  EXPECT_EQ(back.world(), 3);
}

TEST(Rendezvous, GracefulLeaveReformsAtOnceWithoutWaitingForTheTtl) {
  InMemoryStore store;
  std::vector<std::unique_ptr<Rendezvous>> agents;
  for (int i = 0; i < 3; ++i) {
    RendezvousOptions o = options(name("n", i), 1, 3);
    o.heartbeat_timeout = 60s;  // a TTL the test would notice
    o.join_timeout = 120s;
    agents.push_back(std::make_unique<Rendezvous>(store, o));
  }
  std::vector<Membership> ms = join_all(agents);
  const auto t0 = Clock::now();
  agents[1]->leave();
  EXPECT_FALSE(store.check({agents[1]->alive_key("n1")}));
  auto m = agents[0]->poll_change();  // the very first poll re-forms
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->epoch, 2);
  EXPECT_EQ(ranks_of(*m),
            (std::map<std::string, int>{{"n0", ms[0].node_rank}, {"n2", ms[2].node_rank}}));
  auto m2 = agents[2]->poll_change();
  ASSERT_TRUE(m2.has_value());
  EXPECT_EQ(m2->members, m->members);
  std::printf("[ measure ] graceful leave -> epoch 2: %.1f ms\n", ms_since(t0));
  // Leaving twice is harmless; the last two shrink to one (1 of 1 left is a majority).
  agents[1]->leave();
  agents[2]->leave();
  auto m3 = agents[0]->poll_change();
  ASSERT_TRUE(m3.has_value());
  EXPECT_EQ(m3->epoch, 3);
  EXPECT_EQ(m3->world(), 1);
}

// Nodes preempted together hand their state over in one epoch: their leaves, written a few
// milliseconds apart, wait out a last call (a poll_interval in which the record stands still)
// before a survivor forms the epoch, which then lets both go as departed. Without it the first
// leave's epoch kept the second leaver as a member and the second leave formed another at once,
// whose world the first leaver was never posted (its state lost). A leave without a hand-over
// (its workers failed) forms at once, as a loss does (LossesSinceNameOnlyTheWorldsThat...).
TEST(Rendezvous, LeavesAnnouncedTogetherHandOverInOneEpochAfterALastCall) {
  InMemoryStore store;
  auto agents = make_agents(store, 4, 2, 4);
  std::vector<Membership> ms = join_all(agents);
  ASSERT_EQ(ms[0].world(), 4);
  agents[2]->leave(/*hands_over=*/true);
  EXPECT_EQ(agents[0]->poll_change(), std::nullopt) << "the first look starts the last call";
  std::this_thread::sleep_for(2ms);
  agents[3]->leave(/*hands_over=*/true);  // within it: the wait starts again
  EXPECT_EQ(agents[1]->poll_change(), std::nullopt);
  std::optional<Membership> m = agents[0]->watch(5s);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->epoch, 2) << "one epoch for both leaves";
  EXPECT_EQ(m->world(), 2);
  std::set<std::string> departed;
  for (const comm::Member& d : m->departed) departed.insert(d.node_id);
  EXPECT_EQ(departed, (std::set<std::string>{"node2", "node3"}));
}

// A departing node stays departed until it confirms its hand-over: a leave during the first
// leave's move forms an epoch that lists both (the first one's world may never have formed),
// the first leaver's confirmation of the replaced epoch is refused (kCarried), and once both
// confirm the epoch they handed over in, the next epoch lists neither. Its heartbeat goes on
// until it confirms: the others tell a departing node that died from one handing over.
TEST(Rendezvous, ADepartedNodeStaysDepartedUntilItConfirmsItsHandOver) {
  InMemoryStore store;
  auto agents = make_agents(store, 4, 2, 4);
  const std::vector<Membership> ms = join_all(agents);
  agents[3]->leave(/*hands_over=*/true);
  EXPECT_TRUE(store.check({agents[3]->alive_key("node3")})) << "heartbeat on while departing";
  std::optional<Membership> e2 = agents[0]->watch(5s);
  ASSERT_TRUE(e2.has_value());
  ASSERT_EQ(e2->epoch, 2);
  agents[2]->leave(/*hands_over=*/true);  // during epoch 2's move: node3 did not confirm
  std::optional<Membership> e3 = agents[0]->watch(5s);
  ASSERT_TRUE(e3.has_value());
  ASSERT_EQ(e3->epoch, 3);
  EXPECT_EQ(e3->world(), 2);
  // By their node ranks of epoch 1 (the order they joined in, not their names).
  std::vector<std::string> departed, by_rank;
  for (const comm::Member& d : e3->departed) departed.push_back(d.node_id);
  for (const comm::Member& m : ms[0].members)
    if (m.node_id == "node2" || m.node_id == "node3") by_rank.push_back(m.node_id);
  EXPECT_EQ(departed, by_rank);
  EXPECT_EQ(agents[3]->confirm_handover(2, 0), Rendezvous::HandOver::kCarried);
  EXPECT_TRUE(store.check({agents[3]->alive_key("node3")}));
  EXPECT_EQ(agents[3]->confirm_handover(3, 0), Rendezvous::HandOver::kReleased);
  EXPECT_FALSE(store.check({agents[3]->alive_key("node3")})) << "gone once confirmed";
  EXPECT_EQ(agents[0]->poll_change(), std::nullopt) << "a confirmation is not a change";
  EXPECT_EQ(agents[2]->confirm_handover(3, 0), Rendezvous::HandOver::kReleased);
  EXPECT_TRUE(agents[0]->read_record().departed.empty());
  // The next change (a member's renewal) lists no departed node.
  ASSERT_TRUE(agents[1]->poll_change().has_value());  // node1 into epoch 3
  std::optional<Membership> e4 = agents[1]->renew({0});
  ASSERT_TRUE(e4.has_value());
  EXPECT_TRUE(e4->departed.empty());
}

// A restart round asked for after a leaver's workers handed over, before its confirmation:
// the round's world replaces the one they handed over in, so the confirmation against the old
// round is refused (kCarried) and the record keeps the leaver departed; every agent reads the
// round with the departed it counts (Membership::round), and the leaver confirms in the round.
// A round is asked once: an agent that asks after another did gets the round already asked.
TEST(Rendezvous, AConfirmationAfterARoundWasAskedIsRefusedUntilTheLeaverHandsOverInIt) {
  InMemoryStore store;
  auto [agents, epoch1, e2] = node2_departs(store);
  ASSERT_TRUE(e2.has_value());
  ASSERT_EQ(e2->epoch, 2);
  EXPECT_EQ(e2->round, 0);
  ASSERT_TRUE(agents[1]->poll_change().has_value());  // node1 into epoch 2
  EXPECT_EQ(agents[0]->ask_round(0), 1);
  EXPECT_EQ(agents[1]->ask_round(0), 1) << "asked already: no second round";
  EXPECT_EQ(agents[1]->restart_round(), 1);
  EXPECT_EQ(agents[2]->confirm_handover(2, 0), Rendezvous::HandOver::kCarried);
  EXPECT_TRUE(store.check({agents[2]->alive_key("node2")})) << "still departing";
  for (auto& a : agents) {
    const Membership seen = a->view(a->read_record());
    EXPECT_EQ(seen.round, 1);
    ASSERT_EQ(seen.departed.size(), 1u);
    EXPECT_EQ(seen.departed[0].node_id, "node2");
  }
  EXPECT_EQ(agents[0]->poll_change(), std::nullopt) << "a round is not an epoch";
  EXPECT_EQ(agents[2]->confirm_handover(2, 1), Rendezvous::HandOver::kReleased);
  EXPECT_TRUE(agents[0]->read_record().departed.empty());
  EXPECT_EQ(agents[0]->ask_round(1), 2);
  agents[0]->close("done");
  EXPECT_EQ(agents[1]->ask_round(2), 2) << "a closed job asks for nothing";
}

// The rule under real concurrency: a leaver confirms while another agent asks for a round and
// then reads the record for the round's world, both at once, many times over. Whichever comes
// first, the two agree: a confirmation that went through came before the round (the round's
// record no longer lists the leaver), one after it was refused (the record lists it and its
// workers hand over in the round). Before the round was in the record, a confirmation after
// the round went through while the asker had counted the leaver.
TEST(Rendezvous, ARoundAndAConfirmationAtOnceAgreeOnWhetherTheRoundCountsTheLeaver) {
  int released = 0, carried = 0;
  for (int i = 0; i < 100; ++i) {
    InMemoryStore store;
    auto [agents, epoch1, e2] = node2_departs(store);
    ASSERT_TRUE(e2.has_value());
    std::promise<void> go;
    std::shared_future<void> start = go.get_future().share();
    auto confirm = std::async(std::launch::async, [&] {
      start.wait();
      return agents[2]->confirm_handover(2, 0);
    });
    auto ask = std::async(std::launch::async, [&] {
      start.wait();
      const int64_t round = agents[0]->ask_round(0);
      return std::make_pair(round, agents[0]->view(agents[0]->read_record()));
    });
    go.set_value();
    const Rendezvous::HandOver h = confirm.get();
    const auto [round, seen] = ask.get();
    ASSERT_EQ(round, 1);
    ASSERT_EQ(seen.round, 1);
    if (h == Rendezvous::HandOver::kReleased) {
      ++released;
      EXPECT_TRUE(seen.departed.empty()) << "run " << i << ": the round counts a leaver that ends";
    } else {
      ++carried;
      EXPECT_EQ(seen.departed.size(), 1u) << "run " << i;
      EXPECT_EQ(agents[0]->read_record().departed.size(), 1u) << "run " << i;
    }
  }
  std::printf("[ says     ] 100 races: %d confirmations first, %d rounds first\n", released,
              carried);
}

// A departing node that dies before it confirms (its alive key goes) is dropped: an epoch
// forms without it at once, as for a lost member, so the world that waited for its workers
// is replaced instead of waiting out its timeout; a renewal in between keeps it departed.
TEST(Rendezvous, ADepartingNodeThatDiesIsDroppedByANewEpoch) {
  InMemoryStore store;
  auto [agents, epoch1, e2] = node2_departs(store);
  ASSERT_TRUE(e2.has_value());
  ASSERT_EQ(e2->departed.size(), 1u);
  ASSERT_TRUE(agents[1]->poll_change().has_value());  // node1 into epoch 2
  std::optional<Membership> e3 = agents[1]->renew({0});
  ASSERT_TRUE(e3.has_value());
  ASSERT_EQ(e3->departed.size(), 1u) << "a renewal keeps a departed node";
  ASSERT_TRUE(agents[0]->poll_change().has_value());
  agents[2]->heartbeat().stop_and_erase();  // its agent died
  std::optional<Membership> e4 = agents[0]->watch(5s);
  ASSERT_TRUE(e4.has_value());
  EXPECT_EQ(e4->epoch, 4);
  EXPECT_EQ(e4->world(), 2);
  EXPECT_TRUE(e4->departed.empty());
}

// A worker replaced in place: its node renews the epoch with the same members, the others
// see the renewal (and which worker it replaced) at their next poll, and the next epoch
// formed by the quorum rules forgets it. A renewal never hides a pending leave.
TEST(Rendezvous, RenewKeepsTheMembersAndNamesTheReplacedWorker) {
  InMemoryStore store;
  auto agents = make_agents(store, 3, 2, 3);
  std::vector<Membership> ms = join_all(agents);
  std::optional<Membership> r = agents[1]->renew({1});
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->epoch, 2);
  EXPECT_EQ(r->members, ms[1].members);
  EXPECT_EQ(r->store_prefix, "rdzv/job/epoch/2");
  ASSERT_EQ(r->replaced.size(), 1u);
  EXPECT_EQ(r->replaced[0], (std::pair<int, std::string>{1, "node1"}));
  for (int i : {0, 2}) {
    std::optional<Membership> seen = agents[i]->poll_change();
    ASSERT_TRUE(seen.has_value()) << i;
    EXPECT_EQ(seen->epoch, 2);
    EXPECT_EQ(seen->members, ms[i].members);
    EXPECT_EQ(seen->replaced, r->replaced);
  }
  EXPECT_EQ(agents[1]->poll_change(), std::nullopt) << "the renewing node is in epoch 2 already";
  // A member leaves: renew() refuses to hide it; the epoch the leave forms has no replaced.
  agents[2]->leave();
  EXPECT_EQ(agents[0]->renew({0}), std::nullopt);
  std::optional<Membership> after = agents[0]->poll_change();
  ASSERT_TRUE(after.has_value());
  EXPECT_EQ(after->epoch, 3);
  EXPECT_EQ(after->world(), 2);
  EXPECT_TRUE(after->replaced.empty());
  // The record's text keeps the field (decode(encode(r)) == r).
  comm::MembershipRecord rec = agents[0]->read_record();
  rec.replaced = {{3, "node0"}};
  EXPECT_EQ(comm::decode(comm::encode(rec), "k").replaced, rec.replaced);
}

// An agent that polls once while two epochs form (its workers are in epoch 1) must still
// learn whether their world lost a process: the epochs in between decide (the records'
// process_lost notes), not the difference between epoch 1's and the newest member lists.
TEST(Rendezvous, LostAProcessLooksAtEveryEpochSinceTheWorkersOne) {
  {  // A renewal (a worker of node1 replaced), then node2's graceful leave: epoch 3 has
     // node1 again and no `replaced`, but node1's old worker was in epoch 1's world.
    InMemoryStore store;
    auto agents = make_agents(store, 3, 2, 3);
    std::vector<Membership> ms = join_all(agents);
    ASSERT_TRUE(agents[1]->renew({1}).has_value());
    agents[2]->leave(/*hands_over=*/true);
    // A hand-over's epoch forms after its last call (LeavesAnnouncedTogether... below).
    std::optional<Membership> formed = agents[1]->watch(5s);
    ASSERT_TRUE(formed.has_value());
    ASSERT_EQ(formed->epoch, 3);
    std::optional<Membership> seen = agents[0]->poll_change();  // node0's first poll since 1
    ASSERT_TRUE(seen.has_value());
    EXPECT_EQ(seen->epoch, 3);
    EXPECT_TRUE(seen->replaced.empty()) << "epoch 3 alone does not say that a worker died";
    ASSERT_EQ(seen->departed.size(), 1u);
    EXPECT_TRUE(comm::lost_a_process(ms[0], *seen));
    EXPECT_FALSE(comm::lost_a_process(*seen, *seen));
  }
  {  // node2 hands its state over (epoch 2, confirmed), then a newcomer joins (epoch 3): no
     // process of epoch 1's world died, though node2 is neither a member nor departed in 3.
    InMemoryStore store;
    auto [agents, ms, e2] = node2_departs(store, /*watcher=*/1);
    ASSERT_TRUE(e2.has_value());
    EXPECT_EQ(agents[2]->confirm_handover(2, 0), Rendezvous::HandOver::kReleased);
    Rendezvous newcomer(store, options("node3", 2, 3));
    Membership joined = newcomer.join();  // 2 members + 1 waiting = max: forms at once
    ASSERT_EQ(joined.epoch, 3);
    std::optional<Membership> seen = agents[0]->poll_change();
    ASSERT_TRUE(seen.has_value());
    EXPECT_EQ(seen->epoch, 3);
    EXPECT_TRUE(seen->departed.empty());
    EXPECT_FALSE(comm::lost_a_process(ms[0], *seen));
  }
  {  // node1 leaves without handing over (its workers failed) and joins again before node0
     // polls: epoch 3 has epoch 1's members exactly, yet node1's processes are gone.
    InMemoryStore store;
    auto agents = make_agents(store, 3, 2, 3);
    std::vector<Membership> ms = join_all(agents);
    agents[1]->leave();
    ASSERT_TRUE(agents[2]->poll_change().has_value());
    Membership back = agents[1]->join();
    ASSERT_EQ(back.epoch, 3);
    std::optional<Membership> seen = agents[0]->poll_change();
    ASSERT_TRUE(seen.has_value());
    EXPECT_EQ(seen->members, ms[0].members);
    EXPECT_TRUE(comm::lost_a_process(ms[0], *seen));
    // The notes survive the record's text, name the epoch that dropped node1, and are
    // forgotten after kProcessLossEpochs epochs (then an agent that far behind assumes a loss).
    comm::MembershipRecord rec = agents[0]->read_record();
    ASSERT_EQ(rec.process_losses.size(), 1u);
    EXPECT_EQ(rec.process_losses[0], (std::pair<int64_t, std::string>{2, "node1"}));
    EXPECT_EQ(comm::decode(comm::encode(rec), "k").process_losses, rec.process_losses);
    rec.epoch = 2 + comm::kProcessLossEpochs;
    rec.note_process_loss("node2");
    ASSERT_EQ(rec.process_losses.size(), 1u);
    EXPECT_EQ(rec.process_losses[0].second, "node2");
    Membership far = *seen, farther = *seen;
    far.epoch = ms[0].epoch + comm::kProcessLossEpochs;
    far.process_losses.clear();
    farther.epoch = far.epoch + 1;
    farther.process_losses.clear();
    EXPECT_FALSE(comm::lost_a_process(ms[0], far));
    EXPECT_TRUE(comm::lost_a_process(ms[0], farther));
  }
}

// Per epoch an agent's workers may be in, whether that world lost a process: a node that
// joined after the workers' epoch and died is a loss of the later world only, so workers
// still in the earlier one finish their step instead of redoing it (the epoch notice's
// lost_since; a bare "some loss was noted at epoch 3" said yes to both).
TEST(Rendezvous, LossesSinceNameOnlyTheWorldsThatHadTheLostProcess) {
  InMemoryStore store;
  auto quick = [](const std::string& node) {  // forms as soon as min nodes are in
    RendezvousOptions o = options(node, 2, 3);
    o.last_call = 0s;
    return o;
  };
  std::vector<std::unique_ptr<Rendezvous>> agents;
  for (const char* n : {"node0", "node1"}) agents.push_back(std::make_unique<Rendezvous>(store, quick(n)));
  std::vector<Membership> ms = join_all(agents);  // epoch 1: node0, node1
  ASSERT_EQ(ms[0].epoch, 1);
  Rendezvous newcomer(store, quick("node2"));
  Membership two = newcomer.join();  // epoch 2: node0, node1, node2
  ASSERT_EQ(two.epoch, 2);
  std::optional<Membership> seen_two = agents[0]->poll_change();
  ASSERT_TRUE(seen_two.has_value());
  ASSERT_EQ(seen_two->epoch, 2);
  newcomer.leave();  // its workers failed: no hand-over
  std::optional<Membership> three = agents[0]->poll_change();
  ASSERT_TRUE(three.has_value());
  ASSERT_EQ(three->epoch, 3);
  ASSERT_EQ(three->members.size(), 2u);
  const std::map<int64_t, bool> lost = comm::losses_since({{1, ms[0]}, {2, two}}, *three);
  EXPECT_EQ(lost, (std::map<int64_t, bool>{{1, false}, {2, true}}));
  EXPECT_TRUE(comm::losses_since({{3, *three}}, *three).empty()) << "not before its own epoch";
}

TEST(Rendezvous, BelowMinAfterALeaveWaitsForANewcomerWhoTakesTheFreeRank) {
  InMemoryStore store;
  auto agents = make_agents(store, 2, 2, 2);
  std::vector<Membership> ms = join_all(agents);
  agents[0]->leave();
  EXPECT_EQ(agents[1]->poll_change(), std::nullopt) << "1 node, min 2: wait";
  Rendezvous newcomer(store, options("late", 2, 2));
  Membership m = newcomer.join();
  EXPECT_EQ(m.epoch, 2);
  EXPECT_EQ(m.node_rank, ms[0].node_rank);
  auto m1 = agents[1]->watch(20s);
  ASSERT_TRUE(m1.has_value());
  EXPECT_EQ(m1->members, m.members);
}

TEST(Rendezvous, ConcurrentJoinsNeverProduceDuplicateRanks) {
  constexpr int kRuns = 15, kNodes = 8;
  for (int run = 0; run < kRuns; ++run) {
    InMemoryStore store;
    std::vector<std::unique_ptr<Rendezvous>> agents;
    for (int i = 0; i < kNodes; ++i) {
      RendezvousOptions o = options(name("n", i), 2, kNodes);
      o.last_call = 10ms;  // early arrivals form an epoch, later ones grow it: many writers
      o.poll_interval = 5ms;
      agents.push_back(std::make_unique<Rendezvous>(store, o));
    }
    std::mt19937 rng(1234 + run);
    std::vector<int> jitter_us;
    for (int i = 0; i < kNodes; ++i) jitter_us.push_back(int(rng() % 30'000));
    // Each agent joins after its jitter, then polls until the membership holds everyone.
    std::vector<std::future<Membership>> f;
    for (int i = 0; i < kNodes; ++i)
      f.push_back(std::async(std::launch::async, [&, i] {
        std::this_thread::sleep_for(std::chrono::microseconds(jitter_us[i]));
        Membership m = agents[i]->join();
        std::set<int> seen;
        for (const auto& x : m.members) EXPECT_TRUE(seen.insert(x.node_rank).second);
        auto until = Clock::now() + 20s;
        while (m.world() < kNodes && Clock::now() < until) {
          if (auto next = agents[i]->poll_change()) {
            EXPECT_GT(next->epoch, m.epoch);
            EXPECT_EQ(next->node_rank, m.node_rank) << "a rank changed";
            m = *next;
          }
          std::this_thread::sleep_for(5ms);
        }
        return m;
      }));
    std::vector<Membership> ms;
    for (auto& x : f) ms.push_back(x.get());
    std::set<int> ranks;
    for (const auto& m : ms) {
      EXPECT_EQ(m.world(), kNodes) << "run " << run;
      EXPECT_EQ(m.members, ms[0].members) << "run " << run;
      ranks.insert(m.node_rank);
    }
    EXPECT_EQ(int(ranks.size()), kNodes) << "duplicate ranks in run " << run;
    EXPECT_EQ(*ranks.rbegin(), kNodes - 1) << "ranks are 0..N-1 without losses";
  }
}

TEST(Rendezvous, SixteenAgentsJoinAtOnce) {
  constexpr int kNodes = 16;
  InMemoryStore store;
  auto agents = make_agents(store, kNodes, kNodes, kNodes);
  const auto t0 = Clock::now();
  std::vector<Membership> ms = join_all(agents);
  double elapsed = ms_since(t0);
  std::set<int> ranks;
  for (const auto& m : ms) {
    EXPECT_EQ(m.epoch, 1);
    EXPECT_EQ(m.members, ms[0].members);
    ranks.insert(m.node_rank);
  }
  EXPECT_EQ(int(ranks.size()), kNodes);
  std::printf(
      "[ measure ] 16 agents (threads, in-memory store) joined epoch 1 in %.0f ms; "
      "record version %lld\n",
      elapsed, (long long)agents[0]->read_record().version);
}

TEST(Rendezvous, ClosedRendezvousTellsLateJoinersAndMembers) {
  InMemoryStore store;
  auto agents = make_agents(store, 2, 2, 2);
  join_all(agents);
  agents[0]->close("training finished at step 100");
  agents[0]->close("second reason is ignored");
  Rendezvous late(store, options("late", 2, 2));
  try {
    late.join();
    ADD_FAILURE() << "joined a closed rendezvous";
  } catch (const comm::RendezvousClosedError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("closed (training finished at step 100)"), std::string::npos) << m;
    EXPECT_NE(m.find("late may not join"), std::string::npos) << m;
  }
  EXPECT_THROW(agents[1]->poll_change(), comm::RendezvousClosedError);
}

TEST(Rendezvous, JoinTimeoutSaysWhatItWaitedFor) {
  InMemoryStore store;
  RendezvousOptions o = options("alone", 2, 3);
  o.heartbeat_interval = 50ms;
  o.heartbeat_timeout = 200ms;
  o.last_call = 0ms;
  o.join_timeout = 400ms;
  Rendezvous alone(store, o);
  try {
    alone.join();
    ADD_FAILURE() << "joined alone with min 2";
  } catch (const TimeoutError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("join_timeout (0.4 s)"), std::string::npos) << m;
    EXPECT_NE(m.find("1 of at least 2 nodes have joined"), std::string::npos) << m;
  }
  EXPECT_FALSE(store.check({alone.alive_key("alone")})) << "a node that gave up leaves no key";
  // A spare that finds no free slot says so.
  RendezvousOptions a = o, b = o;
  a.node_id = "a";
  a.min_nodes = a.max_nodes = 1;
  b.node_id = "b";
  b.min_nodes = b.max_nodes = 1;
  Rendezvous ra(store, a), rb(store, b);
  EXPECT_EQ(ra.join().world(), 1);
  try {
    rb.join();
    ADD_FAILURE() << "admitted beyond max";
  } catch (const TimeoutError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("waiting as a spare"), std::string::npos) << m;
    EXPECT_NE(m.find("full at max_nodes=1"), std::string::npos) << m;
  }
}

TEST(Rendezvous, BadOptionsAreRefusedNamingTheKey) {
  InMemoryStore store;
  RendezvousOptions o = options("n0", 2, 3);
  o.heartbeat_timeout = o.heartbeat_interval;
  try {
    Rendezvous r(store, o);
    ADD_FAILURE() << "accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.field(), "--rdzv-conf heartbeat_interval");
  }
  EXPECT_EQ(store.num_keys(), 0) << "nothing written";
}

TEST(Rendezvous, HeartbeatRecordsStoreFailuresWithoutThrowingFromItsThread) {
  InMemoryStore store;
  PartitionedView view(store);
  struct Failing : PartitionedView {
    using PartitionedView::PartitionedView;
    std::atomic<bool> fail{false};
    void set(const std::string& k, const Bytes& v, std::optional<Millis> ttl) override {
      if (fail) throw CommError("store unreachable (test)");
      PartitionedView::set(k, v, ttl);
    }
  } failing(store);
  comm::Heartbeat hb(failing, "rdzv/job/alive/x", 20ms, 500ms);
  hb.start();
  failing.fail = true;
  for (int i = 0; i < 500 && hb.failures() < 2; ++i) std::this_thread::sleep_for(5ms);
  EXPECT_GE(hb.failures(), 2u);
  ASSERT_TRUE(hb.failure().has_value());
  EXPECT_NE(hb.failure()->find("store unreachable"), std::string::npos);
  EXPECT_TRUE(hb.running()) << "it keeps trying";
  failing.fail = false;
  for (int i = 0; i < 500 && hb.failure(); ++i) std::this_thread::sleep_for(5ms);
  EXPECT_FALSE(hb.failure().has_value()) << "a later success clears the failure";
  hb.stop();
  EXPECT_TRUE(store.check({"rdzv/job/alive/x"})) << "stop() leaves the key to its TTL";
  EXPECT_TRUE(hb.stop_and_erase());
  EXPECT_FALSE(store.check({"rdzv/job/alive/x"}));
}

// --- Processes over a TCP store ----------------------------------------------------------

// Four processes: node0..node2 form epoch 1 (MIN 2, MAX 3), node3 waits as a spare; node2
// is SIGKILLed; node0 and node1 form epoch 2 with their ranks and node3 in node2's rank.
TEST(RendezvousProcesses, KilledNodeIsReplacedBySpareOverTcpStore) {
  RunOptions run;
  run.deadline = 60s;
  run.store_timeout = 10s;
  RunResult result = run_ranks(4, [](RankContext& ctx) {
    auto store = ctx.store();
    const std::string me = name("node", ctx.rank());
    Rendezvous r(*store, options(me, 2, 3));
    if (ctx.rank() == 3) {
      while (r.read_record().epoch < 1) std::this_thread::sleep_for(10ms);
      Membership m = r.join();  // a spare until node2 dies
      EXPECT_EQ(m.epoch, 2);
      EXPECT_EQ(m.world(), 3);
      store->set_string("spare_rank", std::to_string(m.node_rank));
      store->wait({"epoch2/node0", "epoch2/node1"}, 30s);  // its exit would be a loss too
      return;
    }
    Membership m1 = r.join();
    EXPECT_EQ(m1.epoch, 1);
    EXPECT_EQ(m1.world(), 3);
    store->set_string("rank1/" + me, std::to_string(m1.node_rank));
    if (ctx.rank() == 2) {
      // Killed once every member has its epoch-1 membership: a store on this machine drops a
      // killed process's key within milliseconds (no grace for a process that has exited),
      // so a kill before node0's or node1's join returned would give them epoch 2 there.
      store->wait({"rank1/node0", "rank1/node1"}, 30s);
      while (!r.read_record().is_spare("node3")) std::this_thread::sleep_for(10ms);
      store->set_string("killed_at", std::to_string(Clock::now().time_since_epoch().count()));
      ::raise(SIGKILL);
    }
    auto m2 = r.watch(30s);
    if (!m2) throw std::runtime_error(me + ": no epoch 2");
    auto killed = Clock::time_point(Clock::duration(std::stoll(store->get_string("killed_at"))));
    double elapsed = ms_since(killed);
    EXPECT_EQ(m2->epoch, 2);
    EXPECT_EQ(m2->node_rank, m1.node_rank) << "a survivor's rank changed";
    auto ranks = ranks_of(*m2);
    EXPECT_EQ(ranks.count("node2"), 0u);
    EXPECT_EQ(ranks.at("node3"), std::stoi(store->get_string("rank1/node2")))
        << "the spare takes the killed node's rank";
    std::printf("[ measure ] node%d: SIGKILL -> epoch 2 over TCP: %.0f ms\n", ctx.rank(), elapsed);
    std::fflush(stdout);
    // Nobody exits before both survivors saw epoch 2: an exited process is a lost node.
    store->set_string("epoch2/" + me, "1");
    store->wait({"epoch2/node0", "epoch2/node1"}, 30s);
  });
  ASSERT_EQ(result.ranks.size(), 4u);
  EXPECT_EQ(result.ranks[2].status, RankStatus::kSignaled) << result.summary();
  for (int r : {0, 1, 3})
    EXPECT_EQ(result.ranks[r].status, RankStatus::kOk) << result.ranks[r].message;
}

// Sixteen processes join at once with random jitter: one epoch, distinct ranks 0..N-1.
TEST(RendezvousProcesses, ConcurrentJoinOverTcpStoreGivesDistinctRanks) {
  static constexpr int kNodes = 16;
  RunResult result = run_ranks(kNodes, [](RankContext& ctx) {
    auto store = ctx.store();
    std::mt19937 rng(ctx.rank() * 7919 + ::getpid());
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 50'000));
    Rendezvous r(*store, options(name("p", ctx.rank()), kNodes, kNodes));
    const auto t0 = Clock::now();
    Membership m = r.join();
    const double took = ms_since(t0);
    EXPECT_EQ(m.world(), kNodes);
    EXPECT_LT(m.node_rank, kNodes);
    // Claim the rank: a second claim of the same rank would make add() return 2.
    EXPECT_EQ(store->add(name("claim/", m.node_rank), 1), 1) << "duplicate rank";
    store->set_string(name("took/", ctx.rank()), std::to_string(took));
    if (ctx.rank() != 0) return;
    double slowest = 0;
    for (int i = 0; i < kNodes; ++i)
      slowest = std::max(slowest, std::stod(store->get_string(name("took/", i))));
    std::printf(
        "[ measure ] %d processes over TCP: slowest join() %.0f ms (0-50 ms jitter), "
        "record version %lld\n",
        kNodes, slowest, (long long)r.read_record().version);
    std::fflush(stdout);
  });
  EXPECT_TRUE(result.ok()) << result.summary();
}

// Given a store of its own for the beats (the agent's over etcd, node_agent.cc), the
// heartbeat writes there and nowhere else: a beat stuck behind a dying etcd leader then holds
// only its own connection, not the one the agent's monitor reads the membership through.
TEST(Rendezvous, HeartbeatBeatsThroughTheBeatStoreWhenGivenOne) {
  auto shared = std::make_shared<InMemoryStore>();
  comm::PrefixStore agent("agent", shared), beats("beats", shared);
  Rendezvous r(agent, options("n0", 1, 1), &beats);
  r.heartbeat().start();
  EXPECT_TRUE(shared->check({"beats/" + r.alive_key("n0")}));
  EXPECT_FALSE(shared->check({"agent/" + r.alive_key("n0")}));
  EXPECT_TRUE(r.heartbeat().stop_and_erase());
  EXPECT_FALSE(shared->check({"beats/" + r.alive_key("n0")}));

  Rendezvous plain(agent, options("n1", 1, 1));  // without one: the agent's store
  plain.heartbeat().start();
  EXPECT_TRUE(shared->check({"agent/" + plain.alive_key("n1")}));
  plain.heartbeat().stop_and_erase();
}

}  // namespace
}  // namespace weft::test
