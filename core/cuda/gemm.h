// GEMM through cuBLASLt: bf16 inputs, f32 accumulation, bf16 or f32 output, with the bias
// and bias+GELU epilogues cuBLASLt offers. Row-major like core/cpu/kernels.h: the wrapper
// maps C = op(A) op(B) to cuBLASLt's column-major C^T = op(B)^T op(A)^T.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include "core/cuda/runtime.h"
#include "core/dtype.h"

struct cublasLtContext;

namespace weft::core::cuda {

enum class Epilogue : uint8_t {
  kNone,
  kBias,      // C = op(A) op(B) + bias[col]            (bias: N elements, bf16)
  kBiasGelu,  // C = gelu(op(A) op(B) + bias[col]), the pre-activation stored in `aux`
};

// C(M,N) = alpha * op(A) op(B) + beta * C, row-major; A is (M,K) (or (K,M) when trans_a),
// B is (K,N) (or (N,K) when trans_b). A and B are bf16; C is bf16 or f32 (c_f32). With an
// epilogue, C must be bf16 and beta 0; aux (kBiasGelu) is bf16 (M, N) with leading dim
// ld_aux, a multiple of 8.
struct GemmArgs {
  bool trans_a = false, trans_b = false;
  int64_t M = 0, N = 0, K = 0;
  float alpha = 1.0f;
  const bf16* A = nullptr;
  int64_t lda = 0;
  const bf16* B = nullptr;
  int64_t ldb = 0;
  float beta = 0.0f;
  void* C = nullptr;
  bool c_f32 = false;
  int64_t ldc = 0;
  Epilogue epilogue = Epilogue::kNone;
  const bf16* bias = nullptr;
  bf16* aux = nullptr;
  int64_t ld_aux = 0;
  // Strided batch: `batch` GEMMs, matrix i at A + i*stride_a (elements), and so on.
  int64_t batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;
};

// Checks the arguments without touching the GPU (InternalError naming the problem).
void check_gemm_args(const GemmArgs& a);

// A cuBLASLt handle, its workspace and a cache of the algorithm chosen per problem (the
// heuristic query costs more than a small GEMM). One per stream user; not thread-safe.
class BlasLt {
 public:
  static constexpr size_t kWorkspaceBytes = 32u << 20;  // what cuBLASLt asks for on Hopper
  BlasLt();
  ~BlasLt();
  BlasLt(const BlasLt&) = delete;
  BlasLt& operator=(const BlasLt&) = delete;

  // Enqueues the GEMM on `s`. Throws InternalError for bad arguments and weft::Error when
  // cuBLASLt finds no algorithm or fails.
  void gemm(const GemmArgs& a, StreamHandle s);

 private:
  struct Algo;
  cublasLtContext* handle_ = nullptr;
  void* workspace_ = nullptr;
  using Key = std::tuple<int, int, int64_t, int64_t, int64_t, int, int64_t, int64_t, int64_t,
                         int64_t, int64_t, int64_t, int64_t>;
  std::map<Key, std::shared_ptr<Algo>> cache_;
};

}  // namespace weft::core::cuda
