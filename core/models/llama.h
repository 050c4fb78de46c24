// The Llama model builder (arch: llama): RMSNorm, rotary positions, grouped-query attention
// and a SwiGLU MLP, no biases, with Hugging Face transformers' parameter names so weights
// move to and from LlamaForCausalLM unchanged (shared/reference/README.md, "Llama").
#pragma once

#include "core/models/gpt.h"

namespace weft::core {

// The forward graph of `spec` (arch llama) for micro-batches of `micro_batch` sequences;
// build_model dispatches here. Initialisation: every weight matrix normal(0, 0.02) except
// o_proj and down_proj, which write into the residual stream, at 0.02 / sqrt(2 * layers)
// (GPT-2's scaling, as core/models/gpt.cc); the RMSNorm weights are 1. Weight decay on the
// 2-D weights only.
ModelGraph build_llama(const ModelSpec& spec, int64_t micro_batch, DType dtype);

}  // namespace weft::core
