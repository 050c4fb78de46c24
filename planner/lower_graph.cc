// GraphInfo: chunk placement of ops, boundary transfers, recompute marks, parameter facts.
#include <algorithm>
#include <map>

#include "base/check.h"
#include "base/error.h"
#include "planner/lower.h"

namespace weft::planner {

int assign_stage(const ParallelConfig& pc, int chunk) { return pc.chunk_stage(chunk); }

int GraphInfo::param_of_grad(int value) const {
  const core::Value& v = g.value(value);
  if (v.role != core::Role::kGradient || v.grad_of < 0) return -1;
  return g.value(v.grad_of).role == core::Role::kParameter ? v.grad_of : -1;
}

GraphInfo::GraphInfo(const core::Graph& graph, const ParallelConfig& config,
                     const std::vector<OpDecision>& dec)
    : g(graph), pc(config) {
  const size_t nops = g.ops().size(), nvals = g.values().size();
  const int chunks = pc.chunk_count();
  std::map<int64_t, int> layer_chunk;
  for (int c = 0; c < chunks; ++c)
    for (int64_t l : pc.chunks[size_t(c)]) layer_chunk[l] = c;

  op_chunk.assign(nops, -1);
  decision.assign(nops, -1);
  std::map<int, int> dec_index;
  for (size_t i = 0; i < dec.size(); ++i) dec_index[dec[i].op] = int(i);
  for (const core::Op& op : g.ops()) {
    if (op.phase == core::Phase::kForward) {
      if (op.layer >= 0) {
        WEFT_CHECK(layer_chunk.count(op.layer), "layer ", op.layer, " has no pipeline stage");
        op_chunk[size_t(op.id)] = layer_chunk[op.layer];
      } else {
        // Embedding on the first chunk, the final norm and the head on the last.
        op_chunk[size_t(op.id)] = op.scope.rfind("embed", 0) == 0 ? 0 : chunks - 1;
      }
      if (dec_index.count(op.id)) decision[size_t(op.id)] = dec_index[op.id];
    } else if (op.phase == core::Phase::kBackward) {
      WEFT_CHECK(op.mirror >= 0, "backward op %", op.id, " has no mirror");
      op_chunk[size_t(op.id)] = op_chunk[size_t(op.mirror)];
      decision[size_t(op.id)] = decision[size_t(op.mirror)];
    }
  }
  for (int d = 0; d < 2; ++d) chunk_ops[d].assign(size_t(chunks), {});
  for (const core::Op& op : g.ops()) {
    if (op.phase == core::Phase::kOptimizer) continue;
    int d = op.phase == core::Phase::kForward ? 0 : 1;
    chunk_ops[d][size_t(op_chunk[size_t(op.id)])].push_back(op.id);
  }

  writers.assign(nvals, {});
  readers.assign(nvals, {});
  for (const core::Op& op : g.ops()) {
    if (op.phase == core::Phase::kOptimizer) continue;
    for (int v : op.outputs) writers[size_t(v)].push_back(op.id);
    for (int v : op.inputs) readers[size_t(v)].push_back(op.id);
  }

  recompute.assign(nops, 0);
  for (int id : g.ops_in_phase(core::Phase::kForward)) {
    const core::Op& op = g.op(id);
    if (pc.recompute == "selective") {
      recompute[size_t(id)] = op.type == "attention" || op.type == "gqa_attention";
    } else if (pc.recompute == "full" && op.layer >= 0) {
      // Every op of a layer except those whose outputs leave it (the layer's output is
      // the checkpoint the recomputation starts from).
      bool leaves = false;
      for (int v : op.outputs)
        for (int r : readers[size_t(v)])
          if (g.op(r).phase == core::Phase::kForward && g.op(r).layer != op.layer) leaves = true;
      recompute[size_t(id)] = !leaves;
    }
  }

  for (size_t v = 0; v < nvals; ++v) {
    const core::Value& val = g.value(int(v));
    if (val.persistent || val.role == core::Role::kInput || writers[v].empty()) continue;
    int src = op_chunk[size_t(writers[v][0])];
    for (int w : writers[v])
      if (op_chunk[size_t(w)] != src)
        throw NotSupported("value " + val.name + " is written in two pipeline chunks");
    Dir src_dir = g.op(writers[v][0]).phase == core::Phase::kForward ? Dir::kForward : Dir::kBackward;
    std::map<int, Dir> dst;
    for (int r : readers[v]) {
      int c = op_chunk[size_t(r)];
      if (c == src || pc.chunk_stage(c) == pc.chunk_stage(src)) continue;
      Dir d = g.op(r).phase == core::Phase::kForward ? Dir::kForward : Dir::kBackward;
      if (!dst.count(c) || d == Dir::kForward) dst[c] = d;
    }
    for (auto [c, d] : dst) transfers.push_back({int(v), src, c, src_dir, d});
  }

  adamw_of.assign(nvals, -1);
  expert_param.assign(nvals, 0);
  param_stages.assign(nvals, {});
  keep.assign(nvals, 0);
  grad_value.assign(nvals, -1);
  for (size_t v = 0; v < nvals; ++v)
    if (int p = param_of_grad(int(v)); p >= 0) grad_value[size_t(p)] = int(v);
  for (const core::Op& op : g.ops()) {
    if (op.type == "adamw") adamw_of[size_t(op.inputs[0])] = op.id;
    if (op.type == "global_norm") global_norm = op.id;
    if (op.type == "moe" && pc.deg.ep > 1)
      for (int i = 2; i < 6; ++i) expert_param[size_t(op.inputs[size_t(i)])] = 1;
    if (op.phase == core::Phase::kForward) {
      for (int v : op.inputs)
        if (g.value(v).role == core::Role::kParameter) {
          int s = pc.chunk_stage(op_chunk[size_t(op.id)]);
          auto& st = param_stages[size_t(v)];
          if (std::find(st.begin(), st.end(), s) == st.end()) st.push_back(s);
        }
      for (int v : op.outputs)
        if (g.value(v).role == core::Role::kScalar) keep[size_t(v)] = 1;
    }
  }
  for (auto& st : param_stages) std::sort(st.begin(), st.end());
}

}  // namespace weft::planner
