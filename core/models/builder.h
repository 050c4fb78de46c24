// Internal: the small helper the model builders (gpt.cc, llama.cc) share to name values by
// scope and append ops in program order.
#pragma once

#include <string>
#include <utility>

#include "core/models/gpt.h"

namespace weft::core::models_detail {

// Small helper that names values by scope and appends ops in program order.
struct Builder {
  ModelGraph& mg;
  DType dt;
  std::string scope;
  int layer = -1;

  Graph& g() { return mg.graph; }
  // `stacked`: dim 0 stacks experts, so weight decay follows the per-expert rank (the
  // reference decays 2-D weights only: an expert's bias is 1-D even when stacked).
  int param(const std::string& name, Shape shape, float std, float fill = 0.0f,
            bool stacked = false) {
    Value v;
    v.name = name;
    v.shape = std::move(shape);
    v.dtype = dt;
    v.role = Role::kParameter;
    v.persistent = true;
    v.decay = v.shape.size() - (stacked ? 1 : 0) >= 2;
    v.init_std = std;
    v.init_fill = fill;
    return g().add_value(v);
  }
  int act(const std::string& name, Shape shape, DType t = DType::kF32, Role r = Role::kActivation) {
    Value v;
    v.name = scope.empty() ? name : scope + "." + name;
    v.shape = std::move(shape);
    v.dtype = t == DType::kF32 ? dt : t;
    v.role = r;
    return g().add_value(v);
  }
  int op(const std::string& type, std::vector<int> in, std::vector<int> out, Attrs a = {}) {
    Op o;
    o.type = type;
    o.inputs = std::move(in);
    o.outputs = std::move(out);
    o.attrs = std::move(a);
    o.scope = scope;
    o.layer = layer;
    return g().add_op(std::move(o));
  }
};

}  // namespace weft::core::models_detail
