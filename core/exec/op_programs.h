// What both single-device executors (core/exec/executor.h on the CPU, core/cuda/executor.h)
// derive from a training graph: the op programs they run and the memory bookkeeping of
// their values (which are transient, where each dies, how the allocators tag them).
#pragma once

#include <vector>

#include "core/graph/graph.h"
#include "memory/allocator.h"

namespace weft::core {

struct OpPrograms {
  std::vector<int> fwd;      // forward ops (evaluation)
  std::vector<int> fwd_bwd;  // forward then backward ops (one micro-batch of training)
  std::vector<int> opt;      // optimizer ops, once per step
  // Per program position: the transient values to free right after that op.
  std::vector<std::vector<int>> free_after_fwd, free_after_fwd_bwd;
};
OpPrograms op_programs(const Graph& g);

// Allocated when first written and freed after the last use in a micro-batch program: not
// persistent state, not an input, not a scalar the trainer reads afterwards.
bool is_transient(const Value& v);
memory::Tag memory_tag(const Value& v);
memory::Phase memory_phase(Phase p);

}  // namespace weft::core
