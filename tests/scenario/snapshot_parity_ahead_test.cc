// snapshot.redundancy: ec, the rebuild targets made ahead (launch/snapshot_parity.h,
// prepare): once a node's own segments of an epoch are reserved, its agent makes the
// segments it would rebuild its group's previous node into, their pages allocated, so that
// a rebuild after that node's loss writes into them instead of allocating its pages then
// (477 of a 721 ms rebuild of 403 MiB in the node-loss bench). Real `weft snapshot-agent`
// processes on loopback, EC(2,1) over three nodes of two ranks each; checked through the
// agents' logs and lists and the segments' bytes, never by time.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <map>
#include <memory>
#include <regex>

#include "checkpoint/snapshot_protocol.h"
#include "checkpoint/snapshot_segment.h"
#include "tests/scenario/snapshot_fixture.h"

namespace weft::checkpoint {
namespace {

constexpr int kNodes = 3, kLocals = 2, kWorld = kNodes * kLocals;

class SnapshotParityAhead : public SnapshotPeersTest {
 protected:
  // Three ec agents told the ring of epoch 1; node n reserves ranks ranks_[n], whose sizes
  // are bytes_[rank]; a snapshot of `step` committed on each and its parity everywhere.
  void start_three(const std::vector<std::vector<int>>& ranks, const std::map<int, int64_t>& bytes,
                   int64_t step) {
    ranks_ = ranks;
    bytes_ = bytes;
    for (int n = 0; n < kNodes; ++n) {
      start_agent(n, "ahead-test-token", {"--redundancy", "ec", "--ec-k", "2", "--ec-m", "1"});
      clients_.push_back(client(n));
      endpoints_.push_back(clients_.back()->endpoint());
    }
    for (int n = 0; n < kNodes; ++n) {
      clients_[size_t(n)]->peers(job_, 1, n, endpoints_);
      Reservation r{job_, n, 1, {}, 0};
      for (int rank : ranks_[size_t(n)]) r.ranks.push_back({rank, kWorld, bytes_.at(rank)});
      data_.push_back(clients_[size_t(n)]->segment(r));
    }
    for (int n = 0; n < kNodes; ++n)
      for (int l = 0; l < kLocals; ++l) {
        const int rank = ranks_[size_t(n)][size_t(l)];
        write_snapshot(data_[size_t(n)][size_t(l)], job_, n, 1, rank, kWorld, step, bytes_.at(rank));
        clients_[size_t(n)]->committed(data_[size_t(n)][size_t(l)], step);
      }
    // Node n holds parity of stripes l * 3 + (n + 1) % 3 (snapshot_parity_test.cc).
    ASSERT_TRUE(poll([&] {
      for (int n = 0; n < kNodes; ++n)
        for (int l = 0; l < kLocals; ++l) {
          try {
            SnapshotSegment p = SnapshotSegment::open(
                segment_name(job_, SegmentKind::kParity, n, 1, l * 3 + (n + 1) % 3), false);
            if (!p.latest() || p.latest()->meta.step != step) return false;
          } catch (const std::exception&) {
            return false;
          }
        }
      return true;
    })) << logs(kNodes);
  }
  // Node 1 lost; epoch 2 of nodes 0 and 2. Node 2's list of epoch 2 (after its rebuild).
  std::vector<SegmentInfo> lose_node_one() {
    lose(1);
    clients_[0]->peers(job_, 2, 0, {endpoints_[0], endpoints_[2]});
    clients_[2]->peers(job_, 2, 1, {endpoints_[0], endpoints_[2]});
    clients_[0]->list(2);
    return clients_[2]->list(2);
  }
  // The rebuilt segments of `list` by rank; each must hold write_snapshot's bytes of `step`.
  std::map<int, std::string> rebuilt(const std::vector<SegmentInfo>& list, int64_t step) {
    std::map<int, std::string> out;
    for (const SegmentInfo& s : list) {
      const auto p = parse_segment_name(s.name);
      if (!p || p->kind != SegmentKind::kRebuilt) continue;
      EXPECT_TRUE(s.committed) << s.name << " is listed uncommitted";
      if (!s.committed) continue;
      EXPECT_EQ(s.committed->rank, p->rank) << s.name;
      EXPECT_EQ(s.committed->payload_bytes, bytes_.at(p->rank)) << s.name;
      EXPECT_TRUE(holds_step(s.name, step)) << s.name << " is not node 1's rank's bytes";
      out[p->rank] = s.name;
    }
    return out;
  }
  std::string rebuilt_name(int rank) const {
    return segment_name(job_, SegmentKind::kRebuilt, 1, 1, rank);
  }

  std::vector<std::vector<int>> ranks_;
  std::map<int, int64_t> bytes_;
  std::vector<std::unique_ptr<SnapshotAgentClient>> clients_;
  std::vector<std::string> endpoints_;
  std::vector<std::vector<std::string>> data_;
};

// The usual placement (node n has ranks 2n, 2n + 1): node 2 makes node 1's two segments
// ahead under their final names, lists neither before a loss, and the rebuild writes into
// them: no page of the rebuilt slot is allocated after the loss was known.
TEST_F(SnapshotParityAhead, TheNextNodeMakesItsPredecessorsTargetsAheadAndTheRebuildWritesThem) {
  std::map<int, int64_t> bytes;
  for (int r = 0; r < kWorld; ++r) bytes[r] = kBytes + r * 12345;
  ASSERT_NO_FATAL_FAILURE(start_three({{0, 1}, {2, 3}, {4, 5}}, bytes, 6));
  // Each node makes ahead for its group's previous one: 2 for 1, 0 for 2, 1 for 0.
  wait_for(log(2), "made ahead the segment\\(s\\) a rebuild of node 1 would write if it were lost: 2 of");
  wait_for(log(0), "made ahead the segment\\(s\\) a rebuild of node 2 would write");
  wait_for(log(1), "made ahead the segment\\(s\\) a rebuild of node 0 would write");
  EXPECT_TRUE(exists(rebuilt_name(2)) && exists(rebuilt_name(3))) << logs(kNodes);
  for (const SegmentInfo& s : clients_[2]->list(1))
    EXPECT_NE(parse_segment_name(s.name)->kind, SegmentKind::kRebuilt)
        << s.name << ": made ahead, it holds no snapshot and is not listed";
  const std::map<int, std::string> got = rebuilt(lose_node_one(), 6);
  EXPECT_EQ(got, (std::map<int, std::string>{{2, rebuilt_name(2)}, {3, rebuilt_name(3)}}))
      << logs(kNodes);
  for (int rank : {2, 3})
    wait_for(log(2), "rebuilt node 1's rank " + std::to_string(rank) +
                         " \\(epoch 1, step 6\\) from parity into [^ ]+: [0-9.]+ MiB in [0-9.]+ "
                         "ms \\(asking the holders [0-9.]+ ms, fetch and decode [0-9.]+ ms: "
                         "segment [0-9.e-]+ made ahead, allocating its pages 0,");
  // The fragments come through the agents' own mappings (their pages mapped in by the push
  // or the parity's write), never a mapping made per fetch: node 2 reads its own here, and
  // decodes from them in place (a piece past a payload's end is copied, for its padding)...
  for (int rank : {2, 3}) {
    const std::string line = wait_for(
        log(2), "rebuilt node 1's rank " + std::to_string(rank) +
                    " .*; pieces read here [0-9]+, [0-9]+ of them through this agent's own "
                    "mapping, [0-9]+ decoded from in place\\)");
    std::smatch m;
    ASSERT_TRUE(std::regex_search(line, m,
                                  std::regex("pieces read here ([0-9]+), ([0-9]+) of them through "
                                             "this agent's own mapping, ([0-9]+) decoded")))
        << line;
    const int reads = std::stoi(m[1]), mapped = std::stoi(m[2]), in_place = std::stoi(m[3]);
    EXPECT_GT(reads, 0) << line;
    EXPECT_EQ(mapped, reads) << line;
    EXPECT_GT(in_place, 0) << line;
    EXPECT_LE(in_place, reads) << line;
  }
  // ...and node 0 serves its data and parity to it.
  wait_for(log(0), "serving fetches of [^ ]+ through this agent's own mapping of it");
  EXPECT_EQ(read(log(0)).find("through a mapping made for each fetch"), std::string::npos)
      << read(log(0));
}

// Node 1's ranks are not the ones node 2 guessed (2 and 3): the segments made ahead are
// renamed to ranks 0 and 1's names, and nothing is left under the guessed ones.
TEST_F(SnapshotParityAhead, ATargetMadeUnderAnotherRanksNameIsRenamed) {
  std::map<int, int64_t> bytes;
  for (int r = 0; r < kWorld; ++r) bytes[r] = kBytes + r * 12345;
  ASSERT_NO_FATAL_FAILURE(start_three({{4, 5}, {0, 1}, {2, 3}}, bytes, 7));
  wait_for(log(2), "made ahead the segment\\(s\\) a rebuild of node 1 would write");
  const std::map<int, std::string> got = rebuilt(lose_node_one(), 7);
  EXPECT_EQ(got, (std::map<int, std::string>{{0, rebuilt_name(0)}, {1, rebuilt_name(1)}}))
      << logs(kNodes);
  EXPECT_FALSE(exists(rebuilt_name(2))) << "the guessed name was left behind";
  EXPECT_FALSE(exists(rebuilt_name(3))) << "the guessed name was left behind";
  EXPECT_NE(read(log(2)).find(" made ahead, allocating"), std::string::npos) << read(log(2));
}

// Node 1's ranks are larger than node 2's own, which sized what it made ahead: the rebuild
// allocates a segment of the right size as before, and the bytes are node 1's.
TEST_F(SnapshotParityAhead, ATargetTooSmallIsNotUsedAndTheRebuildAllocatesItsOwn) {
  const std::map<int, int64_t> bytes = {{0, kBytes}, {1, kBytes},         {2, 3 * kBytes},
                                        {3, 3 * kBytes}, {4, kBytes + 77}, {5, kBytes}};
  ASSERT_NO_FATAL_FAILURE(start_three({{0, 1}, {2, 3}, {4, 5}}, bytes, 5));
  wait_for(log(2), "made ahead the segment\\(s\\) a rebuild of node 1 would write");
  const std::map<int, std::string> got = rebuilt(lose_node_one(), 5);
  EXPECT_EQ(got, (std::map<int, std::string>{{2, rebuilt_name(2)}, {3, rebuilt_name(3)}}))
      << logs(kNodes);
  EXPECT_EQ(read(log(2)).find(" made ahead, allocating"), std::string::npos) << read(log(2));
}

}  // namespace
}  // namespace weft::checkpoint
