// Reverse-mode autodiff over the graph IR: walks the forward ops backwards and asks
// each op's backward builder (op table) to emit backward ops mirrored to it.
//
// Gradient values: a parameter's gradient is persistent and every contribution
// accumulates into it (micro-batches and tied weights sum for free); an activation's
// gradient is transient, its first contribution (in backward order) overwrites and later
// ones accumulate. Loss scalars are seeds: their backward ops read the loss scale from
// StepScalars instead of a gradient tensor.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "core/graph/graph.h"

namespace weft::core {

class Autodiff {
 public:
  explicit Autodiff(Graph& g);

  // Emits the backward graph for the given loss values (outputs of forward ops).
  void run(const std::vector<int>& losses);

  Graph& graph() { return g_; }
  // True when v is a parameter or depends on one (so its gradient is wanted).
  bool needs_grad(int v) const { return needs_.count(v) > 0; }
  // True when a gradient has been produced for v, or v is a loss seed.
  bool has_grad(int v) const { return written_.count(v) > 0 || seeds_.count(v) > 0; }
  // The gradient value of v; created (not yet written) on first request.
  int grad(int v);

  // Emits a backward op of `fwd` with the given inputs, writing the gradients of the
  // forward values `grads_of` (entries whose value needs no gradient are dropped and
  // reported to the kernel through the int attribute "skip_out<k>").
  void emit(const Op& fwd, const std::string& type, const std::vector<int>& inputs,
            const std::vector<int>& grads_of, Attrs attrs = {});

 private:
  Graph& g_;
  std::set<int> needs_, written_, seeds_;
  std::vector<int> grad_of_;  // value id -> gradient value id, -1 if none
};

// Builds the optimizer ops: the global gradient norm over all parameter gradients (in
// parameter order) and one AdamW update per parameter with its two moments.
void append_optimizer(Graph& g, double beta1, double beta2, double eps, double weight_decay,
                      double grad_clip);

}  // namespace weft::core
