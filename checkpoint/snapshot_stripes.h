// snapshot.redundancy: ec (issue 15), where each piece of a snapshot and its parity live: a
// pure function of the epoch's node count and (k, m), computed alike by every agent.
//
// The nodes of an epoch form groups of k + m consecutive nodes (the last group takes the
// remainder, so it may hold up to 2(k + m) - 1 nodes and its stripes K = size - m data
// fragments: more data per parity, the same m losses survived). Inside a group of G nodes,
// every node's local rank l (its l-th rank in rank order) is cut into K chunks of equal
// length, and chunk t of the node at position p belongs to stripe (l, r = (p - t) mod G),
// RAID-5 style: stripe (l, r) has as data fragments t = 0..K-1 the chunks of the nodes at
// positions (r + t) mod G, and its m parity fragments are held by the nodes at positions
// (r + K + j) mod G, j = 0..m-1. Each node is thus a member of every stripe of its group
// exactly once, as data or as parity, so no node holds both data and parity of one stripe,
// any m nodes of a group may be lost, and each node holds m/K of its own data in parity
// (replicas: all of it).
//
// An epoch of fewer than k + m nodes (a loss left them; at least m + 1) is one group of all
// its nodes with K = nodes - m: the same stripes with fewer data fragments, so any m of its
// nodes may still be lost, at the price of more parity per node (m/K of its data; for two
// nodes and m = 1, K = 1: each node holds its peer's data as parity, a replica by another
// name). Fewer than m + 1 nodes leave nothing to code. The job-start refusal (ec needs k + m
// nodes at start: launch/snapshot_agent_launch.cc, launch/elastic_worker.cc) is not this
// class's: a job asks for k + m, and a reduced epoch is what a loss leaves of it.
//
// A chunk's length is the rank's payload over K, rounded up to whole checksum blocks
// (kSnapshotBlockBytes), so a chunk is checked by the rank's own block crcs; a
// stripe's fragments are as long as its longest chunk, the shorter ones padded with zeros.
#pragma once

#include <cstdint>
#include <vector>

namespace weft::checkpoint {

struct StripeId {
  int group = 0, local = 0, rotation = 0;
  bool operator==(const StripeId&) const = default;
};

class StripeLayout {
 public:
  // ConfigError naming snapshot.ec unless k >= 1, m >= 1 and nodes >= m + 1 (codes()).
  // nodes < k + m: one group of all of them, K = nodes - m (reduced()).
  StripeLayout(int nodes, int k, int m);
  // Whether an epoch of `nodes` nodes can be erasure-coded with m parity fragments at all.
  static bool codes(int nodes, int m) { return nodes >= m + 1; }

  int nodes() const { return nodes_; }
  int k() const { return k_; }
  int m() const { return m_; }
  // Fewer nodes than k + m: one group with fewer data fragments than k.
  bool reduced() const { return nodes_ < k_ + m_; }
  int groups() const { return int(first_.size()); }
  int group_of(int node) const;
  int position(int node) const;       // in its group
  int group_size(int group) const;    // G
  int data_fragments(int group) const { return group_size(group) - m_; }  // K
  int node_at(int group, int position) const;

  // The node holding fragment `f` of stripe `s` (f < K: data chunk f; K + j: parity j).
  int fragment_node(const StripeId& s, int f) const;
  // The stripe that chunk `t` (< K) of `node`'s local rank `local` belongs to; the chunk is
  // that stripe's data fragment t.
  StripeId stripe_of_chunk(int node, int local, int t) const;
  // The stripes whose parity fragment this node holds, with the fragment's index (K + j),
  // for local ranks 0..locals-1.
  std::vector<std::pair<StripeId, int>> parity_held(int node, int locals) const;
  // A stripe's number inside its group (its parity segment's name): local * G + rotation.
  int number(const StripeId& s) const { return s.local * group_size(s.group) + s.rotation; }
  StripeId stripe_numbered(int group, int number) const;

 private:
  int nodes_, k_, m_;
  std::vector<int> first_;  // first node of each group
};

// The length of each of the K chunks of a payload: bytes / K rounded up to whole blocks.
int64_t chunk_bytes(int64_t payload_bytes, int data_fragments);

// The group size G and data fragments K that a node's share of its group's work (a rebuild's
// decode takes a piece per node of the group, of a chunk's length at most) is counted with
// in a memory check: `node`'s own group in a ring of `nodes` (>= m + 1); before the ring is
// known (nodes == 0), the most any ring can ask: the last group takes the remainder, up to
// 2(k + m) - 1 nodes, and a reduced ring's K = 1 gives the longest chunks.
struct GroupBound {
  int size = 0, data_fragments = 0;
};
GroupBound group_bound(int nodes, int node, int k, int m);

}  // namespace weft::checkpoint
