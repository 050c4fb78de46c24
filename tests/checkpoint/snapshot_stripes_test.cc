// Placement of erasure-coded snapshot fragments (checkpoint/snapshot_stripes.h): every
// stripe's fragments on distinct nodes of one group, every chunk of every rank in exactly
// one stripe, parity spread evenly, and any m lost nodes of a group leave each stripe at
// least K fragments.
#include "checkpoint/snapshot_stripes.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "base/error.h"
#include "checkpoint/snapshot_segment.h"

namespace weft::checkpoint {
namespace {

struct Case {
  int nodes, k, m;
};
// With reduced epochs (fewer than k + m nodes, a loss left them): {2, 2, 1}, {3, 3, 1}, ...
const Case kCases[] = {{3, 2, 1},  {4, 2, 1}, {5, 2, 1}, {6, 2, 1}, {7, 3, 2}, {8, 4, 2},
                       {11, 2, 2}, {2, 2, 1}, {3, 3, 1}, {3, 2, 2}, {5, 4, 2}};

TEST(SnapshotStripes, GroupsAreKPlusMNodesWithTheRemainderInTheLast) {
  StripeLayout a(7, 2, 1);
  ASSERT_EQ(a.groups(), 2);
  EXPECT_EQ(a.group_size(0), 3);
  EXPECT_EQ(a.group_size(1), 4);
  EXPECT_EQ(a.data_fragments(1), 3);
  EXPECT_EQ(a.group_of(6), 1);
  EXPECT_EQ(a.position(6), 3);
  EXPECT_EQ(a.node_at(1, 0), 3);
  StripeLayout b(3, 2, 1);
  EXPECT_EQ(b.groups(), 1);
  // Node 1's local rank 0: chunk 0 in stripe r=1 (data at 1, 2; parity at 0), chunk 1 in
  // stripe r=0 (data at 0, 1; parity at 2).
  EXPECT_EQ(b.stripe_of_chunk(1, 0, 0), (StripeId{0, 0, 1}));
  EXPECT_EQ(b.stripe_of_chunk(1, 0, 1), (StripeId{0, 0, 0}));
  EXPECT_EQ(b.fragment_node({0, 0, 1}, 2), 0);
  EXPECT_EQ(b.fragment_node({0, 0, 0}, 2), 2);
}

TEST(SnapshotStripes, EveryChunkIsInOneStripeAndNoNodeHoldsTwoFragmentsOfOne) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(testing::Message() << c.nodes << " nodes, k=" << c.k << ", m=" << c.m);
    StripeLayout s(c.nodes, c.k, c.m);
    const int locals = 2;
    // stripe -> fragment -> node, from the data side and from the parity side.
    std::map<std::tuple<int, int, int>, std::map<int, int>> frag;
    for (int n = 0; n < c.nodes; ++n) {
      const int K = s.data_fragments(s.group_of(n));
      for (int l = 0; l < locals; ++l)
        for (int t = 0; t < K; ++t) {
          const StripeId id = s.stripe_of_chunk(n, l, t);
          EXPECT_EQ(s.fragment_node(id, t), n);
          EXPECT_TRUE((frag[{id.group, id.local, id.rotation}].emplace(t, n).second));
        }
      const auto held = s.parity_held(n, locals);
      EXPECT_EQ(held.size(), size_t(locals * c.m)) << "parity spread evenly";
      for (const auto& [id, f] : held) {
        EXPECT_GE(f, K);
        EXPECT_EQ(s.fragment_node(id, f), n);
        EXPECT_TRUE((frag[{id.group, id.local, id.rotation}].emplace(f, n).second));
      }
    }
    for (const auto& [id, fragments] : frag) {
      const int G = s.group_size(std::get<0>(id));
      ASSERT_EQ(int(fragments.size()), G) << "every fragment placed once";
      std::set<int> nodes;
      for (const auto& [f, n] : fragments) {
        EXPECT_EQ(s.group_of(n), std::get<0>(id));
        nodes.insert(n);
      }
      EXPECT_EQ(int(nodes.size()), G) << "fragments of one stripe on distinct nodes";
      const StripeId sid{std::get<0>(id), std::get<1>(id), std::get<2>(id)};
      EXPECT_EQ(s.stripe_numbered(sid.group, s.number(sid)), sid);
    }
  }
}

// A loss that leaves fewer than k + m nodes (but m + 1 or more) leaves one group of them all
// with K = nodes - m: two nodes with m = 1 hold each other's data as parity (K = 1).
TEST(SnapshotStripes, FewerNodesThanKPlusMAreOneGroupWithFewerDataFragments) {
  const StripeLayout two(2, 2, 1);
  EXPECT_TRUE(two.reduced());
  ASSERT_EQ(two.groups(), 1);
  EXPECT_EQ(two.group_size(0), 2);
  EXPECT_EQ(two.data_fragments(0), 1);
  for (int node = 0; node < 2; ++node)
    for (int local = 0; local < 3; ++local) {
      // The whole rank is chunk 0, in the stripe of its node's rotation; its parity is on the
      // other node.
      const StripeId s = two.stripe_of_chunk(node, local, 0);
      EXPECT_EQ(s, (StripeId{0, local, node}));
      EXPECT_EQ(two.fragment_node(s, 0), node);
      EXPECT_EQ(two.fragment_node(s, 1), 1 - node);
    }
  const StripeLayout three(3, 3, 1);
  EXPECT_TRUE(three.reduced());
  ASSERT_EQ(three.groups(), 1);
  EXPECT_EQ(three.group_size(0), 3);
  EXPECT_EQ(three.data_fragments(0), 2);
  // Node 1's local rank 0: chunk 0 in stripe r=1 (data at 1, 2; parity at 0), chunk 1 in
  // stripe r=0 (data at 0, 1; parity at 2): the k=2, m=1 layout of three nodes.
  EXPECT_EQ(three.stripe_of_chunk(1, 0, 0), (StripeId{0, 0, 1}));
  EXPECT_EQ(three.stripe_of_chunk(1, 0, 1), (StripeId{0, 0, 0}));
  EXPECT_EQ(three.fragment_node({0, 0, 1}, 2), 0);
  EXPECT_EQ(three.fragment_node({0, 0, 0}, 2), 2);
  EXPECT_FALSE(StripeLayout(3, 2, 1).reduced());
  EXPECT_FALSE(StripeLayout(7, 2, 1).reduced());
}

TEST(SnapshotStripes, FewerThanMPlusOneNodesAreRefusedNamingSnapshotEc) {
  EXPECT_FALSE(StripeLayout::codes(1, 1));
  EXPECT_TRUE(StripeLayout::codes(2, 1));
  EXPECT_FALSE(StripeLayout::codes(2, 2));
  try {
    StripeLayout(1, 2, 1);
    FAIL() << "one node cannot hold a fragment and its parity on distinct nodes";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.field(), "snapshot.ec");
    EXPECT_NE(std::string(e.what()).find("at least m + 1 = 2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(StripeLayout(2, 2, 2), ConfigError);
  EXPECT_THROW(StripeLayout(4, 0, 1), ConfigError);
}

TEST(SnapshotStripes, ChunksAreWholeBlocks) {
  const int64_t b = kSnapshotBlockBytes;
  EXPECT_EQ(chunk_bytes(1, 2), b);
  EXPECT_EQ(chunk_bytes(2 * b, 2), b);
  EXPECT_EQ(chunk_bytes(2 * b + 1, 2), 2 * b);
  EXPECT_EQ(chunk_bytes(5 * b, 3), 2 * b);
  EXPECT_EQ(chunk_bytes(0, 3), b);
}

// The memory check of the rebuild targets made ahead counts a node's own group, and before
// the ring is known a bound no group exceeds: the last group of a ring takes the remainder
// (up to 2(k + m) - 1 nodes), which counting k + m missed; a reduced ring (fewer than k + m
// nodes) has the fewest data fragments, so the longest chunks.
TEST(SnapshotStripes, TheGroupBoundIsTheNodesOwnGroupAndBeforeTheRingNoGroupExceedsIt) {
  for (const auto& [k, m] : {std::pair{2, 1}, std::pair{3, 2}, std::pair{4, 1}}) {
    const GroupBound unknown = group_bound(0, 0, k, m);
    EXPECT_EQ(group_bound(m + 1, 0, k, m).data_fragments, 1);
    int largest = 0;
    for (int n = m + 1; n <= 4 * (k + m); ++n) {
      const StripeLayout layout(n, k, m);
      for (int node = 0; node < n; ++node) {
        const int g = layout.group_of(node);
        const GroupBound own = group_bound(n, node, k, m);
        EXPECT_EQ(own.size, layout.group_size(g)) << "k=" << k << " m=" << m << " n=" << n;
        EXPECT_EQ(own.data_fragments, layout.data_fragments(g));
        EXPECT_LE(own.size, unknown.size) << "k=" << k << " m=" << m << " n=" << n;
        // More data fragments, shorter chunks: the bound's chunks are the longest.
        EXPECT_GE(chunk_bytes(int64_t(1) << 30, unknown.data_fragments),
                  chunk_bytes(int64_t(1) << 30, own.data_fragments));
        largest = std::max(largest, own.size);
      }
    }
    EXPECT_EQ(largest, unknown.size) << "k=" << k << " m=" << m << ": the bound is reached";
    EXPECT_GT(unknown.size, k + m);
  }
}

}  // namespace
}  // namespace weft::checkpoint
