// The device mesh: four axes (tp, ep, dp, pp) laid over ranks in Megatron's convention,
// the first axis of parallel.order varying fastest. Within one pipeline stage the tp x ep
// ranks of one data-parallel replica are the stage's "lanes" (lane = tp + tp_degree * ep);
// a rank is (stage, lane, dp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace weft::planner {

enum class Axis : uint8_t { kTp, kEp, kDp, kPp };
const char* axis_name(Axis a);

struct Degrees {
  int64_t dp = 1, tp = 1, pp = 1, ep = 1;
  int64_t of(Axis a) const;
  int64_t world() const { return dp * tp * pp * ep; }
  bool operator==(const Degrees& o) const = default;
};

struct Coord {
  int tp = 0, ep = 0, dp = 0, pp = 0;
  int of(Axis a) const;
  bool operator==(const Coord& o) const = default;
};

class Mesh {
 public:
  Mesh() = default;
  // `order` lists the four axes, fastest first; throws InternalError otherwise.
  Mesh(Degrees d, std::vector<Axis> order);

  const Degrees& degrees() const { return deg_; }
  const std::vector<Axis>& order() const { return order_; }
  std::string order_string() const;  // "tp-ep-dp-pp"
  int world() const { return int(deg_.world()); }
  int lanes() const { return int(deg_.tp * deg_.ep); }

  int rank(const Coord& c) const;
  Coord coord(int rank) const;
  int lane(const Coord& c) const { return c.tp + int(deg_.tp) * c.ep; }
  int rank_of(int stage, int lane, int dp) const;
  int lane_tp(int lane) const { return lane % int(deg_.tp); }
  int lane_ep(int lane) const { return lane / int(deg_.tp); }
  bool operator==(const Mesh& o) const { return deg_ == o.deg_ && order_ == o.order_; }

 private:
  Degrees deg_;
  std::vector<Axis> order_{Axis::kTp, Axis::kEp, Axis::kDp, Axis::kPp};
};

// Parses "tp-ep-dp-pp" (each axis once); throws ConfigError on parallel.order otherwise.
std::vector<Axis> parse_order(const std::string& text);

}  // namespace weft::planner
