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
  // y (B,T,fan_out) = x w^T [+ bias]: the weight `scope.name.weight` (fan_out, fan_in), the
  // bias `scope.name.bias` (fan_out, zero-initialised) when `bias`.
  int linear(const std::string& name, int in, int64_t fan_in, int64_t fan_out, float wstd,
             bool bias) {
    const Shape x = g().value(in).shape;  // a copy: param() below grows the value table
    std::vector<int> ins = {in, param(scope + "." + name + ".weight", {fan_out, fan_in}, wstd)};
    if (bias) ins.push_back(param(scope + "." + name + ".bias", {fan_out}, 0.0f));
    int y = act(name + ".out", {x[0], x[1], fan_out});
    op("linear", std::move(ins), {y});
    return y;
  }
  // The residual sum a + c, named `name`, of a's shape.
  int residual(const std::string& name, int a, int c) {
    int y = act(name, g().value(a).shape);
    op("add", {a, c}, {y});
    return y;
  }
};

}  // namespace weft::core::models_detail
