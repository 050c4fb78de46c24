// Autodiff and optimizer-op construction.
#include "core/graph/autodiff.h"

#include <algorithm>

#include "base/check.h"
#include "core/graph/op_table.h"

namespace weft::core {

Autodiff::Autodiff(Graph& g) : g_(g), grad_of_(g.values().size(), -1) {
  for (int p : g_.parameters()) needs_.insert(p);
  for (int id : g_.ops_in_phase(Phase::kForward)) {
    const Op& op = g_.op(id);
    bool any = std::any_of(op.inputs.begin(), op.inputs.end(), [&](int v) { return needs_.count(v); });
    if (any)
      for (int o : op.outputs) needs_.insert(o);
  }
}

int Autodiff::grad(int v) {
  if (v < int(grad_of_.size()) && grad_of_[v] >= 0) return grad_of_[v];
  const Value& fv = g_.value(v);
  Value gv;
  gv.name = (fv.role == Role::kParameter ? "grad:" : "d:") + fv.name;
  gv.shape = fv.shape;
  gv.dtype = fv.dtype;
  gv.role = Role::kGradient;
  gv.grad_of = v;
  gv.persistent = fv.role == Role::kParameter;
  int id = g_.add_value(gv);
  grad_of_.resize(g_.values().size(), -1);
  grad_of_[v] = id;
  return id;
}

void Autodiff::emit(const Op& fwd, const std::string& type, const std::vector<int>& inputs,
                    const std::vector<int>& grads_of, Attrs attrs) {
  Op op;
  op.type = type;
  op.inputs = inputs;
  op.phase = Phase::kBackward;
  op.mirror = fwd.id;
  op.scope = fwd.scope;
  op.layer = fwd.layer;
  for (size_t k = 0; k < grads_of.size(); ++k) {
    int v = grads_of[k];
    if (v < 0 || !needs_grad(v)) {
      attrs.ints["skip_out" + std::to_string(k)] = 1;
      continue;
    }
    op.outputs.push_back(grad(v));
    op.accumulate.push_back(g_.value(v).role == Role::kParameter || written_.count(v) > 0);
    written_.insert(v);
  }
  op.attrs = std::move(attrs);
  g_.add_op(std::move(op));
}

void Autodiff::run(const std::vector<int>& losses) {
  for (int l : losses) seeds_.insert(l);
  std::vector<int> fwd = g_.ops_in_phase(Phase::kForward);
  for (auto it = fwd.rbegin(); it != fwd.rend(); ++it) {
    const Op op = g_.op(*it);  // copy: emitting ops may reallocate the op vector
    const OpDef& def = op_def(op.type);
    if (!def.build_backward) continue;
    bool flows = std::any_of(op.outputs.begin(), op.outputs.end(), [&](int v) { return has_grad(v); });
    if (flows) def.build_backward(*this, op);
  }
  // Every parameter gets a gradient value, zero when nothing reached it (an expert with
  // no tokens still has one in the reference), so the optimizer treats all alike.
  for (int p : g_.parameters()) grad(p);
}

void append_optimizer(Graph& g, double beta1, double beta2, double eps, double weight_decay,
                      double grad_clip) {
  std::vector<int> params = g.parameters();
  Value norm;
  norm.name = "grad_norm";
  norm.shape = {1};
  norm.dtype = DType::kF64;
  norm.role = Role::kScalar;
  norm.persistent = true;
  int norm_id = g.add_value(norm);

  Op gn;
  gn.type = "global_norm";
  gn.phase = Phase::kOptimizer;
  for (int p : params) {
    int gid = g.find_value("grad:" + g.value(p).name);
    WEFT_CHECK(gid >= 0, "parameter ", g.value(p).name, " has no gradient");
    gn.inputs.push_back(gid);
  }
  gn.outputs = {norm_id};
  g.add_op(gn);

  for (int p : params) {
    const Value pv = g.value(p);
    int m = g.add_value({.name = "adam_m:" + pv.name, .shape = pv.shape, .dtype = pv.dtype,
                         .role = Role::kOptimizerState, .persistent = true});
    int v = g.add_value({.name = "adam_v:" + pv.name, .shape = pv.shape, .dtype = pv.dtype,
                         .role = Role::kOptimizerState, .persistent = true});
    Op up;
    up.type = "adamw";
    up.phase = Phase::kOptimizer;
    up.inputs = {p, g.find_value("grad:" + pv.name), m, v, norm_id};
    up.attrs.floats = {{"beta1", beta1}, {"beta2", beta2}, {"eps", eps},
                       {"weight_decay", weight_decay}, {"grad_clip", grad_clip}};
    up.attrs.ints = {{"decay", pv.decay ? 1 : 0}};
    up.scope = pv.name;
    g.add_op(up);
  }
}

}  // namespace weft::core
