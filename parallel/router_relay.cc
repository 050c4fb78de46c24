// The relay rule of the transfer plan (router.h, relay_shared): one holder sending the same
// region to several destinations of one host sends each a different part instead, and the
// destinations forward their parts to each other.
#include <algorithm>
#include <map>
#include <tuple>

#include "parallel/router.h"

namespace weft::parallel {

namespace {

int64_t numel(const std::vector<int64_t>& e) {
  int64_t n = 1;
  for (int64_t x : e) n *= x;
  return n;
}

// Rows of the region for each destination of `group` (summing to `rows`): parts p_i that
// make max_i(out_i + (k - 1) p_i) least, each destination's sends `out_i` before this relay.
std::vector<int64_t> part_rows(const std::vector<size_t>& group,
                               const std::vector<Transfer>& covered,
                               const std::vector<int64_t>& out, int64_t rows) {
  const size_t k = group.size();
  const double region = double(covered[group[0]].bytes), copies = double(k - 1);
  std::vector<double> base(k);
  for (size_t i = 0; i < k; ++i) base[i] = double(out[size_t(covered[group[i]].dst)]);
  std::vector<double> sorted = base;
  std::sort(sorted.begin(), sorted.end());
  // The level T that the m least loaded reach: sum over them of (T - base) = copies * region.
  double level = 0, sum = 0;
  for (size_t m = 1; m <= k; ++m) {
    sum += sorted[m - 1];
    level = (copies * region + sum) / double(m);
    if (m == k || level <= sorted[m]) break;
  }
  std::vector<int64_t> share(k, 0);
  double acc = 0;
  int64_t given = 0;
  for (size_t i = 0; i < k; ++i) {  // rounded by running sums: exactly `rows` in all
    acc += std::max(0.0, level - base[i]) / copies / region * double(rows);
    const int64_t upto = i + 1 == k ? rows : std::min(rows, int64_t(acc + 0.5));
    share[i] = std::max<int64_t>(0, upto - given);
    given += share[i];
  }
  return share;
}

}  // namespace

std::vector<Transfer> relay_shared(const Layout& b, std::vector<Transfer> covered,
                                   int64_t min_bytes) {
  // Remote transfers of one source piece (holder, its box, the region), by destination host.
  using Piece = std::tuple<int, int, StateId, std::vector<int64_t>, std::vector<int64_t>, int>;
  std::map<Piece, std::vector<size_t>> same;
  for (size_t i = 0; i < covered.size(); ++i) {
    const Transfer& t = covered[i];
    if (t.local() || t.relayed) continue;
    same[{t.src, t.src_box, t.state, t.start, t.extent, b.host(t.dst)}].push_back(i);
  }
  // Bytes each rank sends: the covered plan's, then as each relay changes them. A relay's
  // parts are sized so that its destinations' sends even out (a destination that already
  // serves others forwards less): the larger of a destination's sends and its forwards'
  // (k - 1) copies of its part is as small as the part sizes can make it (water-filling;
  // all of it to one destination makes a chain).
  std::vector<int64_t> sends(size_t(b.world()), 0);
  for (const Transfer& t : covered)
    if (!t.local()) sends[size_t(t.src)] += t.bytes;
  // Per covered transfer that a relay replaces: its part and the forwards of that part, which
  // take its place (a pair's messages keep the order of the plan's transfers).
  std::vector<std::vector<Transfer>> instead(covered.size());
  std::vector<char> replaced(covered.size(), 0);
  for (auto& [piece, group] : same) {
    const size_t k = group.size();
    if (k < 2) continue;
    const Transfer& first = covered[group[0]];
    if (first.bytes < min_bytes) continue;
    // Distinct destination ranks (a rank holding the region twice takes it direct).
    std::sort(group.begin(), group.end(),
              [&](size_t x, size_t y) { return covered[x].dst < covered[y].dst; });
    bool distinct = true;
    for (size_t i = 1; i < k; ++i)
      distinct = distinct && covered[group[i]].dst != covered[group[i - 1]].dst;
    if (!distinct) continue;
    // Parts of contiguous rows along the first dim that has one for each destination.
    const size_t dims = first.extent.size();
    size_t dim = dims;
    for (size_t d = 0; d < dims && dim == dims; ++d)
      if (first.extent[d] >= int64_t(k)) dim = d;
    if (dim == dims) continue;
    const int64_t elem = first.bytes / std::max<int64_t>(1, numel(first.extent));
    const int64_t rows = first.extent[dim];
    const std::vector<int64_t> share = part_rows(group, covered, sends, rows);
    sends[size_t(first.src)] -= int64_t(k - 1) * first.bytes;
    int64_t at_row = 0;
    for (size_t i = 0; i < k; ++i) {
      const Transfer& to = covered[group[i]];
      replaced[group[i]] = 1;
      if (share[i] == 0) continue;  // it gets every part forwarded
      Transfer part = to;  // holder -> destination i
      part.start[dim] += at_row;
      part.extent[dim] = share[i];
      part.bytes = numel(part.extent) * elem;
      at_row += share[i];
      sends[size_t(to.dst)] += int64_t(k - 1) * part.bytes;
      std::vector<Transfer>& at = instead[group[i]];
      at.push_back(part);
      for (size_t j = 0; j < k; ++j) {
        if (j == i) continue;
        const Transfer& other = covered[group[j]];
        Transfer fwd = part;  // destination i -> destination j, out of i's box
        fwd.src = to.dst, fwd.src_box = to.dst_box;
        fwd.dst = other.dst, fwd.dst_box = other.dst_box;
        fwd.relayed = true;
        at.push_back(fwd);
      }
    }
  }
  std::vector<Transfer> out;
  out.reserve(covered.size());
  for (size_t i = 0; i < covered.size(); ++i) {
    if (!replaced[i]) {
      out.push_back(std::move(covered[i]));
      continue;
    }
    for (Transfer& t : instead[i]) out.push_back(std::move(t));
  }
  return out;
}

}  // namespace weft::parallel
