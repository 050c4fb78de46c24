// snapshot.redundancy: ec between real `weft snapshot-agent` processes on loopback (issue 15):
// three agents as three nodes, EC(k=2, m=1), two ranks per node of different sizes. Each
// commit's chunks reach their stripes' parity holders; when a ring without node 1 arrives,
// node 2 (the first survivor after it) rebuilds node 1's ranks from the survivors' data and
// parity, byte for byte, and lists them to the new world; a corrupt block of a survivor's
// own snapshot is repaired from parity before a new world lists it; two lost nodes of three
// are more than m, and the rebuild says the stripe is lost. Every process is reaped and every
// segment unlinked however the test ends (SnapshotPeersTest).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <cstring>

#include "base/error.h"
#include "checkpoint/snapshot_protocol.h"
#include "checkpoint/snapshot_segment.h"
#include "tests/scenario/snapshot_fixture.h"

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
    ASSERT_TRUE(poll([&] {
      for (const std::string& p : parity_)
        if (newest_step(p) != steps.back()) return false;
      return true;
    })) << logs(kNodes);
  }
  // Node `n` dies whole: its agent is killed and its memory (segments) goes with it.
  void lose(int n) {
    ::kill(pids_[size_t(n)], SIGKILL);
    ::waitpid(pids_[size_t(n)], nullptr, 0);
    pids_[size_t(n)] = 0;  // reaped
    for (const std::string& name : snapshot_segments(job_)) {
      const auto p = parse_segment_name(name);
      if (p && p->owner_node == n && p->kind != SegmentKind::kRebuilt) SnapshotSegment::unlink(name);
    }
  }

  std::vector<std::unique_ptr<SnapshotAgentClient>> clients_;
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

TEST_F(SnapshotParity, ACorruptBlockIsRepairedFromParityBeforeANewWorldListsIt) {
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
  ASSERT_FALSE(holds_pattern(victim, 5, 1));
  clients_[0]->list(1);  // a world of epoch 1 forms again: checked and repaired first
  EXPECT_TRUE(holds_pattern(victim, 5, 1)) << logs(kNodes);
  EXPECT_NE(read(log(0)).find("2 corrupt block(s); repaired from parity (2 chunk(s))"),
            std::string::npos)
      << read(log(0));
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

// How fast parity is made and a lost rank rebuilt on loopback, printed (no threshold): one
// 96 MiB rank per node, EC(2,1). Coding: from the commits to every parity fragment
// committed; rebuild: from the new ring to the rebuilt rank listed (asking the holders,
// fetching K fragments per chunk, decoding, checking, committing).
TEST_F(SnapshotParity, ParityAndRebuildThroughputOnLoopback) {
  const int64_t big = int64_t(96) << 20;
  for (int n = 0; n < kNodes; ++n) {
    start_agent(n, "parity-test-token", {"--redundancy", "ec"});
    clients_.push_back(client(n));
    endpoints_.push_back(clients_.back()->endpoint());
  }
  std::vector<std::string> seg;
  for (int n = 0; n < kNodes; ++n) {
    clients_[size_t(n)]->peers(job_, 1, n, endpoints_);
    seg.push_back(clients_[size_t(n)]->segment(Reservation{job_, n, 1, {{n, kNodes, big}}, 0})[0]);
  }
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

}  // namespace
}  // namespace weft::checkpoint
