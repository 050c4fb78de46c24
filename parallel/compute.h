// One kCompute instruction on local tensors: the plan's operands translated into
// core::run_compute's PartContext (local boxes, partial-sum indices, accumulate flags).
#pragma once

#include <cstdint>
#include <vector>

#include "core/graph/op_table.h"
#include "parallel/tensor_table.h"
#include "planner/plan.h"

namespace weft::parallel {

// Runs `instr` (kind kCompute) reading and writing `t`. `expert_rows`: for moe.experts, the
// rows received per (source member, local expert); empty otherwise. Throws what the kernel
// throws (NotSupported for a part the CPU cannot run, InternalError for misfit operands).
void run_compute_instr(const planner::Instr& instr, TensorTable& t, const core::StepScalars& s,
                       memory::Allocator* workspace, const std::vector<int64_t>& expert_rows);

}  // namespace weft::parallel
