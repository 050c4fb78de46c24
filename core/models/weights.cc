// Mapping between graph parameters and reference-named tensors.
#include "core/models/weights.h"

#include <functional>

#include "base/error.h"
#include "core/exec/nonfinite.h"

namespace weft::core {
namespace {

const std::string kStacked = ".moe.experts.";

// Calls f(reference name, view of the parameter tensor) for every named piece.
void for_each_named(const ModelGraph& mg, GraphExecutor& ex, bool gradients,
                    const std::function<void(const std::string&, Tensor)>& f) {
  for (int p : mg.graph.parameters()) {
    const std::string& name = mg.graph.value(p).name;
    int id = gradients ? mg.graph.find_value("grad:" + name) : p;
    Tensor t = ex.tensor(id);
    size_t at = name.find(kStacked);
    if (at == std::string::npos) {
      f(name, t);
      continue;
    }
    for (int64_t e = 0; e < t.size(0); ++e) {
      std::string per = name.substr(0, at + kStacked.size()) + std::to_string(e) + "." +
                        name.substr(at + kStacked.size());
      f(per, t.select(0, e));
    }
  }
}

}  // namespace

NamedTensors export_weights(const ModelGraph& mg, GraphExecutor& ex, bool gradients) {
  NamedTensors out;
  for_each_named(mg, ex, gradients,
                 [&](const std::string& n, Tensor t) { out[n] = t.to(DType::kF32); });
  return out;
}

void import_weights(const ModelGraph& mg, GraphExecutor& ex, const NamedTensors& named,
                    const std::string& field) {
  size_t expected = 0;
  std::string arch = mg.spec.arch + " with " + std::to_string(mg.spec.layers) + " layers, dim " +
                     std::to_string(mg.spec.dim) + ", vocab " + std::to_string(mg.spec.vocab);
  // Check everything first, so a bad file changes nothing.
  for_each_named(mg, ex, false, [&](const std::string& n, Tensor t) {
    ++expected;
    auto it = named.find(n);
    if (it == named.end())
      throw ConfigError(field, "the weights lack tensor '" + n + "': they are for another model (this one is " + arch + ")");
    if (it->second.shape() != t.shape())
      throw ConfigError(field, "tensor '" + n + "' has shape " + shape_str(it->second.shape()) +
                                   ", the model (" + arch + ") needs " + shape_str(t.shape()));
    // Training from NaN or Inf only produces NaN (and would reach checkpoints): refuse it.
    if (!all_finite(it->second))
      throw ConfigError(field, "tensor '" + n + "' holds NaN or Inf values: give weights with "
                                   "finite values only (e.g. a checkpoint from before the run "
                                   "diverged)");
  });
  if (named.size() != expected) {
    for (const auto& [n, t] : named) {
      bool known = false;
      for_each_named(mg, ex, false, [&](const std::string& m, Tensor) { known = known || m == n; });
      if (!known)
        throw ConfigError(field, "the weights hold tensor '" + n + "' that this model (" + arch +
                                     ") does not have: they are for another model");
    }
  }
  for_each_named(mg, ex, false, [&](const std::string& n, Tensor t) { t.copy_from(named.at(n)); });
}

}  // namespace weft::core
