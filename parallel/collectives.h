// Collective instructions on a process group: grouped in/out pairs packed into one call
// (all_reduce, reduce_scatter and all_gather along each pair's dim, all_to_all between two
// splits), and the data-dependent all_to_all_v of expert-parallel MoE with its row counts.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "parallel/tensor_table.h"
#include "planner/plan.h"

namespace weft::parallel {

// Expert-parallel routing sizes of one MoE op and micro-batch: rows[s][e] = assignments that
// ep member s sends to global expert e (the rows of s's dispatch buffer, in expert order).
struct MoeCounts {
  int me = 0, members = 1;
  int64_t experts = 0;
  std::vector<std::vector<int64_t>> rows;
  int64_t local_experts() const { return experts / members; }
  int64_t send_rows(int to) const;    // dispatch: my rows for member `to`'s experts
  int64_t recv_rows(int from) const;  // dispatch: rows `from` sends to my experts
  // Rows received per (source member, local expert), source-major (PartContext::expert_rows).
  std::vector<int64_t> expert_rows() const;
};

// Per (forward MoE op, micro-batch): this rank's counts from moe.route until the dispatch
// exchanges them, then the whole matrix (reused by the return and by the backward).
struct MoeState {
  std::map<std::pair<int, int>, std::vector<int64_t>> own;
  std::map<std::pair<int, int>, MoeCounts> all;
};

// A collective in flight: its Work, and what remains once it completed (unpacking into the
// outputs). The instruction and the table must outlive it.
struct PendingCollective {
  comm::Work work;
  std::function<void()> finish;
  // Waits (rethrowing the communication error: PeerLostError, TimeoutError, CommError), then
  // writes the outputs (or adds into accumulating ones). Idempotent.
  void complete();
};

// Starts `in` (kind kCollective) on `c`, the communicator of its group. Until complete()
// returned, neither its inputs nor its outputs may be touched (a single in-place all_reduce
// works on the tensor itself); complete() writes the outputs. all_to_all(v) and the MoE count
// exchange have completed when this returns.
PendingCollective start_collective(const planner::Instr& in, TensorTable& t, comm::Communicator& c,
                                   MoeState& moe);

}  // namespace weft::parallel
