// Named weights in the reference naming (shared/reference/README.md), so a model moves
// to and from PyTorch without conversion: stacked expert tensors (E, ...) appear as
// h.{i}.moe.experts.{e}.* per expert.
#pragma once

#include <map>
#include <string>

#include "core/exec/executor.h"
#include "core/models/gpt.h"

namespace weft::core {

using NamedTensors = std::map<std::string, Tensor>;

// f32 copies of every parameter (or of every parameter's gradient when `gradients`).
NamedTensors export_weights(const ModelGraph& mg, GraphExecutor& ex, bool gradients = false);

// Copies named tensors into the parameters. Every parameter must be present with its
// shape, and the file must hold nothing else; otherwise throws ConfigError naming
// `field` (e.g. "--init-weights"), the tensor, and what was expected. Nothing is
// modified when the check fails.
void import_weights(const ModelGraph& mg, GraphExecutor& ex, const NamedTensors& named,
                    const std::string& field);

}  // namespace weft::core
