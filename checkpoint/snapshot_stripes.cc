// Stripe placement for erasure-coded snapshots (snapshot_stripes.h).
#include "checkpoint/snapshot_stripes.h"

#include <algorithm>

#include "base/check.h"
#include "base/error.h"
#include "checkpoint/snapshot_segment.h"

namespace weft::checkpoint {

namespace {
int mod(int a, int n) { return ((a % n) + n) % n; }
}  // namespace

StripeLayout::StripeLayout(int nodes, int k, int m) : nodes_(nodes), k_(k), m_(m) {
  if (k < 1 || m < 1)
    throw ConfigError("snapshot.ec", str("k=", k, ", m=", m, ": need k >= 1 and m >= 1"));
  if (!codes(nodes, m))
    throw ConfigError(
        "snapshot.ec",
        str("m=", m, " needs at least m + 1 = ", m + 1,
            " nodes (each stripe's fragments on distinct nodes); the epoch has ", nodes,
            ": lower m, run on more nodes, or use snapshot.redundancy: replica"));
  // Fewer than k + m nodes: one group of them all (reduced).
  const int full = std::max(1, nodes / (k + m));
  for (int g = 0; g < full; ++g) first_.push_back(g * (k + m));
}

int StripeLayout::group_of(int node) const {
  WEFT_CHECK(node >= 0 && node < nodes_, "node ", node, " outside [0, ", nodes_, ")");
  return std::min(node / (k_ + m_), groups() - 1);
}

int StripeLayout::position(int node) const { return node - first_[size_t(group_of(node))]; }

int StripeLayout::group_size(int group) const {
  WEFT_CHECK(group >= 0 && group < groups(), "group ", group, " outside [0, ", groups(), ")");
  return group + 1 < groups() ? k_ + m_ : nodes_ - first_[size_t(group)];
}

int StripeLayout::node_at(int group, int position) const {
  return first_[size_t(group)] + mod(position, group_size(group));
}

int StripeLayout::fragment_node(const StripeId& s, int f) const {
  const int G = group_size(s.group);
  WEFT_CHECK(f >= 0 && f < G, "fragment ", f, " outside [0, ", G, ")");
  // Data fragment t sits at position r + t and parity j at r + K + j: one formula.
  return node_at(s.group, s.rotation + f);
}

StripeId StripeLayout::stripe_of_chunk(int node, int local, int t) const {
  const int g = group_of(node), G = group_size(g);
  WEFT_CHECK(t >= 0 && t < G - m_, "chunk ", t, " outside [0, ", G - m_, ")");
  return {g, local, mod(position(node) - t, G)};
}

std::vector<std::pair<StripeId, int>> StripeLayout::parity_held(int node, int locals) const {
  const int g = group_of(node), G = group_size(g), K = G - m_;
  std::vector<std::pair<StripeId, int>> out;
  for (int l = 0; l < locals; ++l)
    for (int j = 0; j < m_; ++j) out.push_back({{g, l, mod(position(node) - K - j, G)}, K + j});
  return out;
}

StripeId StripeLayout::stripe_numbered(int group, int number) const {
  const int G = group_size(group);
  return {group, number / G, number % G};
}

int64_t chunk_bytes(int64_t payload_bytes, int data_fragments) {
  const int64_t b = kSnapshotBlockBytes;
  const int64_t blocks = (payload_bytes + b - 1) / b;
  return std::max<int64_t>(1, (blocks + data_fragments - 1) / data_fragments) * b;
}

GroupBound group_bound(int nodes, int node, int k, int m) {
  if (nodes == 0) return {2 * (k + m) - 1, 1};
  const StripeLayout l(nodes, k, m);
  const int g = l.group_of(node);
  return {l.group_size(g), l.data_fragments(g)};
}

}  // namespace weft::checkpoint
