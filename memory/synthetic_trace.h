// A documented model of the allocations of one training step of one pipeline stage of a
// GPT (dense or MoE): the synthetic traces that tests and benchmarks use until traces
// recorded from real runs replace them.
#pragma once

#include <cstdint>
#include <vector>

#include "memory/trace.h"

namespace weft::memory {

enum class Schedule : uint8_t { kSequential, k1F1B, kInterleaved };

// Shapes as llm.c names them: B micro-batch, T sequence, C hidden, NH heads, F MLP width;
// tok = B*T tokens per micro-batch. Activations take bytes_per_elem per element.
struct StepModel {
  int64_t batch = 1, seq = 1024, hidden = 1024, heads = 16, ffn = 4096, vocab = 32768;
  int layers = 8;               // transformer layers on this stage, all chunks together
  int bytes_per_elem = 2;       // bf16 activations
  int grad_bytes = 4;           // fp32 weight gradients
  bool flash_attention = true;  // false: the (B,NH,T,T) probabilities and mask are saved
  Schedule schedule = Schedule::k1F1B;
  int stages = 4, stage = 0;  // pipeline size and the stage whose step this is
  int micro_batches = 8;
  int virtual_stages = 1;  // model chunks per stage (kInterleaved)
  bool recompute = false;  // full recomputation: a layer keeps only its input
  int experts = 0;         // > 0: every MLP is a dropless MoE with this many experts
  int top_k = 2;
  int64_t expert_ffn = 0;             // 0: ffn / top_k
  double routing_skew = 0.5;          // spread of tokens over experts (log-normal sigma)
  bool optimizer = true;              // model the optimizer phase (and per-step weight gradients)
  int64_t workspace_bytes = 4 << 20;  // GEMM workspace around each matmul
};

// One forward or backward of one micro-batch through one model chunk of the stage.
struct Microstep {
  bool forward;
  int micro_batch;
  int chunk;
};
// The stage's order of microsteps: sequential (F then B per micro-batch), 1F1B with
// stages - stage - 1 warm-up forwards, or Megatron's interleaved schedule (warm-up
// (stages - stage - 1) * 2 + (virtual_stages - 1) * stages; needs micro_batches % stages
// == 0). Throws ConfigError for shapes the schedule cannot run.
std::vector<Microstep> pipeline_schedule(const StepModel& m);

// The model of one step, in schedule order, with set_phase(forward|backward, micro-batch)
// at each microstep and (optimizer, -1) at the end:
// - Forward of a chunk: its input (received from the previous stage: kComm; on the first
//   chunk of stage 0, the embedding output) is saved. Each layer then allocates, saving
//   for backward unless noted: LN1 stats (tok*2 fp32) and output (tok*C), a workspace
//   (freed after the matmul), QKV (tok*3C), attention (flash: LSE (B,NH,T) fp32; else
//   probabilities (B,NH,T,T) and a 1-byte dropout mask, with the scores a temporary),
//   context (tok*C), the projection (temporary), a dropout mask (tok*C bytes), the
//   residual (tok*C), LN2 stats and output, then the MLP, then the layer output (tok*C),
//   which the next layer saves as its input.
//   Dense MLP: FC1 (tok*F) and GELU (tok*F) saved, FC2 temporary, dropout mask saved.
//   MoE MLP: router logits (tok*experts fp32), routing (tok*top_k*8), the dispatched
//   tokens (tok*top_k*C, kComm), and per expert e with n_e > 0 tokens FC1 and GELU
//   (n_e*expert_ffn) saved and its output (n_e*C) until the combine buffer (tok*top_k*C,
//   kComm) is filled. n_e follows log-normal weights drawn from (seed, micro-batch,
//   chunk, layer): sizes change from step to step, and an expert with no tokens
//   allocates nothing. The expert part is fenced by a set_phase() with the current
//   phase before and after it (in backward too), as an executor marks MoE regions.
//   The chunk's last output is sent and freed, or, on the last stage, feeds the loss
//   (logits tok*vocab, a temporary).
// - With recompute, a layer frees everything it saved except its input at the end of its
//   forward, and its backward starts by allocating all of it again.
// - Backward of a chunk receives the output gradient (tok*C), then per layer in reverse:
//   on the chunk's first backward the layer's weight gradients (QKV, projection, MLP or
//   router and expert weights, biases, LN) in grad_bytes, freed in the optimizer phase;
//   then the saved tensors in reverse order, each (masks and stats excepted) getting a
//   gradient of its size that frees the gradient before it, and is then freed itself.
//   The input gradient is sent and freed.
// - Optimizer: a grad-norm buffer, then per weight gradient an update temporary of its
//   size, then the gradient is freed.
// Every allocation of the step is freed within it. Deterministic for a (model, seed).
Trace synthesize_step(const StepModel& m, uint64_t seed = 0);

}  // namespace weft::memory
