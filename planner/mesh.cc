// Rank <-> mesh coordinate maps.
#include "planner/mesh.h"

#include <algorithm>
#include <sstream>

#include "base/check.h"

namespace weft::planner {

const char* axis_name(Axis a) {
  switch (a) {
    case Axis::kTp: return "tp";
    case Axis::kEp: return "ep";
    case Axis::kDp: return "dp";
    case Axis::kPp: return "pp";
  }
  return "?";
}

int64_t Degrees::of(Axis a) const {
  switch (a) {
    case Axis::kTp: return tp;
    case Axis::kEp: return ep;
    case Axis::kDp: return dp;
    case Axis::kPp: return pp;
  }
  return 1;
}

int Coord::of(Axis a) const {
  switch (a) {
    case Axis::kTp: return tp;
    case Axis::kEp: return ep;
    case Axis::kDp: return dp;
    case Axis::kPp: return pp;
  }
  return 0;
}

Mesh::Mesh(Degrees d, std::vector<Axis> order) : deg_(d), order_(std::move(order)) {
  std::vector<Axis> sorted = order_;
  std::sort(sorted.begin(), sorted.end());
  WEFT_CHECK((sorted == std::vector<Axis>{Axis::kTp, Axis::kEp, Axis::kDp, Axis::kPp}),
             "mesh order must list tp, ep, dp and pp once each");
  WEFT_CHECK(d.dp >= 1 && d.tp >= 1 && d.pp >= 1 && d.ep >= 1, "mesh degrees must be >= 1");
}

std::string Mesh::order_string() const {
  std::string s;
  for (Axis a : order_) s += (s.empty() ? "" : "-") + std::string(axis_name(a));
  return s;
}

int Mesh::rank(const Coord& c) const {
  int r = 0, stride = 1;
  for (Axis a : order_) {
    r += c.of(a) * stride;
    stride *= int(deg_.of(a));
  }
  return r;
}

Coord Mesh::coord(int rank) const {
  WEFT_CHECK(rank >= 0 && rank < world(), "rank ", rank, " outside world ", world());
  Coord c;
  for (Axis a : order_) {
    int n = int(deg_.of(a)), v = rank % n;
    rank /= n;
    switch (a) {
      case Axis::kTp: c.tp = v; break;
      case Axis::kEp: c.ep = v; break;
      case Axis::kDp: c.dp = v; break;
      case Axis::kPp: c.pp = v; break;
    }
  }
  return c;
}

int Mesh::rank_of(int stage, int lane, int dp) const {
  return rank(Coord{lane_tp(lane), lane_ep(lane), dp, stage});
}

std::vector<Axis> parse_order(const std::string& text) {
  std::vector<Axis> out;
  std::stringstream ss(text);
  for (std::string tok; std::getline(ss, tok, '-');) {
    if (tok == "tp") out.push_back(Axis::kTp);
    else if (tok == "ep") out.push_back(Axis::kEp);
    else if (tok == "dp") out.push_back(Axis::kDp);
    else if (tok == "pp") out.push_back(Axis::kPp);
    else out.push_back(Axis(255));
  }
  std::vector<Axis> sorted = out;
  std::sort(sorted.begin(), sorted.end());
  if (sorted != std::vector<Axis>{Axis::kTp, Axis::kEp, Axis::kDp, Axis::kPp})
    throw ConfigError("parallel.order", "expected tp, ep, dp and pp each once joined by '-', got '" +
                                            text + "'; try tp-ep-dp-pp");
  return out;
}

}  // namespace weft::planner
