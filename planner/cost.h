// The analytic cost model: an op's work from its local shapes (FLOPs and bytes moved, time
// = the larger of FLOPs / FLOP rate and bytes / memory bandwidth) and ring collectives
// under an alpha-beta model with separate intra- and inter-node links. The defaults are a
// rough H100 node; every number can be set (weft plan --flops, --bw-intra, ...).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/graph/graph.h"

namespace weft::planner {

enum class CollKind : uint8_t { kAllReduce, kAllGather, kReduceScatter, kAllToAll, kAllToAllV };
const char* coll_name(CollKind k);
constexpr int kCollKinds = 5;

struct CostModel {
  double flops = 400e12;        // sustained FLOP/s per device
  double mem_bw = 2.0e12;       // bytes/s for memory-bound ops and local copies
  double launch = 10e-6;        // fixed cost of any collective call (kernel launch, sync)
  double alpha_intra = 1e-6;    // seconds per message step inside a node
  double bw_intra = 150e9;      // bytes/s per rank inside a node
  double alpha_inter = 10e-6;   // across nodes
  double bw_inter = 25e9;
  int ranks_per_node = 8;
  int64_t device_memory = int64_t(80) << 30;  // default memory budget per rank

  // Ring algorithms: launch + all_reduce 2(n-1) steps moving 2(n-1)/n of `bytes`;
  // all_gather and reduce_scatter (n-1) steps moving (n-1)/n of the full buffer `bytes`;
  // all_to_all(v) likewise. n = 1 costs nothing. The launch term is why one collective
  // over a group beats the same data moved by several smaller ones.
  double collective(CollKind k, int n, int64_t bytes, bool cross_node) const;
  double p2p(int64_t bytes, bool cross_node) const;
  double local_copy(int64_t bytes) const { return double(bytes) / mem_bw; }
  double compute(double flop, double bytes) const;
  bool operator==(const CostModel& o) const = default;
};

// Bytes a rank sends for one collective of `bytes` over n ranks (what `weft plan` reports
// as communication volume).
int64_t wire_bytes(CollKind k, int n, int64_t bytes);

// Work of one (sub-)op run on local operands with these shapes. `part` names a stage of a
// custom rule ("ce.max", "moe.experts", ...; empty for the whole op).
struct OpWork {
  double flop = 0, bytes = 0;
};
OpWork op_work(const core::Op& op, const std::string& part, const std::vector<core::Shape>& ins,
               const std::vector<core::Shape>& outs, size_t elem_bytes);

}  // namespace weft::planner
