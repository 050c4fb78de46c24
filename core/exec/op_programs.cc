// Op programs and liveness shared by the CPU and CUDA executors.
#include "core/exec/op_programs.h"

namespace weft::core {
namespace {

// For each program position, the transient values whose last use is there.
std::vector<std::vector<int>> last_uses(const Graph& g, const std::vector<int>& program) {
  std::vector<int> last(g.values().size(), -1);
  for (size_t i = 0; i < program.size(); ++i) {
    const Op& op = g.op(program[i]);
    for (int v : op.inputs) last[size_t(v)] = int(i);
    for (int v : op.outputs) last[size_t(v)] = int(i);
  }
  std::vector<std::vector<int>> frees(program.size());
  for (size_t v = 0; v < last.size(); ++v)
    if (last[v] >= 0 && is_transient(g.value(int(v)))) frees[size_t(last[v])].push_back(int(v));
  return frees;
}

}  // namespace

OpPrograms op_programs(const Graph& g) {
  OpPrograms p;
  p.fwd = g.ops_in_phase(Phase::kForward);
  p.fwd_bwd = p.fwd;
  for (int id : g.ops_in_phase(Phase::kBackward)) p.fwd_bwd.push_back(id);
  p.opt = g.ops_in_phase(Phase::kOptimizer);
  p.free_after_fwd = last_uses(g, p.fwd);
  p.free_after_fwd_bwd = last_uses(g, p.fwd_bwd);
  return p;
}

bool is_transient(const Value& v) {
  return !v.persistent && v.role != Role::kInput && v.role != Role::kScalar;
}

memory::Tag memory_tag(const Value& v) {
  switch (v.role) {
    case Role::kParameter: return memory::Tag::kParameter;
    case Role::kGradient: return memory::Tag::kGradient;
    case Role::kOptimizerState: return memory::Tag::kOptimizer;
    default: return memory::Tag::kActivation;
  }
}

memory::Phase memory_phase(Phase p) {
  return p == Phase::kForward    ? memory::Phase::kForward
         : p == Phase::kBackward ? memory::Phase::kBackward
                                 : memory::Phase::kOptimizer;
}

}  // namespace weft::core
