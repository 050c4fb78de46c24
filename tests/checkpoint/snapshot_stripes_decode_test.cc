// Erasure-coded snapshots end to end in one process: each node's ranks cut into chunks and
// coded through a StripeLayout as the agents do (launch/snapshot_parity.h: a holder adds each
// chunk to its parity row as it arrives, ErasureCode::encode_update), then every pattern of
// up to m lost nodes: each lost rank's bytes decode from its stripes' surviving fragments.
// Epochs of k + m nodes or more and reduced ones (fewer, a loss left them: K = nodes - m).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include "base/config.h"
#include "base/error.h"
#include "checkpoint/erasure_code.h"
#include "checkpoint/snapshot_segment.h"
#include "checkpoint/snapshot_stripes.h"

namespace weft::checkpoint {
namespace {

using Bytes = std::vector<uint8_t>;
using Key = std::tuple<int, int, int>;  // a stripe: group, local, rotation

struct Coded {
  std::map<std::pair<int, int>, Bytes> payload;  // (node, local) -> the rank's bytes
  std::map<Key, std::vector<Bytes>> fragments;   // stripe -> K data chunks, then m parity rows
};

// Every rank's payload (a few blocks, lengths differing by node and rank so that chunks and
// stripes have unequal fragments), cut and coded as the agents do.
Coded code_all(const StripeLayout& l, int locals, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Coded c;
  for (int n = 0; n < l.nodes(); ++n) {
    const int g = l.group_of(n), K = l.data_fragments(g), G = l.group_size(g);
    const ErasureCode ec(K, l.m());
    for (int local = 0; local < locals; ++local) {
      Bytes& p = c.payload[{n, local}];
      p.resize(size_t((n % 3 + 1) * kSnapshotBlockBytes / 2 + local * 4099 + 5));
      for (uint8_t& b : p) b = uint8_t(rng());
      const int64_t chunk = chunk_bytes(int64_t(p.size()), K);
      for (int t = 0; t < K; ++t) {
        const StripeId s = l.stripe_of_chunk(n, local, t);
        std::vector<Bytes>& f = c.fragments[{s.group, s.local, s.rotation}];
        f.resize(size_t(G));
        Bytes& data = f[size_t(t)];
        data.assign(size_t(chunk), 0);
        const int64_t real = std::clamp<int64_t>(int64_t(p.size()) - t * chunk, 0, chunk);
        std::copy(p.begin() + t * chunk, p.begin() + t * chunk + real, data.begin());
        for (int j = 0; j < l.m(); ++j) {
          Bytes& row = f[size_t(K + j)];
          if (row.size() < data.size()) row.resize(data.size(), 0);
          ec.encode_update(t, data.data(), {row.data()}, data.size(), j);
        }
      }
    }
  }
  return c;
}

// Every set of 1..m nodes of the layout (at most m of any group).
std::vector<std::set<int>> losses(int nodes, int m) {
  std::vector<std::set<int>> out;
  for (uint32_t mask = 1; mask < (1u << nodes); ++mask) {
    std::set<int> s;
    for (int i = 0; i < nodes; ++i)
      if (mask & (1u << i)) s.insert(i);
    if (int(s.size()) <= m) out.push_back(s);
  }
  return out;
}

TEST(SnapshotStripesDecode, EveryLossOfUpToMNodesDecodesTheirRanks) {
  struct Case {
    int nodes, k, m;
  };
  // Reduced (fewer than k + m nodes) first: 2 nodes of EC(2,1) (K = 1), 3 of EC(3,1) (K = 2),
  // 3 of EC(2,2) (K = 1, two parity rows); then full ones with a larger last group.
  for (const Case& c :
       {Case{2, 2, 1}, Case{3, 3, 1}, Case{3, 2, 2}, Case{3, 2, 1}, Case{4, 2, 1}, Case{5, 3, 2}}) {
    SCOPED_TRACE(testing::Message() << c.nodes << " nodes, k=" << c.k << ", m=" << c.m);
    const StripeLayout l(c.nodes, c.k, c.m);
    EXPECT_EQ(l.reduced(), c.nodes < c.k + c.m);
    if (!WEFT_HAVE_ISAL) {
      // A build without ISA-L codes no stripe: each group's coder is refused, naming the
      // package (an ec job stops), rather than leaving the snapshots silently uncoded.
      for (int g = 0; g < l.groups(); ++g)
        EXPECT_THROW(ErasureCode(l.data_fragments(g), c.m), NotSupported);
      continue;
    }
    const int locals = 2;
    const Coded coded = code_all(l, locals, uint64_t(c.nodes * 100 + c.k * 10 + c.m));
    for (const std::set<int>& lost : losses(c.nodes, c.m)) {
      for (int n : lost) {
        const int g = l.group_of(n), K = l.data_fragments(g), G = l.group_size(g);
        const ErasureCode ec(K, c.m);
        for (int local = 0; local < locals; ++local) {
          const Bytes& want = coded.payload.at({n, local});
          const int64_t chunk = chunk_bytes(int64_t(want.size()), K);
          Bytes got(want.size());
          for (int t = 0; t < K; ++t) {
            const StripeId s = l.stripe_of_chunk(n, local, t);
            std::vector<Bytes> f = coded.fragments.at({s.group, s.local, s.rotation});
            size_t len = 0;
            for (const Bytes& x : f) len = std::max(len, x.size());
            std::vector<int> erased;
            std::vector<uint8_t*> ptrs;
            for (int i = 0; i < G; ++i) {
              f[size_t(i)].resize(len, 0);  // a shorter chunk is padded with zeros
              if (lost.count(l.fragment_node(s, i))) {
                erased.push_back(i);
                std::fill(f[size_t(i)].begin(), f[size_t(i)].end(), uint8_t(0xA5));
              }
              ptrs.push_back(f[size_t(i)].data());
            }
            ASSERT_LE(int(erased.size()), c.m) << "a stripe has one fragment per node";
            ec.reconstruct(ptrs, erased, len);
            const int64_t real = std::clamp<int64_t>(int64_t(want.size()) - t * chunk, 0, chunk);
            std::copy(f[size_t(t)].begin(), f[size_t(t)].begin() + real, got.begin() + t * chunk);
          }
          ASSERT_TRUE(got == want) << "node " << n << " local " << local << " after losing "
                                   << testing::PrintToString(lost);
        }
      }
    }
  }
}

}  // namespace
}  // namespace weft::checkpoint
