// Graph construction and queries.
#include "core/graph/graph.h"

#include <sstream>

#include "base/check.h"
#include "core/graph/op_table.h"

namespace weft::core {

const char* role_name(Role r) {
  switch (r) {
    case Role::kInput: return "input";
    case Role::kActivation: return "activation";
    case Role::kParameter: return "parameter";
    case Role::kGradient: return "gradient";
    case Role::kOptimizerState: return "optimizer_state";
    case Role::kScalar: return "scalar";
  }
  return "?";
}

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::kForward: return "forward";
    case Phase::kBackward: return "backward";
    case Phase::kOptimizer: return "optimizer";
  }
  return "?";
}

int64_t Attrs::i(const std::string& k) const {
  auto it = ints.find(k);
  WEFT_CHECK(it != ints.end(), "op has no int attribute '", k, "'");
  return it->second;
}
double Attrs::f(const std::string& k) const {
  auto it = floats.find(k);
  WEFT_CHECK(it != floats.end(), "op has no float attribute '", k, "'");
  return it->second;
}
int64_t Attrs::i_or(const std::string& k, int64_t fallback) const {
  auto it = ints.find(k);
  return it == ints.end() ? fallback : it->second;
}

int Graph::add_value(Value v) {
  WEFT_CHECK(!v.name.empty(), "values need a name");
  WEFT_CHECK(!by_name_.count(v.name), "duplicate value name '", v.name, "'");
  v.id = int(values_.size());
  by_name_[v.name] = v.id;
  values_.push_back(std::move(v));
  return values_.back().id;
}

int Graph::add_op(Op op) {
  op_def(op.type);  // throws for an unknown type
  for (int v : op.inputs) WEFT_CHECK(v >= 0 && v < int(values_.size()), "op ", op.type, " input ", v);
  for (int v : op.outputs) WEFT_CHECK(v >= 0 && v < int(values_.size()), "op ", op.type, " output ", v);
  if (op.accumulate.empty()) op.accumulate.assign(op.outputs.size(), false);
  WEFT_CHECK(op.accumulate.size() == op.outputs.size(), "op ", op.type, ": accumulate flags");
  op.id = int(ops_.size());
  ops_.push_back(std::move(op));
  return ops_.back().id;
}

int Graph::find_value(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? -1 : it->second;
}

std::vector<int> Graph::ops_in_phase(Phase p) const {
  std::vector<int> ids;
  for (const Op& o : ops_)
    if (o.phase == p) ids.push_back(o.id);
  return ids;
}

std::vector<int> Graph::values_with_role(Role r) const {
  std::vector<int> ids;
  for (const Value& v : values_)
    if (v.role == r) ids.push_back(v.id);
  return ids;
}

std::string Graph::to_string() const {
  std::ostringstream os;
  for (const Op& o : ops_) {
    os << "%" << o.id << " " << phase_name(o.phase) << " " << o.type;
    if (o.mirror >= 0) os << " (mirrors %" << o.mirror << ")";
    os << "  [" << op_def(o.type).annotation << "]\n    in:";
    for (int v : o.inputs) os << " " << values_[v].name << shape_str(values_[v].shape);
    os << "\n    out:";
    for (size_t k = 0; k < o.outputs.size(); ++k)
      os << " " << (o.accumulate[k] ? "+=" : "") << values_[o.outputs[k]].name
         << shape_str(values_[o.outputs[k]].shape);
    os << "\n";
  }
  return os.str();
}

}  // namespace weft::core
