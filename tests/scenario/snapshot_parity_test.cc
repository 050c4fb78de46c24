// snapshot.redundancy: ec between real `weft snapshot-agent` processes on loopback (issue 15):
// three agents as three nodes, EC(k=2, m=1), two ranks per node of different sizes. Each
// commit's chunks reach their stripes' parity holders; when a ring without node 1 arrives,
// node 2 (the first survivor after it) rebuilds node 1's ranks from the survivors' data and
// parity, byte for byte, and lists them to the new world; a corrupt block of a survivor's
// own snapshot is repaired from parity when a read finds it; two lost nodes of three
// are more than m, and the rebuild says the stripe is lost. Every process is reaped and every
// segment unlinked however the test ends (SnapshotPeersTest).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <thread>

#include "base/error.h"
#include "checkpoint/snapshot_protocol.h"
#include "checkpoint/snapshot_segment.h"
#include "tests/scenario/snapshot_fixture.h"
#include "tests/support/private_shm.h"

namespace weft::checkpoint {
namespace {

constexpr int kNodes = 3, kLocals = 2, kWorld = kNodes * kLocals;

// Ranks of one node differ in size (a short last block, chunks padded differently).
int64_t bytes_of(int rank) { return kBytes + int64_t(rank) * 12345; }

bool holds_pattern(const std::string& name, int64_t step, int rank) {
  SnapshotSegment seg = SnapshotSegment::open(name, false);
  auto v = seg.latest();
  if (!v || v->meta.step != step || v->meta.payload_bytes != bytes_of(rank)) return false;
  const auto* p = static_cast<const uint8_t*>(v->payload);
  for (int64_t i = 0; i < v->meta.payload_bytes; ++i)
    if (p[i] != pattern(step, rank, i)) return false;
  return seg.corrupt_blocks(*v).empty();
}

// The newest committed step of a segment (-1: none, or no such segment).
int64_t newest_step(const std::string& name) {
  try {
    SnapshotSegment seg = SnapshotSegment::open(name, false);
    auto v = seg.latest();
    return v ? v->meta.step : -1;
  } catch (const std::exception&) {
    return -1;
  }
}

class SnapshotParity : public SnapshotPeersTest {
 protected:
  // Three agents with EC(2,1), told the ring of epoch 1, each holding its two ranks'
  // segments; snapshots of `steps` committed on every rank, and every parity fragment of
  // the last one committed.
  void start_three(const std::vector<int64_t>& steps) {
    for (int n = 0; n < kNodes; ++n) {
      start_agent(n, "parity-test-token", {"--redundancy", "ec", "--ec-k", "2", "--ec-m", "1"});
      clients_.push_back(client(n));
      endpoints_.push_back(clients_.back()->endpoint());
    }
    for (int n = 0; n < kNodes; ++n) {
      EXPECT_EQ(clients_[size_t(n)]->peers(job_, 1, n, endpoints_), "") << "ec has no successor";
      Reservation r{job_, n, 1, {}, 0};
      for (int l = 0; l < kLocals; ++l) r.ranks.push_back({n * kLocals + l, kWorld, bytes_of(n * kLocals + l)});
      data_.push_back(clients_[size_t(n)]->segment(r));
    }
    for (int64_t step : steps)
      for (int n = 0; n < kNodes; ++n)
        for (int l = 0; l < kLocals; ++l) {
          const int rank = n * kLocals + l;
          write_snapshot(data_[size_t(n)][size_t(l)], job_, n, 1, rank, kWorld, step, bytes_of(rank));
          clients_[size_t(n)]->committed(data_[size_t(n)][size_t(l)], step);
        }
    // Node n holds parity of stripes number l * 3 + r for its own r = (n - 2) mod 3.
    for (int n = 0; n < kNodes; ++n)
      for (int l = 0; l < kLocals; ++l)
        parity_.push_back(segment_name(job_, SegmentKind::kParity, n, 1, l * 3 + (n + 1) % 3));
    if (steps.empty()) return;  // reserved only
    ASSERT_TRUE(poll([&] {
      for (const std::string& p : parity_)
        if (newest_step(p) != steps.back()) return false;
      return true;
    })) << logs(kNodes);
  }

  // Three agents with EC(2,1), told the ring of epoch 1, one rank of `bytes` per node; node
  // 0's agent with `node0_env` in its environment. The data segments, by node.
  std::vector<std::string> start_one_rank_each(
      int64_t bytes, const std::vector<std::pair<std::string, std::string>>& node0_env = {}) {
    for (int n = 0; n < kNodes; ++n) {
      agent_env_ = n == 0 ? node0_env : decltype(agent_env_){};
      start_agent(n, "parity-test-token", {"--redundancy", "ec"});
      clients_.push_back(client(n));
      endpoints_.push_back(clients_.back()->endpoint());
    }
    agent_env_.clear();
    std::vector<std::string> seg;
    for (int n = 0; n < kNodes; ++n) {
      clients_[size_t(n)]->peers(job_, 1, n, endpoints_);
      seg.push_back(
          clients_[size_t(n)]->segment(Reservation{job_, n, 1, {{n, kNodes, bytes}}, 0})[0]);
    }
    return seg;
  }

  // Node `n`'s agent is killed and started again, as its weft run does (it adopts its
  // segments and listens on a new port): the new endpoint replaces the old in endpoints_.
  void restart(int n) {
    ::kill(pids_[size_t(n)], SIGKILL);
    ::waitpid(pids_[size_t(n)], nullptr, 0);
    pids_[size_t(n)] = 0;  // reaped
    start_agent(n, "parity-test-token", {"--redundancy", "ec", "--ec-k", "2", "--ec-m", "1"});
    clients_[size_t(n)] = client(n);
    old_endpoints_ = endpoints_;
    endpoints_[size_t(n)] = clients_[size_t(n)]->endpoint();
    ASSERT_NE(endpoints_[size_t(n)], old_endpoints_[size_t(n)]);
  }
  // Asserts that `node`'s agent lists node `lost`'s two ranks rebuilt at `step`, byte for byte.
  void expect_rebuilt(int node, int lost, int64_t epoch, int64_t step) {
    int rebuilt = 0;
    for (const SegmentInfo& s : clients_[size_t(node)]->list(epoch)) {
      const auto p = parse_segment_name(s.name);
      ASSERT_TRUE(p) << s.name;
      if (p->kind != SegmentKind::kRebuilt) continue;
      ++rebuilt;
      ASSERT_TRUE(s.committed) << s.name;
      EXPECT_EQ(s.committed->owner_node, lost) << s.name;
      EXPECT_EQ(s.committed->step, step) << s.name;
      EXPECT_TRUE(holds_pattern(s.name, step, s.committed->rank)) << s.name;
    }
    EXPECT_EQ(rebuilt, kLocals) << logs(kNodes);
  }

  std::vector<std::unique_ptr<SnapshotAgentClient>> clients_;
  std::vector<std::string> old_endpoints_;
  std::vector<std::string> endpoints_, parity_;
  std::vector<std::vector<std::string>> data_;
};

TEST_F(SnapshotParity, ALostNodesRanksAreRebuiltFromParityByTheNextSurvivor) {
  ASSERT_NO_FATAL_FAILURE(start_three({5, 6}));
  lose(1);
  // Epoch 2: nodes 0 and 2 of epoch 1 are nodes 0 and 1.
  clients_[0]->peers(job_, 2, 0, {endpoints_[0], endpoints_[2]});
  clients_[2]->peers(job_, 2, 1, {endpoints_[0], endpoints_[2]});
  const std::vector<SegmentInfo> on2 = clients_[2]->list(2), on0 = clients_[0]->list(2);
  int rebuilt = 0;
  for (const SegmentInfo& s : on2) {
    const auto p = parse_segment_name(s.name);
    ASSERT_TRUE(p) << s.name;
    if (p->kind != SegmentKind::kRebuilt) continue;
    ++rebuilt;
    ASSERT_TRUE(s.committed) << s.name;
    const SnapshotMeta& m = *s.committed;
    EXPECT_EQ(m.kind, SegmentKind::kRebuilt);
    EXPECT_EQ(m.owner_node, 1);
    EXPECT_EQ(m.epoch, 1);
    EXPECT_EQ(m.step, 6) << "the newest step every stripe has";
    EXPECT_EQ(m.world, kWorld);
    EXPECT_EQ(m.layout_hash, 0x1234abcd5678ef00ULL + uint64_t(m.rank));
    EXPECT_TRUE(m.rank == 2 || m.rank == 3) << m.rank;
    EXPECT_TRUE(holds_pattern(s.name, 6, m.rank)) << s.name << " is not node 1's rank's bytes";
  }
  EXPECT_EQ(rebuilt, kLocals) << logs(kNodes);
  for (const SegmentInfo& s : on0)
    EXPECT_NE(parse_segment_name(s.name)->kind, SegmentKind::kRebuilt)
        << "node 0 is not the designated rebuilder of node 1: " << s.name;
  EXPECT_NE(read(log(2)).find("rebuilt node 1's rank 2 (epoch 1, step 6) from parity"), std::string::npos)
      << read(log(2));
}

// Two losses in turn (issue 15): node 1 of three is lost, and the two left, fewer than
// k + m, are still coded, as one group with K = 1 (each holds its peer's rank as parity); then
// node 2 is lost too, and node 0 alone rebuilds node 2's ranks of epoch 2 from the parity it
// holds, byte for byte.
TEST_F(SnapshotParity, TwoNodesLeftStayCodedAndTheLastSurvivorRebuildsTheOther) {
  ASSERT_NO_FATAL_FAILURE(start_three({5}));
  lose(1);
  // Epoch 2: nodes 0 and 2 of epoch 1 are nodes 0 and 1, two ranks each of a world of 4.
  const std::vector<std::string> two = {endpoints_[0], endpoints_[2]};
  clients_[0]->peers(job_, 2, 0, two);
  clients_[2]->peers(job_, 2, 1, two);
  for (int agent : {0, 2})
    wait_for(log(agent),
             "epoch 2: this node is node \\d of 2; fewer than k \\+ m = 3 nodes: its "
             "snapshots are erasure-coded with ISA-L over one group of all 2 nodes with "
             "fewer data fragments, K = 1");
  constexpr int kWorld2 = 2 * kLocals;
  std::vector<std::vector<std::string>> seg(2);
  for (int node = 0; node < 2; ++node) {
    Reservation r{job_, node, 2, {}, 0};
    for (int l = 0; l < kLocals; ++l)
      r.ranks.push_back({node * kLocals + l, kWorld2, bytes_of(node * kLocals + l)});
    seg[size_t(node)] = clients_[size_t(node == 0 ? 0 : 2)]->segment(r);
  }
  for (int agent : {0, 2})
    EXPECT_NE(read(log(agent)).find("epoch 2: this node holds its parity of 1/1 of its own"),
              std::string::npos)
        << read(log(agent));
  for (int node = 0; node < 2; ++node)
    for (int l = 0; l < kLocals; ++l) {
      const int rank = node * kLocals + l;
      write_snapshot(seg[size_t(node)][size_t(l)], job_, node, 2, rank, kWorld2, 7, bytes_of(rank));
      clients_[size_t(node == 0 ? 0 : 2)]->committed(seg[size_t(node)][size_t(l)], 7);
    }
  // Node n holds the parity of its peer's local rank l: stripe l * 2 + (n + 1) mod 2.
  for (int node = 0; node < 2; ++node)
    for (int l = 0; l < kLocals; ++l) {
      const std::string p =
          segment_name(job_, SegmentKind::kParity, node, 2, l * 2 + (node + 1) % 2);
      EXPECT_TRUE(poll([&] { return newest_step(p) == 7; })) << p << "\n" << logs(kNodes);
    }
  // Node 1 of epoch 2 (agent 2) is lost whole: its agent and everything it held.
  lose(2);
  for (const std::string& name : snapshot_segments(job_)) {
    const auto p = parse_segment_name(name);
    if (p && p->epoch == 2 && p->owner_node == 1) SnapshotSegment::unlink(name);
  }
  clients_[0]->peers(job_, 3, 0, {endpoints_[0]});
  expect_rebuilt(0, 1, 3, 7);
  EXPECT_NE(read(log(0)).find("rebuilt node 1's rank 2 (epoch 2, step 7) from parity"),
            std::string::npos)
      << read(log(0));
  EXPECT_NE(read(log(0)).find("epoch 3: this node is node 0 of 1; fewer than m + 1 = 2 nodes: its "
                              "snapshots are not erasure-coded in this epoch"),
            std::string::npos)
      << read(log(0));
}

// A corrupt block is detected by its checksum and rebuilt from parity (issue 15) when a read
// finds it: a new world's list no longer checksums every slot first (that held each recovery
// for a pass over slots nobody reads), and the worker whose read failed asks for the repair.
TEST_F(SnapshotParity, ACorruptBlockIsRepairedFromParityWhenAReadFindsIt) {
  ASSERT_NO_FATAL_FAILURE(start_three({5}));
  const std::string victim = data_[0][1];  // node 0's rank 1
  {
    SnapshotSegment seg = SnapshotSegment::open(victim, true);
    auto v = seg.latest();
    ASSERT_TRUE(v);
    auto* p = static_cast<uint8_t*>(const_cast<void*>(v->payload));
    p[kSnapshotBlockBytes + 777] ^= 0x5a;  // block 1: in chunk 0
    p[3 * kSnapshotBlockBytes + 5] ^= 0xff;  // block 3: in chunk 1
    ASSERT_EQ(seg.corrupt_blocks(*v).size(), 2u);
  }
  clients_[0]->list(1);  // a world of epoch 1 forms again: nothing is checked yet
  ASSERT_FALSE(holds_pattern(victim, 5, 1));
  EXPECT_EQ(clients_[0]->repair(victim, 5), 2) << logs(kNodes);  // the reader's ask
  EXPECT_TRUE(holds_pattern(victim, 5, 1)) << logs(kNodes);
  EXPECT_NE(read(log(0)).find("2 corrupt block(s); repaired from parity (2 chunk(s))"),
            std::string::npos)
      << read(log(0));
  EXPECT_EQ(clients_[0]->repair(victim, 5), 0);  // intact now: nothing to do
  // What cannot be repaired is refused with the reason: a step the segment does not hold,
  // another node's segment.
  try {
    clients_[0]->repair(victim, 6);
    ADD_FAILURE() << "a repair of a step the segment does not hold was not refused";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("holds no committed snapshot of step 6"),
              std::string::npos)
        << e.what();
  }
  try {
    clients_[0]->repair(data_[1][0], 5);
    ADD_FAILURE() << "a repair of node 1's segment by node 0's agent was not refused";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("is not this node's"), std::string::npos) << e.what();
  }
}

// A killed agent's successor (weft run restarts it) takes over the parity it held.
TEST_F(SnapshotParity, ARestartedAgentAdoptsItsParity) {
  ASSERT_NO_FATAL_FAILURE(start_three({5}));
  const pid_t was = pids_[0];
  ::kill(was, SIGKILL);
  ::waitpid(was, nullptr, 0);
  pids_[0] = 0;  // reaped
  const pid_t again =
      start_agent(0, "parity-test-token", {"--redundancy", "ec", "--ec-k", "2", "--ec-m", "1"});
  client(0);  // answers once it serves: adoption is done by then
  for (const std::string& p : parity_) {
    if (parse_segment_name(p)->owner_node != 0) continue;
    EXPECT_NE(read(log(0)).find("adopted " + p + " (left by pid " + std::to_string(was)),
              std::string::npos)
        << read(log(0));
    EXPECT_EQ(SnapshotSegment::open(p, false).owner_pid(), again) << p;
    EXPECT_EQ(newest_step(p), 5) << p;
  }
}

TEST_F(SnapshotParity, TwoLostNodesOfThreeAreMoreThanMAndTheRebuildSaysSo) {
  ASSERT_NO_FATAL_FAILURE(start_three({5}));
  lose(1);
  lose(2);
  clients_[0]->peers(job_, 2, 0, {endpoints_[0]});
  for (const SegmentInfo& s : clients_[0]->list(2))
    EXPECT_NE(parse_segment_name(s.name)->kind, SegmentKind::kRebuilt) << s.name;
  const std::string text = read(log(0));
  EXPECT_NE(text.find("node 1 of epoch 1 is lost with 1 other(s) of its group: 2 nodes, more "
                      "than m = 1, so its snapshots could not be rebuilt from parity"),
            std::string::npos)
      << text;
}

// An agent restarted moments before a node is lost (issue 15): its weft run tells it the
// ring of epoch 1 with its new endpoint at once, the other nodes' weft runs only about a
// second later, and here never, since epoch 2 comes first. Node 0, the designated rebuilder
// of node 2, still has node 1's old endpoint in epoch 1's ring. Before, it counted node 1
// lost too (two of three: "more than m") and rebuilt nothing.
TEST_F(SnapshotParity, ARestartedAgentsNewEndpointIsNotCountedLostWhenANodeIsLostRightAfter) {
  ASSERT_NO_FATAL_FAILURE(start_three({5, 6}));
  ASSERT_NO_FATAL_FAILURE(restart(1));
  clients_[1]->peers(job_, 1, 1, endpoints_);  // its own weft run's ring: the new endpoint
  lose(2);
  clients_[0]->peers(job_, 2, 0, {endpoints_[0], endpoints_[1]});
  clients_[1]->peers(job_, 2, 1, {endpoints_[0], endpoints_[1]});
  ASSERT_NO_FATAL_FAILURE(expect_rebuilt(0, 2, 2, 6));
  const std::string text = read(log(0));
  EXPECT_EQ(text.find("more than m"), std::string::npos) << text;
  EXPECT_NE(text.find("node 1 of epoch 1 is node 1 at " + endpoints_[1] +
                      " (its agent restarted: epoch 1's ring had it at " + old_endpoints_[1] + ")"),
            std::string::npos)
      << text;
}

// The restart the other way round: node 1's agent dies just after node 0 was told epoch 2
// (its weft run published node 1's old endpoint for it), so node 0's rebuild of lost node 2
// cannot reach node 1's pieces. Moments later node 1's weft run restarts it and node 0 is
// told epoch 2 again with the new endpoint. Before, a ring told again queued nothing and
// node 2 stayed unrebuilt; now the rebuild that could not be done is retried.
TEST_F(SnapshotParity, ARebuildThatCouldNotReachARestartingAgentIsRetriedAtItsNewEndpoint) {
  ASSERT_NO_FATAL_FAILURE(start_three({5, 6}));
  ::kill(pids_[1], SIGKILL);
  ::waitpid(pids_[1], nullptr, 0);
  pids_[1] = 0;  // reaped
  lose(2);
  clients_[0]->peers(job_, 2, 0, {endpoints_[0], endpoints_[1]});
  for (const SegmentInfo& s : clients_[0]->list(2))  // settled: the rebuild failed
    ASSERT_NE(parse_segment_name(s.name)->kind, SegmentKind::kRebuilt) << s.name;
  EXPECT_NE(read(log(0)).find("could not be rebuilt from parity"), std::string::npos) << read(log(0));
  start_agent(1, "parity-test-token", {"--redundancy", "ec", "--ec-k", "2", "--ec-m", "1"});
  clients_[1] = client(1);
  const std::string again = clients_[1]->endpoint();
  clients_[1]->peers(job_, 2, 1, {endpoints_[0], again});
  clients_[0]->peers(job_, 2, 0, {endpoints_[0], again});
  ASSERT_NO_FATAL_FAILURE(expect_rebuilt(0, 2, 2, 6));
}

// Each weft run tells its own agent the ring: node 0's arrives after nodes 1 and 2 pushed
// the chunks of the stripes it holds. Before, it refused them ("no ring of epoch 1 here
// yet") and they were sent again only at those nodes' next commit: the step stayed
// unprotected. Now the chunk waits for the ring a little (once per epoch).
TEST_F(SnapshotParity, AHolderToldItsRingAfterTheDataNodesPushedStillKeepsTheParity) {
  for (int n = 0; n < kNodes; ++n) {
    start_agent(n, "parity-test-token", {"--redundancy", "ec", "--ec-k", "2", "--ec-m", "1"});
    clients_.push_back(client(n));
    endpoints_.push_back(clients_.back()->endpoint());
  }
  for (int n = 1; n < kNodes; ++n) {
    clients_[size_t(n)]->peers(job_, 1, n, endpoints_);
    Reservation r{job_, n, 1, {}, 0};
    for (int l = 0; l < kLocals; ++l) r.ranks.push_back({n * kLocals + l, kWorld, bytes_of(n * kLocals + l)});
    const std::vector<std::string> d = clients_[size_t(n)]->segment(r);
    for (int l = 0; l < kLocals; ++l) {
      write_snapshot(d[size_t(l)], job_, n, 1, n * kLocals + l, kWorld, 5, bytes_of(n * kLocals + l));
      clients_[size_t(n)]->committed(d[size_t(l)], 5);
    }
  }
  std::this_thread::sleep_for(milliseconds(500));  // the chunks reach node 0 before its ring
  clients_[0]->peers(job_, 1, 0, endpoints_);
  // Node 0 holds the parity of stripes l * 3 + 1, whose data members are nodes 1 and 2.
  for (int l = 0; l < kLocals; ++l) {
    const std::string p = segment_name(job_, SegmentKind::kParity, 0, 1, l * 3 + 1);
    EXPECT_TRUE(poll([&] { return newest_step(p) == 5; }, 10)) << p << "\n" << logs(kNodes);
  }
}

// The same restart with no node lost: the next epoch keeps all three nodes (a restart
// round). Before, node 2 (the first after node 1) counted node 1 lost by its old endpoint
// and rebuilt its ranks for nothing.
TEST_F(SnapshotParity, ARestartedAgentIsNotRebuiltWhenTheNextEpochKeepsItsNode) {
  ASSERT_NO_FATAL_FAILURE(start_three({5}));
  ASSERT_NO_FATAL_FAILURE(restart(1));
  clients_[1]->peers(job_, 1, 1, endpoints_);
  for (int n = 0; n < kNodes; ++n) clients_[size_t(n)]->peers(job_, 2, n, endpoints_);
  for (int n = 0; n < kNodes; ++n)
    for (const SegmentInfo& s : clients_[size_t(n)]->list(2))
      EXPECT_NE(parse_segment_name(s.name)->kind, SegmentKind::kRebuilt) << s.name << logs(kNodes);
  for (int n = 0; n < kNodes; ++n)
    EXPECT_EQ(read(log(n)).find("is lost"), std::string::npos) << logs(kNodes);
}

// A restarted agent told only the new epoch's ring (its weft run moved to epoch 2 before it
// could tell the agent epoch 1's): node 1's agent restarts, node 0 is lost, and node 1, the
// first survivor after node 0, is the one to rebuild it. Before, it knew no previous ring
// and queued nothing; now it finds epoch 1 in its segments (it was node 1), takes that
// epoch's ring from node 2 and rebuilds node 0's ranks.
TEST_F(SnapshotParity, ARestartedAgentToldOnlyTheNewRingRebuildsTheNodeItIsDesignatedFor) {
  ASSERT_NO_FATAL_FAILURE(start_three({5, 6}));
  ASSERT_NO_FATAL_FAILURE(restart(1));
  lose(0);
  // Epoch 2: nodes 1 and 2 of epoch 1 are nodes 0 and 1.
  clients_[1]->peers(job_, 2, 0, {endpoints_[1], endpoints_[2]});
  clients_[2]->peers(job_, 2, 1, {endpoints_[1], endpoints_[2]});
  ASSERT_NO_FATAL_FAILURE(expect_rebuilt(1, 0, 2, 6));
  const std::string text = read(log(1));
  EXPECT_NE(text.find("epoch 2: this agent was not told the ring of epoch 1 (restarted since?); "
                      "it was its node 1 of 3"),
            std::string::npos)
      << text;
  for (const SegmentInfo& s : clients_[2]->list(2))
    EXPECT_NE(parse_segment_name(s.name)->kind, SegmentKind::kRebuilt) << s.name;
}

// An agent's listener closes a peer connection idle for the transport's timeout (10 s by
// default, 1 s here): commits further apart than that still reach every holder, on a new
// connection. Before, the kept connection failed at the next commit and that step went
// unprotected ("retrying at the next commit"): every other snapshot at such intervals.
TEST_F(SnapshotParity, CommitsFurtherApartThanThePeerTimeoutStillReachTheHolders) {
  agent_env_ = {{"WEFT_SNAPSHOT_TIMEOUT_MS", "1000"}};
  ASSERT_NO_FATAL_FAILURE(start_three({5}));
  for (int64_t step : {6, 7}) {
    std::this_thread::sleep_for(milliseconds(2500));  // the holders drop the idle connections
    for (int n = 0; n < kNodes; ++n)
      for (int l = 0; l < kLocals; ++l) {
        const int rank = n * kLocals + l;
        write_snapshot(data_[size_t(n)][size_t(l)], job_, n, 1, rank, kWorld, step, bytes_of(rank));
        clients_[size_t(n)]->committed(data_[size_t(n)][size_t(l)], step);
      }
    EXPECT_TRUE(poll([&] {
      for (const std::string& p : parity_)
        if (newest_step(p) != step) return false;
      return true;
    }, 10)) << "step " << step << "\n" << logs(kNodes);
  }
  EXPECT_EQ(logs(kNodes).find("failed"), std::string::npos) << logs(kNodes);
}

// How fast parity is made and a lost rank rebuilt on loopback, printed (no threshold): one
// 96 MiB rank per node, EC(2,1). Coding: from the commits to every parity fragment
// committed; rebuild: from the new ring to the rebuilt rank listed (asking the holders,
// fetching K fragments per chunk, decoding, checking, committing).
TEST_F(SnapshotParity, ParityAndRebuildThroughputOnLoopback) {
  const int64_t big = int64_t(96) << 20;
  const std::vector<std::string> seg = start_one_rank_each(big);
  std::vector<std::string> parity;
  for (int n = 0; n < kNodes; ++n)
    parity.push_back(segment_name(job_, SegmentKind::kParity, n, 1, (n + 1) % 3));
  double code_s = 0;
  for (int64_t step = 1; step <= 3; ++step) {
    for (int n = 0; n < kNodes; ++n) write_snapshot(seg[size_t(n)], job_, n, 1, n, kNodes, step, big);
    const auto t0 = Clock::now();
    for (int n = 0; n < kNodes; ++n) clients_[size_t(n)]->committed(seg[size_t(n)], step);
    ASSERT_TRUE(poll([&] {
      for (const std::string& p : parity)
        if (newest_step(p) != step) return false;
      return true;
    }, 120)) << logs(kNodes);
    code_s = std::chrono::duration<double>(Clock::now() - t0).count();  // the last, warm
  }
  lose(1);
  clients_[0]->peers(job_, 2, 0, {endpoints_[0], endpoints_[2]});
  const auto t1 = Clock::now();
  clients_[2]->peers(job_, 2, 1, {endpoints_[0], endpoints_[2]});
  bool rebuilt = false;
  for (const SegmentInfo& s : clients_[2]->list(2))
    rebuilt = rebuilt || (parse_segment_name(s.name)->kind == SegmentKind::kRebuilt &&
                          s.committed && s.committed->step == 3 && s.committed->rank == 1);
  const double rebuild_s = std::chrono::duration<double>(Clock::now() - t1).count();
  ASSERT_TRUE(rebuilt) << logs(kNodes);
  const std::string name = segment_name(job_, SegmentKind::kRebuilt, 1, 1, 1);
  SnapshotSegment r = SnapshotSegment::open(name, false);
  auto v = r.latest();
  ASSERT_TRUE(v);
  const auto* p = static_cast<const uint8_t*>(v->payload);
  for (int64_t i = 0; i < big; i += 4093) ASSERT_EQ(p[i], pattern(3, 1, i)) << i;
  std::printf(
      "[ measured ] EC(2,1) on loopback, one %lld MiB rank per node: parity of a step coded in "
      "%.0f ms (%.0f MB/s of snapshots); a lost rank rebuilt and listed in %.0f ms (%.0f MB/s)\n",
      (long long)(big >> 20), code_s * 1e3, 3 * double(big) / 1e6 / code_s, rebuild_s * 1e3,
      double(big) / 1e6 / rebuild_s);
  const std::string text = read(log(2));
  const size_t at = text.find("rebuilt node 1's rank 1");
  if (at != std::string::npos)
    std::printf("[ says     ] %s\n", text.substr(at, text.find('\n', at) - at).c_str());
}

// A rebuild whose fetches are cut mid-stream (the surviving peer it fetches from is killed
// half way through) fails whole: the half-decoded segment is never committed or listed, the
// list of the new epoch still answers (the rebuild does not hang on the dead peer's other
// connections), and the new world falls back to what survives (here, with two of three nodes
// gone, the durable checkpoint).
TEST_F(SnapshotParity, ARebuildWhosePeerIsKilledHalfWayListsNothingHalfDecoded) {
  const int64_t big = int64_t(128) << 20;
  // Node 0 serves its first fragment whole and holds the fetches of the second.
  const std::vector<std::string> seg =
      start_one_rank_each(big, {{"WEFT_TEST_HOLD_FETCHES_AFTER", "1"}});
  for (int n = 0; n < kNodes; ++n) {
    write_snapshot(seg[size_t(n)], job_, n, 1, n, kNodes, 3, big);
    clients_[size_t(n)]->committed(seg[size_t(n)], 3);
  }
  ASSERT_TRUE(poll(
      [&] {
        for (int n = 0; n < kNodes; ++n)
          if (newest_step(segment_name(job_, SegmentKind::kParity, n, 1, (n + 1) % 3)) != 3)
            return false;
        return true;
      },
      120))
      << logs(kNodes);
  lose(1);
  // Node 2 rebuilds node 1 from its own fragments and node 0's: node 0 sends its data chunk of
  // one stripe and its parity of the other, 64 MiB each, one fragment after the other. It
  // serves the first whole and holds the second (the first fragment fetched, decoded and
  // written into the rebuilt segment: the rebuild half done); then it is killed.
  clients_[0]->peers(job_, 2, 0, {endpoints_[0], endpoints_[2]});
  clients_[2]->peers(job_, 2, 1, {endpoints_[0], endpoints_[2]});
  auto served = [&] {
    const std::string t = read(log(0));
    int count = 0;
    for (size_t at = t.find("serving fetches of"); at != std::string::npos;
         at = t.find("serving fetches of", at + 1))
      ++count;
    return count;
  };
  ASSERT_TRUE(poll([&] { return served() >= 2; }, 60)) << logs(kNodes);
  lose(0);
  const std::vector<SegmentInfo> listed = clients_[2]->list(2);
  const std::string said = read(log(2));
  EXPECT_EQ(said.find("rebuilt node 1's rank 1"), std::string::npos)
      << "node 0 held the second fragment, yet the rebuild finished\n"
      << said;
  for (const SegmentInfo& s : listed)
    EXPECT_FALSE(parse_segment_name(s.name)->kind == SegmentKind::kRebuilt && s.committed)
        << s.name << " is listed committed after node 0 was killed mid-rebuild\n"
        << logs(kNodes);
  const std::string name = segment_name(job_, SegmentKind::kRebuilt, 1, 1, 1);
  try {
    EXPECT_FALSE(SnapshotSegment::open(name, false).latest()) << name << " was committed";
  } catch (const std::exception&) {  // not there at all: nothing committed either
  }
  EXPECT_NE(said.find("node 1's local rank 0 not rebuilt at step 3"), std::string::npos) << said;
  EXPECT_NE(said.find("could not be rebuilt from parity"), std::string::npos) << said;
  EXPECT_EQ(said.find("did not finish within"), std::string::npos)
      << "the list waited for its limit: the rebuild hung on the dead peer\n"
      << said;
}

// ---- a parity holder without room --------------------------------------------------------

// The agents of SnapshotParity in a mount namespace of this test process with a small tmpfs
// on /dev/shm (the agents inherit it), so that a nearly full /dev/shm costs a few MiB of
// memory and the system's /dev/shm is never touched. Skipped where unshare or mount is not
// permitted (not root, or a container without CAP_SYS_ADMIN).
class SnapshotParityRoom : public SnapshotParity {
 protected:
  void SetUp() override {
    SnapshotParity::SetUp();
    margin_ = test::PrivateShm::snapshot_margin();
    shm_ = std::make_unique<test::PrivateShm>(margin_ + (int64_t(128) << 20));
    if (!shm_->skip_reason().empty()) GTEST_SKIP() << shm_->skip_reason();
  }
  void TearDown() override {
    SnapshotParity::TearDown();  // kills and reaps the agents, unlinks in the private tmpfs
    if (shm_) {
      const std::string error = shm_->leave();  // frees what was written there
      if (!error.empty()) ADD_FAILURE() << error;
    }
  }
  // What a new segment may take in /dev/shm now, as the agent judges it (free less margin).
  int64_t room() const {
    struct statvfs sv {};
    EXPECT_EQ(::statvfs("/dev/shm", &sv), 0);
    return int64_t(sv.f_bavail) * int64_t(sv.f_frsize) - margin_;
  }
  // Takes `bytes` of /dev/shm (allocated: the agents' statvfs sees them gone).
  void fill(int64_t bytes) {
    const int fd = ::open(filler_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    ASSERT_GE(fd, 0) << std::strerror(errno);
    const int e = ::posix_fallocate(fd, 0, off_t(bytes));
    ::close(fd);
    ASSERT_EQ(e, 0) << std::strerror(e);
  }
  void commit_all(int64_t step) {
    for (int n = 0; n < kNodes; ++n)
      for (int l = 0; l < kLocals; ++l) {
        const int rank = n * kLocals + l;
        write_snapshot(data_[size_t(n)][size_t(l)], job_, n, 1, rank, kWorld, step, bytes_of(rank));
        clients_[size_t(n)]->committed(data_[size_t(n)][size_t(l)], step);
      }
  }

  int64_t margin_ = 0;
  std::unique_ptr<test::PrivateShm> shm_;
  const std::string filler_ = "/dev/shm/weft-test-filler";
};

// Issue 15: a parity holder must refuse parity it cannot fit, clearly, and neither crash nor
// corrupt anything. At reserve: a node whose own snapshots fit but not with its share of the
// other nodes' parity is refused naming snapshot.every and the parity. Later, with /dev/shm
// nearly full: every holder keeps no parity segment of that step and says so; the data node
// whose chunk completed a stripe is told (before, it was answered ok and believed its step
// protected); every agent still serves and every snapshot is intact; once memory is free
// again the next step's parity is kept.
TEST_F(SnapshotParityRoom, AHolderWithoutRoomRefusesParityClearlyAndCorruptsNothing) {
  ASSERT_NO_FATAL_FAILURE(start_three({}));
  {
    const int64_t b = room() / 4;  // three data slots fit, with the parity share (2b) they do not
    try {
      clients_[0]->segment(Reservation{job_, 0, 2, {{0, kWorld, b}}, 0});
      ADD_FAILURE() << "a reserve of " << (b >> 20) << " MiB with " << (room() >> 20)
                    << " MiB of room was taken\n" << read(log(0));
    } catch (const ConfigError& e) {
      EXPECT_EQ(e.field(), "snapshot.every");
      EXPECT_NE(std::string(e.what()).find(
                    "of parity of other nodes' snapshots (snapshot.redundancy: ec)"),
                std::string::npos)
          << e.what();
    }
  }
  ASSERT_NO_FATAL_FAILURE(fill(room() - (int64_t(2) << 20)));  // 2 MiB left: no parity segment fits
  commit_all(5);
  for (int n = 0; n < kNodes; ++n)
    wait_for(log(n), "parity of stripe \\d+ \\(epoch 1, step 5\\) not kept on node " +
                         std::to_string(n) + ": [0-9.]+ MiB do not fit in node memory there",
             kLocals);
  EXPECT_TRUE(poll([&] {
    return logs(kNodes).find("; this step of it is not protected") != std::string::npos;
  })) << logs(kNodes);
  for (int n = 0; n < kNodes; ++n) {
    EXPECT_EQ(::kill(pids_[size_t(n)], 0), 0) << "agent " << n << " died\n" << logs(kNodes);
    EXPECT_NO_THROW(clients_[size_t(n)]->list()) << logs(kNodes);
    for (int l = 0; l < kLocals; ++l)
      EXPECT_TRUE(holds_pattern(data_[size_t(n)][size_t(l)], 5, n * kLocals + l)) << logs(kNodes);
  }
  for (const std::string& p : parity_) EXPECT_FALSE(exists(p)) << p;

  ::unlink(filler_.c_str());
  commit_all(6);
  EXPECT_TRUE(poll([&] {
    for (const std::string& p : parity_)
      if (newest_step(p) != 6) return false;
    return true;
  })) << logs(kNodes);
  EXPECT_NE(logs(kNodes).find("(epoch 1) is kept again from step 6"), std::string::npos)
      << logs(kNodes);
}

// A reduced epoch (two nodes left of three, K = 1) makes each node hold parity of all of its
// peer's bytes, twice what the job's start counted (issue 15). A node whose own snapshots fit
// but not with that parity is not refused (that would stop its snapshots): it holds no parity
// in the epoch and says so with the numbers (a peer whose parity fits says that, with its
// numbers); its peer's chunks are refused with that reason
// and its peer says they are not protected; every agent still serves, every snapshot is
// intact, and no parity of the epoch is kept on it.
TEST_F(SnapshotParityRoom, AReducedEpochsParityThatDoesNotFitLeavesItUncodedAndCorruptsNothing) {
  ASSERT_NO_FATAL_FAILURE(start_three({}));
  for (int n = 0; n < kNodes; ++n)  // epoch 1's targets allocated: the room below is settled
    wait_for(log(n), "epoch 1: made ahead the segment\\(s\\) a rebuild of node");
  lose(2);
  const std::vector<std::string> two = {endpoints_[0], endpoints_[1]};
  clients_[0]->peers(job_, 2, 0, two);
  clients_[1]->peers(job_, 2, 1, two);
  // Node 1: one small rank, whose parity fits (and it says so, with the numbers).
  const std::string small =
      clients_[1]->segment(Reservation{job_, 1, 2, {{1, 2, kBytes}}, 0}).at(0);
  wait_for(log(1),
           "epoch 2: this node holds its parity of 1/1 of its own [0-9.]+ MiB \\(the epoch "
           "has fewer than k \\+ m = 3 nodes: one group, K = 1\\).* fit in the");
  wait_for(log(1), "epoch 2: made ahead the segment\\(s\\) a rebuild of node");
  // Node 0: three data slots of b take 3/5 of the room; its parity (2 slots of about 2 b)
  // would not fit beside them.
  const int64_t b = room() / 5;
  const std::string big = clients_[0]->segment(Reservation{job_, 0, 2, {{0, 2, b}}, 0}).at(0);
  const std::string why = wait_for(
      log(0),
      "epoch 2: this node holds no parity in this epoch: (parity of 1/1 of its own [0-9.]+ "
      "MiB .* do not fit in the [0-9.]+ MiB free)");
  EXPECT_NE(why.find("K = 1"), std::string::npos) << why;
  write_snapshot(big, job_, 0, 2, 0, 2, 7, b);
  clients_[0]->committed(big, 7);
  write_snapshot(small, job_, 1, 2, 1, 2, 7, kBytes);
  clients_[1]->committed(small, 7);
  wait_for(log(1),
           "parity chunk of \\S+ step 7 refused by node 0 at \\S+: parity of 1/1 .* not "
           "erasure-coded in this epoch");
  for (int n = 0; n < 2; ++n) {
    EXPECT_EQ(::kill(pids_[size_t(n)], 0), 0) << "agent " << n << " died\n" << logs(2);
    EXPECT_NO_THROW(clients_[size_t(n)]->list()) << logs(2);
  }
  {
    SnapshotSegment seg = SnapshotSegment::open(small, false);
    auto v = seg.latest();
    ASSERT_TRUE(v && v->meta.step == 7) << logs(2);
    EXPECT_TRUE(seg.corrupt_blocks(*v).empty());
    SnapshotSegment mine = SnapshotSegment::open(big, false);
    auto w = mine.latest();
    ASSERT_TRUE(w && w->meta.step == 7) << logs(2);
    EXPECT_TRUE(mine.corrupt_blocks(*w).empty());
  }
  for (const std::string& name : snapshot_segments(job_)) {
    const auto p = parse_segment_name(name);
    EXPECT_FALSE(p && p->kind == SegmentKind::kParity && p->epoch == 2 && p->owner_node == 0)
        << name << " kept on the node that declined its parity";
  }
}

// The ec memory check counts the rebuild targets made ahead (snapshot_parity.h, prepare):
// a reserve whose room fits its slots and its parity share but not the segments it would
// rebuild its group's previous node into, with the decode's pieces, is refused naming
// snapshot.every and those bytes; the same ranks in an epoch whose targets were asked for
// already (they are in the room's bytes now) are taken.
TEST_F(SnapshotParityRoom, AReserveWithoutRoomForTheRebuildTargetMadeAheadIsRefusedNamingIt) {
  ASSERT_NO_FATAL_FAILURE(start_three({}));
  for (int n = 0; n < kNodes; ++n)  // epoch 1's targets allocated: the room below is settled
    wait_for(log(n), "epoch 1: made ahead the segment\\(s\\) a rebuild of node");
  // Three data slots of b and the parity share (2 b) take 5 b of 6; the targets (b and six
  // pieces of b / 2) do not fit beside them.
  const int64_t b = room() / 6;
  const Reservation fresh{job_, 0, 2, {{0, kWorld, b}}, 0};
  try {
    clients_[0]->segment(fresh);
    ADD_FAILURE() << "a reserve of " << (b >> 20) << " MiB with " << (room() >> 20)
                  << " MiB of room was taken\n" << read(log(0));
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.field(), "snapshot.every");
    EXPECT_NE(std::string(e.what()).find(
                  " for the segments a rebuild of the group's previous node would write, made "
                  "ahead with the decode's pieces (snapshot.redundancy: ec)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(exists(segment_name(job_, SegmentKind::kData, 0, 2, 0)));
  // Epoch 1's targets were made by its first reserve: a rank of b more in it is taken.
  EXPECT_NO_THROW(clients_[0]->segment(Reservation{job_, 0, 1, {{5, kWorld, b}}, 0}))
      << read(log(0));
}

}  // namespace
}  // namespace weft::checkpoint
