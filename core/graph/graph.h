// The graph IR: values (tensors with a role) and ops (a typed node with a dimension
// annotation). The forward graph comes from a model builder; autodiff appends the
// backward ops (each mirrored to its forward op) and the optimizer ops. The planner
// partitions and schedules these ops; the executor runs them.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/graph/dim_annotation.h"
#include "core/tensor.h"

namespace weft::core {

enum class Role : uint8_t {
  kInput,           // fed per micro-batch (token ids, targets)
  kActivation,      // produced and consumed within one micro-batch's forward/backward
  kParameter,       // persistent trainable weights
  kGradient,        // gradients: of activations (transient) or of parameters (persistent)
  kOptimizerState,  // AdamW moments
  kScalar,          // per-step scalars (loss, aux loss, grad norm)
};
const char* role_name(Role r);

enum class Phase : uint8_t { kForward, kBackward, kOptimizer };
const char* phase_name(Phase p);

struct Value {
  int id = -1;
  std::string name;
  Shape shape;
  DType dtype = DType::kF32;
  Role role = Role::kActivation;
  int grad_of = -1;       // for gradients: the value this is the gradient of
  bool persistent = false;  // parameters, their gradients and optimizer state live across steps
  bool decay = false;       // parameters: AdamW weight decay applies (2+ dims)
  float init_std = 0.0f;    // parameters: normal(0, init_std) when > 0, else init_fill
  float init_fill = 0.0f;
};

// Integer and float attributes of an op (shapes, eps, flags).
struct Attrs {
  std::map<std::string, int64_t> ints;
  std::map<std::string, double> floats;
  int64_t i(const std::string& k) const;
  double f(const std::string& k) const;
  int64_t i_or(const std::string& k, int64_t fallback) const;
};

struct Op {
  int id = -1;
  std::string type;            // key into the op table (core/graph/op_table.h)
  std::vector<int> inputs;     // value ids
  std::vector<int> outputs;    // value ids
  std::vector<bool> accumulate;  // per output: add into the value instead of overwriting
  Attrs attrs;
  Phase phase = Phase::kForward;
  int mirror = -1;  // backward ops: the forward op they differentiate
  std::string scope;  // e.g. "h.3.attn": the layer this op belongs to (pipeline staging)
  int layer = -1;     // transformer block index, -1 for embedding/head ops
};

class Graph {
 public:
  int add_value(Value v);
  // Appends an op; returns its id. Output accumulate flags default to false.
  int add_op(Op op);

  Value& value(int id) { return values_.at(id); }
  const Value& value(int id) const { return values_.at(id); }
  Op& op(int id) { return ops_.at(id); }
  const Op& op(int id) const { return ops_.at(id); }
  const std::vector<Value>& values() const { return values_; }
  const std::vector<Op>& ops() const { return ops_; }
  int find_value(const std::string& name) const;  // -1 when absent

  // Ops of one phase, in program order.
  std::vector<int> ops_in_phase(Phase p) const;
  std::vector<int> values_with_role(Role r) const;
  // Parameter value ids in creation order (the canonical order for norms and files).
  std::vector<int> parameters() const { return values_with_role(Role::kParameter); }

  // Human-readable listing: one op per line with its annotation and value shapes.
  std::string to_string() const;

 private:
  std::vector<Value> values_;
  std::vector<Op> ops_;
  std::map<std::string, int> by_name_;
};

}  // namespace weft::core
