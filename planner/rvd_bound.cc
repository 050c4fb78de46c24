// A*'s lower bound for the RVD search; the argument is in rvd_bound.h.
#include "planner/rvd_bound.h"

#include <algorithm>
#include <numeric>
#include <utility>

namespace weft::planner {
namespace {

// Strided slices with more chunks than this, or needs cut into more cells than kMaxCells, are
// taken as covered: the bound only gets weaker, never wrong.
constexpr int64_t kMaxChunks = 64;
constexpr int64_t kMaxCells = 4096;

// True unless some element of `need` lies in none of `held` (exact where the slices are small
// enough to cut into cells; true where they are not).
bool elements_covered(const std::vector<const Box*>& held, const Box& need) {
  const size_t dims = need.size();
  // Per dim: the cells between every chunk boundary of the need and the held boxes, inside
  // the need's chunks.
  std::vector<std::vector<std::pair<int64_t, int64_t>>> cells(dims);
  int64_t total = 1;
  for (size_t d = 0; d < dims; ++d) {
    std::vector<int64_t> cuts;
    auto add = [&](const DimSlice& s) {
      if (s.count > kMaxChunks) return false;
      for (int64_t i = 0; i < s.count; ++i) {
        cuts.push_back(s.start + i * s.stride);
        cuts.push_back(s.start + i * s.stride + s.size);
      }
      return true;
    };
    if (!add(need[d])) return true;
    for (const Box* b : held)
      if (!add((*b)[d])) return true;
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    for (size_t i = 0; i + 1 < cuts.size(); ++i) {
      const DimSlice cell{cuts[i], cuts[i + 1] - cuts[i], 1, 0};
      if (need[d].contains(cell)) cells[d].push_back({cell.start, cell.size});
    }
    total *= int64_t(cells[d].size());
    if (total > kMaxCells) return true;
  }
  if (total == 0) return true;
  // inside[h][d][c]: cell c of dim d lies in held box h.
  std::vector<std::vector<std::vector<char>>> inside(held.size(),
                                                     std::vector<std::vector<char>>(dims));
  for (size_t h = 0; h < held.size(); ++h)
    for (size_t d = 0; d < dims; ++d)
      for (const auto& [start, size] : cells[d])
        inside[h][d].push_back((*held[h])[d].contains(DimSlice{start, size, 1, 0}));
  std::vector<size_t> at(dims, 0);  // an odometer over the cells
  for (int64_t c = 0; c < total; ++c) {
    bool found = false;
    for (size_t h = 0; h < held.size() && !found; ++h) {
      found = true;
      for (size_t d = 0; d < dims && found; ++d) found = inside[h][d][at[d]];
    }
    if (!found) return false;
    for (size_t d = 0; d < dims && ++at[d] == cells[d].size(); ++d) at[d] = 0;
  }
  return true;
}

// True unless the addends of `need` (part j of q: the original addends [j/q, (j+1)/q)) are
// not all among the addends the pieces `held` hold, in any box. Addends only ever combine in
// consecutive runs (part / f), so a piece's addends are one such interval.
bool addends_covered(const std::vector<const Piece*>& held, const Piece& need) {
  int64_t l = need.parts;
  for (const Piece* p : held) {
    l = std::lcm(l, int64_t(p->parts));
    if (l > (int64_t(1) << 40)) return true;
  }
  std::vector<std::pair<int64_t, int64_t>> spans;
  for (const Piece* p : held)
    spans.push_back({p->part * (l / p->parts), (p->part + 1) * (l / p->parts)});
  std::sort(spans.begin(), spans.end());
  int64_t reached = need.part * (l / need.parts);
  const int64_t end = reached + l / need.parts;
  for (const auto& [lo, hi] : spans)
    if (lo <= reached) reached = std::max(reached, hi);
  return reached >= end;
}

}  // namespace

double rvd_lower_bound(const std::vector<Piece>& layout,
                       const std::vector<std::optional<Piece>>& need, const Box& whole,
                       const CostModel& cm, bool cross, int blocks, int world) {
  const int n = int(layout.size());
  bool lacking = false;
  for (int m = 0; m < n && !lacking; ++m)
    lacking = need[size_t(m)] && !piece_extractable(layout[size_t(m)], *need[size_t(m)]);
  if (!lacking) return 0;
  // The fixed part of any collective at this world: its launch (with the wait for a core where
  // the node is oversubscribed) and one message step.
  double bound = cm.launch + cm.launch_oversub * cm.oversub_weight(world) +
                 std::min(cm.alpha_intra, cm.alpha_inter);
  if (blocks < 2) return bound;
  // The fixed parts (no bytes) of the cheapest collectives over one member of every block.
  const double across = cm.collective(CollKind::kReduceScatter, blocks, 0, cross, world);
  const double sum_across =
      std::min(cm.collective(CollKind::kAllReduce, blocks, 0, cross, world), 2 * across);
  const int bs = n / blocks;
  const int64_t whole_numel = box_numel(whole);
  for (int b = 0; b < blocks; ++b) {
    std::vector<const Piece*> pieces;
    std::vector<const Box*> boxes;
    for (int p = 0; p < bs; ++p) {
      pieces.push_back(&layout[size_t(b * bs + p)]);
      boxes.push_back(&layout[size_t(b * bs + p)].box);
    }
    for (int p = 0; p < bs; ++p) {
      const int m = b * bs + p;
      if (!need[size_t(m)] || piece_extractable(layout[size_t(m)], *need[size_t(m)])) continue;
      const Piece& want = *need[size_t(m)];
      if (!addends_covered(pieces, want)) {
        // Only an all-reduce or a reduce-scatter over the blocks brings the missing addends;
        // after a reduce-scatter the block holds at most bs / blocks of the whole.
        if (want.numel() * blocks > int64_t(bs) * whole_numel) return std::max(bound, sum_across);
        bound = std::max(bound, across);
      } else if (bound < across && !elements_covered(boxes, want.box)) {
        bound = across;
      }
    }
  }
  return bound;
}

}  // namespace weft::planner
