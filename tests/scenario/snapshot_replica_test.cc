// snapshot.redundancy: replica, the transport alone (issue 15): real `weft snapshot-agent`
// processes on loopback, told their ring with `peers`. A committed snapshot of node 0 turns
// up in node 1's agent as a replica with the same bytes and the original rank's meta, two
// slots deep; a newer epoch retires it; finish removes it. An agent with another token is
// refused (logged on both sides) and nothing of its is written. The push throughput is
// measured on a large payload. Every process is killed and reaped and every segment of the
// test's jobs unlinked in TearDown, however the test ends.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <thread>

#include "base/error.h"
#include "checkpoint/job_id.h"
#include "checkpoint/snapshot_protocol.h"
#include "checkpoint/snapshot_segment.h"
#include "tests/scenario/snapshot_fixture.h"

namespace weft::checkpoint {
namespace {

class SnapshotReplica : public SnapshotPeersTest {
 protected:
  pid_t start_agent(int node, const std::string& token) {
    return SnapshotPeersTest::start_agent(node, token, {"--redundancy", "replica"});
  }
  // Two agents, nodes 0 and 1, each told epoch 1's ring (each is the other's successor):
  // their clients, and node 1's agent's pid.
  struct Ring {
    std::unique_ptr<SnapshotAgentClient> a, b;
    pid_t peer = -1;
  };
  Ring ring_of_two() {
    Ring r;
    start_agent(0, "replica-test-token");
    r.peer = start_agent(1, "replica-test-token");
    r.a = client(0), r.b = client(1);
    const std::string ea = r.a->endpoint(), eb = r.b->endpoint();
    r.a->peers(job_, 1, 0, {ea, eb});
    r.b->peers(job_, 1, 1, {ea, eb});
    return r;
  }
};

// An agent's listener closes a peer connection idle for the transport's timeout (10 s by
// default, 1 s here): a commit further apart than that still reaches the successor, on a new
// connection. Before, the kept connection failed at that commit and its replica was not
// pushed until the next one.
TEST_F(SnapshotReplica, CommitsFurtherApartThanThePeerTimeoutStillReachTheSuccessor) {
  agent_env_ = {{"WEFT_SNAPSHOT_TIMEOUT_MS", "1000"}};
  Ring ring = ring_of_two();
  auto &a = ring.a, &b = ring.b;
  const std::vector<std::string> da = a->segment(Reservation{job_, 0, 1, {{0, 2, kBytes}}, 0});
  const std::string ra = segment_name(job_, SegmentKind::kReplica, 0, 1, 0);  // on node 1
  for (int64_t step : {5, 6, 7}) {
    if (step > 5) std::this_thread::sleep_for(milliseconds(2500));  // idle: node 1 drops it
    write_snapshot(da[0], job_, 0, 1, 0, 2, step);
    a->committed(da[0], step);
    EXPECT_TRUE(poll([&] { return listed_step(*b, ra) == step; }, 10))
        << "step " << step << "\n" << read(log(0)) << read(log(1));
  }
  EXPECT_TRUE(same_bytes(da[0], ra));
  EXPECT_EQ(read(log(0)).find("failed"), std::string::npos) << read(log(0));
  // Node 1 closed an idle connection, not a hung peer's.
  EXPECT_EQ(read(log(1)).find("hung"), std::string::npos) << read(log(1));
}

// Node 0 pushes to node 1 and node 1 to node 0 (a ring of two); the replica is the original
// rank's snapshot byte for byte, kept two slots deep, retired by a newer epoch's commit and
// removed by finish.
TEST_F(SnapshotReplica, ACommitIsListedByTheNextNodesAgentWithTheSameBytes) {
  start_agent(0, "replica-test-token");
  start_agent(1, "replica-test-token");
  auto a = client(0), b = client(1);
  const std::string ea = a->endpoint(), eb = b->endpoint();
  ASSERT_TRUE(ea.starts_with("127.0.0.1:") && ea != "127.0.0.1:0") << ea;
  ASSERT_TRUE(eb.starts_with("127.0.0.1:")) << eb;
  EXPECT_EQ(a->peers(job_, 1, 0, {ea, eb}), eb);
  EXPECT_EQ(b->peers(job_, 1, 1, {ea, eb}), ea);
  const std::vector<std::string> da = a->segment(Reservation{job_, 0, 1, {{0, 2, kBytes}}, 0});
  const std::vector<std::string> db = b->segment(Reservation{job_, 1, 1, {{1, 2, kBytes}}, 0});

  write_snapshot(da[0], job_, 0, 1, 0, 2, 5);
  a->committed(da[0], 5);
  write_snapshot(db[0], job_, 1, 1, 1, 2, 5);
  b->committed(db[0], 5);
  const std::string ra = segment_name(job_, SegmentKind::kReplica, 0, 1, 0);  // on node 1
  const std::string rb = segment_name(job_, SegmentKind::kReplica, 1, 1, 1);  // on node 0
  ASSERT_TRUE(poll([&] { return listed_step(*b, ra) == 5; })) << read(log(0)) << read(log(1));
  ASSERT_TRUE(poll([&] { return listed_step(*a, rb) == 5; })) << read(log(0)) << read(log(1));
  EXPECT_TRUE(same_bytes(da[0], ra));
  EXPECT_TRUE(same_bytes(db[0], rb));
  for (const SegmentInfo& s : b->list()) {
    if (s.name != ra) continue;
    ASSERT_TRUE(s.committed.has_value());
    const SnapshotMeta& m = *s.committed;
    EXPECT_EQ(m.kind, SegmentKind::kReplica);
    EXPECT_EQ(m.job_id, job_);
    EXPECT_EQ(m.owner_node, 0);
    EXPECT_EQ(m.epoch, 1);
    EXPECT_EQ(m.rank, 0);
    EXPECT_EQ(m.world, 2);
    EXPECT_EQ(m.layout_hash, 0x1234abcd5678ef00ULL);
    EXPECT_EQ(m.payload_bytes, kBytes);
    EXPECT_EQ(s.capacity, kBytes);
    EXPECT_EQ(s.epoch, 1);
    EXPECT_EQ(s.rank, 0);
  }
  // The next commit lands in the other slot: both steps are there.
  write_snapshot(da[0], job_, 0, 1, 0, 2, 6);
  a->committed(da[0], 6);
  ASSERT_TRUE(poll([&] { return listed_step(*b, ra) == 6; })) << read(log(1));
  EXPECT_TRUE(same_bytes(da[0], ra));
  {
    SnapshotSegment r = SnapshotSegment::open(ra, false);
    auto s0 = r.slot(0), s1 = r.slot(1);
    ASSERT_TRUE(s0 && s1);
    EXPECT_EQ(std::min(s0->meta.step, s1->meta.step), 5);
    EXPECT_EQ(std::max(s0->meta.step, s1->meta.step), 6);
  }
  EXPECT_NE(read(log(0)).find("first replica pushed: " + da[0] + " step 5 to node 1 at " + eb),
            std::string::npos)
      << read(log(0));
  EXPECT_NE(read(log(1)).find("holding replicas of node 0's rank 0 (epoch 1) in " + ra),
            std::string::npos)
      << read(log(1));

  // Epoch 2 complete on node 1: its replicas of epoch 1 go with its own epoch-1 snapshots.
  const std::vector<std::string> d2 = b->segment(Reservation{job_, 0, 2, {{0, 1, kBytes}}, 0});
  write_snapshot(d2[0], job_, 0, 2, 0, 1, 7);
  b->committed(d2[0], 7);
  EXPECT_FALSE(exists(ra));
  EXPECT_EQ(listed_step(*b, ra), -1);
  EXPECT_NE(read(log(1)).find("removed replica " + ra + ": epoch superseded by epoch 2"),
            std::string::npos)
      << read(log(1));
  // finish removes the replicas a node holds along with its own segments.
  ASSERT_TRUE(exists(rb));
  const std::vector<std::string> removed = a->finish(job_);
  EXPECT_NE(std::find(removed.begin(), removed.end(), rb), removed.end());
  EXPECT_FALSE(exists(rb));
}

// `idle` (lockstep snapshots): an agent is idle until told of a commit, busy while its push
// to a frozen peer (SIGSTOP) waits, and idle again once the peer thaws and the push lands.
TEST_F(SnapshotReplica, AnAgentIsNotIdleWhileItsPushToAFrozenPeerWaits) {
  Ring ring = ring_of_two();
  auto &a = ring.a, &b = ring.b;
  const pid_t peer = ring.peer;
  const std::vector<std::string> da = a->segment(Reservation{job_, 0, 1, {{0, 2, kBytes}}, 0});
  EXPECT_TRUE(a->idle());
  write_snapshot(da[0], job_, 0, 1, 0, 2, 5);
  a->committed(da[0], 5);
  const std::string ra = segment_name(job_, SegmentKind::kReplica, 0, 1, 0);  // on node 1
  ASSERT_TRUE(poll([&] { return a->idle(); })) << read(log(0));
  ASSERT_EQ(listed_step(*b, ra), 5) << read(log(1));  // idle: the push has landed

  ASSERT_EQ(::kill(peer, SIGSTOP), 0);
  write_snapshot(da[0], job_, 0, 1, 0, 2, 6);
  a->committed(da[0], 6);
  EXPECT_FALSE(a->idle()) << read(log(0));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(a->idle()) << "the push cannot have landed on a stopped peer\n" << read(log(0));
  ASSERT_EQ(::kill(peer, SIGCONT), 0);
  ASSERT_TRUE(poll([&] { return a->idle(); })) << read(log(0));
  EXPECT_EQ(listed_step(*b, ra), 6) << read(log(0)) << read(log(1));
}

// An agent holding another token: the listener refuses it in the handshake (logged), the
// pusher says so, and no replica of it exists anywhere. A stranger sending garbage is cut
// off too; the listener serves on.
TEST_F(SnapshotReplica, AWrongTokenIsRefusedAndNothingOfItIsWritten) {
  start_agent(1, "the-job-token");
  start_agent(2, "not-the-job-token");
  auto b = client(1), c = client(2);
  const std::string eb = b->endpoint(), ec = c->endpoint();
  c->peers(job_, 1, 0, {ec, eb});  // c thinks it is node 0 of a ring with b
  b->peers(job_, 1, 1, {ec, eb});
  const std::vector<std::string> dc = c->segment(Reservation{job_, 2, 1, {{0, 2, kBytes}}, 0});
  write_snapshot(dc[0], job_, 2, 1, 0, 2, 3);
  c->committed(dc[0], 3);
  const std::string refused = "refused a peer connection from 127.0.0.1:";
  ASSERT_TRUE(poll([&] { return read(log(1)).find(refused) != std::string::npos; }))
      << read(log(1)) << read(log(2));
  EXPECT_NE(read(log(1)).find("wrong job token (its proof does not match)"), std::string::npos)
      << read(log(1));
  ASSERT_TRUE(poll([&] {
    return read(log(2)).find("replica push to " + eb + " failed") != std::string::npos;
  })) << read(log(2));
  EXPECT_NE(read(log(2)).find("refused the connection: wrong job token"), std::string::npos)
      << read(log(2));
  EXPECT_FALSE(exists(segment_name(job_, SegmentKind::kReplica, 2, 1, 0)));
  for (const SegmentInfo& s : b->list()) EXPECT_NE(s.name.find("-d"), std::string::npos) << s.name;

  // A stranger: garbage instead of a handshake.
  const auto colon = eb.rfind(':');
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(uint16_t(std::stoi(eb.substr(colon + 1))));
  ::inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to), 0);
  const std::string junk = std::string("\x10\x00\x00\x00", 4) + "{\"job\":\"nope\"}  ";
  ASSERT_EQ(::write(fd, junk.data(), junk.size()), ssize_t(junk.size()));
  char buf[4096];
  while (::read(fd, buf, sizeof buf) > 0) {
  }  // until the listener closes it
  ::close(fd);
  EXPECT_TRUE(poll([&] {
    const std::string t = read(log(1));
    return t.find("a malformed handshake") != std::string::npos ||
           t.find("it belongs to job nope") != std::string::npos;
  })) << read(log(1));
  EXPECT_EQ(b->endpoint(), eb);  // still serving
  EXPECT_EQ(b->list().size(), 0u);
}

// Push throughput on loopback: a 256 MiB snapshot committed six times; each time from the
// `committed` message until the next node's agent lists it (the push, its checksums on
// arrival, the commit). The first two pushes also fault in the replica's two slots (mapped
// pages are touched first there); the rest are the steady state. Printed; the test checks
// only that every commit arrives whole.
TEST_F(SnapshotReplica, PushThroughputOnLoopback) {
  const int64_t big = int64_t(256) << 20;
  Ring ring = ring_of_two();
  auto &a = ring.a, &b = ring.b;
  const std::vector<std::string> da = a->segment(Reservation{job_, 0, 1, {{0, 2, big}}, 0});
  const std::string ra = segment_name(job_, SegmentKind::kReplica, 0, 1, 0);
  double steady_s = 0;
  for (int64_t step = 1; step <= 6; ++step) {
    write_snapshot(da[0], job_, 0, 1, 0, 2, step, big);
    const auto t0 = Clock::now();
    a->committed(da[0], step);
    ASSERT_TRUE(poll([&] { return listed_step(*b, ra) == step; }, 60))
        << read(log(0)) << read(log(1));
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (step > 2) steady_s += s;
    std::printf("[ measured ] step %lld: 256 MiB replicated in %.1f ms (%.0f MB/s)%s\n",
                (long long)step, s * 1e3, double(big) / 1e6 / s,
                step <= 2 ? ", the replica's slot touched first" : "");
    EXPECT_TRUE(same_bytes(da[0], ra));
  }
  std::printf(
      "[ measured ] replica push on loopback: %.0f MB/s (4 x 256 MiB, commit to listed, "
      "checksums verified on arrival)\n",
      4 * double(big) / 1e6 / steady_s);
}

}  // namespace
}  // namespace weft::checkpoint
