// Token plus position embedding and its gradients.
#include "core/cuda/common.cuh"

namespace weft::core::cuda {
namespace {

using detail::ld;
using detail::st;

__global__ void k_emb_fwd(const int32_t* tokens, const __nv_bfloat16* wte, const __nv_bfloat16* wpe,
                          __nv_bfloat16* out, int64_t BT, int64_t T, int64_t C) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < BT * C;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t bt = i / C, c = i % C;
    // No wpe: a model without learned positions (Llama's rotary positions act in attention).
    st(out, i, ld(wte, int64_t(tokens[bt]) * C + c) + (wpe ? ld(wpe, (bt % T) * C + c) : 0.0f));
  }
}

// dwte: every (row, channel) adds into its token's row; tokens repeat, hence atomics.
__global__ void k_emb_bwd_wte(const __nv_bfloat16* dout, const int32_t* tokens, float* dwte,
                              int64_t BT, int64_t C) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < BT * C;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t bt = i / C, c = i % C;
    atomicAdd(dwte + int64_t(tokens[bt]) * C + c, ld(dout, i));
  }
}

// dwpe[t, c] += sum over b of dout[b, t, c], b in order.
__global__ void k_emb_bwd_wpe(const __nv_bfloat16* dout, float* dwpe, int64_t B, int64_t T,
                              int64_t C) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < T * C;
       i += int64_t(gridDim.x) * blockDim.x) {
    float s = 0.0f;
    for (int64_t b = 0; b < B; ++b) s += ld(dout, b * T * C + i);
    dwpe[i] += s;
  }
}

}  // namespace

void embedding_forward(const int32_t* tokens, const bf16* wte, const bf16* wpe, bf16* out,
                       int64_t B, int64_t T, int64_t C, StreamHandle s) {
  WEFT_CHECK(B >= 0 && T >= 0 && C >= 0, "embedding_forward: bad sizes B=", B, " T=", T, " C=", C);
  if (B * T * C == 0) return;
  k_emb_fwd<<<detail::grid_for(B * T * C, 256), 256, 0, s>>>(
      tokens, detail::dev(wte), detail::dev(wpe), detail::dev(out), B * T, T, C);
  check_launch("embedding_forward");
}

void embedding_backward(const bf16* dout, const int32_t* tokens, float* dwte, float* dwpe,
                        int64_t B, int64_t T, int64_t C, StreamHandle s) {
  WEFT_CHECK(B >= 0 && T >= 0 && C >= 0, "embedding_backward: bad sizes B=", B, " T=", T, " C=", C);
  if (B * T * C == 0) return;
  if (dwte) {
    k_emb_bwd_wte<<<detail::grid_for(B * T * C, 256), 256, 0, s>>>(detail::dev(dout), tokens, dwte,
                                                                   B * T, C);
    check_launch("embedding_backward (wte)");
  }
  if (dwpe) {
    k_emb_bwd_wpe<<<detail::grid_for(T * C, 256), 256, 0, s>>>(detail::dev(dout), dwpe, B, T, C);
    check_launch("embedding_backward (wpe)");
  }
}

}  // namespace weft::core::cuda
