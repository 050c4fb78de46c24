// Mixture-of-experts stage kernels: routing and dispatch, the expert MLPs over row segments,
// the weighted combine, and their backward passes. The fused moe op chains them on one
// device; expert parallelism runs route and combine where the tokens are and the experts
// where the weights are, with an all_to_all_v of the rows in between.
//
// Shapes: N tokens, C channels, F hidden units (or a slice of them), E experts, k = top_k,
// A = N*k assignments, R expert-side rows. route (A,2) i32 holds (token*k + slot, expert)
// of the kept assignments sorted by expert then token, padded with -1. Expert-side rows come
// in segments: segment i is seg_rows[i] consecutive rows of local expert seg_expert[i].
// Threads and accumulate flags follow kernels.h.
#pragma once

#include <cstdint>
#include <type_traits>
#include <vector>

namespace weft::core::cpu {

// Top-k per token, ties to the lower expert index (torch.topk on CPU): expert (N,k) by
// descending probability, weight (N,k) renormalised over the k, sum (N) of the chosen.
// `bias` (E, loss_free balancing; may be null) shifts the choice only: experts are ranked
// by p + bias, their weights stay the renormalised probabilities.
struct MoeTopK {
  int64_t N = 0, E = 0, k = 0;
  std::vector<int32_t> expert;
  std::vector<double> weight, sum;
};
template <typename T>
MoeTopK moe_top_k(const T* probs, int64_t N, int64_t E, int64_t k, const float* bias = nullptr);

// Capacity per expert: unlimited for capacity_factor <= 0, else ceil(cf * N * k / E).
int64_t moe_capacity(double capacity_factor, int64_t N, int64_t k, int64_t E);
// The kept assignments of a route (its rows before the -1 padding).
int64_t moe_route_kept(const int32_t* route, int64_t A);

// Router and dispatch: probs (N,E) = softmax(y router^T) (logits (N,E) is scratch); route;
// xe (A,C) rows 0..kept-1 = the tokens of the kept assignments in route order (the first
// `capacity` assignments of each expert in token order). Returns the balance loss
// E * sum_e f_e P_e (f: share of assignments before dropping, P: mean probability).
// `counts` and `prob_sums` (E each, may be null) receive the assignments per expert before
// dropping and the sum of p[:, e] over the tokens (MoeBalance::record).
template <typename T>
double moe_route_forward(const T* y, const T* router, T* logits, T* probs, int32_t* route, T* xe,
                         int64_t N, int64_t C, int64_t E, int64_t k, double capacity_factor,
                         const float* bias = nullptr, double* counts = nullptr,
                         double* prob_sums = nullptr);

// he (R,F) = xe fc_w[e]^T + fc_b[e] (before GELU), ge (R,F) = gelu(he) (scratch),
// ye (R,C) = ge proj_w[e]^T + proj_b[e], per segment. fc_w (E',F,C), fc_b (E',F),
// proj_w (E',C,F), proj_b (E',C) hold the local experts; either bias may be null.
template <typename T>
void moe_experts_forward(const T* xe, const T* fc_w, const std::type_identity_t<T>* fc_b,
                         const T* proj_w, const std::type_identity_t<T>* proj_b, T* he, T* ge, T* ye,
                         const int64_t* seg_expert, const int64_t* seg_rows, int64_t segments,
                         int64_t C, int64_t F);

// out (N,C) = sum over the token's kept slots, in slot order, of weight * ye[row].
template <typename T>
void moe_combine_forward(const T* ye, const int32_t* route, const T* probs, T* out, int64_t N,
                         int64_t C, int64_t E, int64_t k, const float* bias = nullptr);

// dye (A,C) = weight * dout on kept rows (padding rows zero); dprobs (N,E) = the gradient
// through the renormalised weights w_j = p_j / S, plus balance_scale * E f_e / N (the
// balance loss's gradient times aux_coef and the loss scale; 0 leaves it out). f_e is
// `shares` (E, the global batch's, aux_loss_global) or, when null, these tokens' own.
template <typename T>
void moe_combine_backward(const T* dout, const T* ye, const int32_t* route, const T* probs, T* dye,
                          T* dprobs, double balance_scale, int64_t N, int64_t C, int64_t E,
                          int64_t k, const float* bias = nullptr, const double* shares = nullptr);

// Expert MLPs backward per segment: dxe (R,C) overwritten; dfc_w, dfc_b, dproj_w, dproj_b
// accumulate (each may be null); ge, dge, dhe (R,F) scratch.
template <typename T>
void moe_experts_backward(const T* dye, const T* xe, const T* he, const T* fc_w, const T* proj_w,
                          T* dxe, std::type_identity_t<T>* dfc_w, std::type_identity_t<T>* dfc_b,
                          std::type_identity_t<T>* dproj_w, std::type_identity_t<T>* dproj_b, T* ge,
                          T* dge, T* dhe, const int64_t* seg_expert, const int64_t* seg_rows,
                          int64_t segments, int64_t C, int64_t F);

// Router backward: dy (N,C) = (dy +) the sum of dxe over the token's kept rows +
// dlogits router, with dlogits (N,E, scratch) = softmax_backward(dprobs, probs);
// drouter (E,C) += dlogits^T y.
template <typename T>
void moe_route_backward(const T* dxe, const T* dprobs, const T* y, const T* router, const T* probs,
                        const int32_t* route, T* dy, bool accumulate_dy, T* drouter, T* dlogits,
                        int64_t N, int64_t C, int64_t E, int64_t k);

}  // namespace weft::core::cpu
