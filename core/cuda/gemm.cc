// cuBLASLt GEMM: descriptors per call, algorithm per problem shape from the heuristic,
// cached. Every cuBLASLt call goes through WEFT_CUBLASLT_CHECK.
#include "core/cuda/gemm.h"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "base/check.h"
#include "base/foreign_checks.h"

namespace weft::core::cuda {

struct BlasLt::Algo {
  cublasLtMatmulAlgo_t algo;
};

namespace {

// RAII for the descriptors of one call (destroyed even when a later call throws).
struct Desc {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~Desc() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

// The largest power of two (up to 256) dividing the address of every matrix of a batch.
uint32_t alignment(const void* p, int64_t stride_bytes, int64_t batch) {
  uint64_t a = reinterpret_cast<uintptr_t>(p) | 256u;
  if (batch > 1) a |= uint64_t(stride_bytes);
  return uint32_t(a & (~a + 1));  // lowest set bit
}

}  // namespace

void check_gemm_args(const GemmArgs& a) {
  WEFT_CHECK(a.M >= 0 && a.N >= 0 && a.K >= 0, "gemm: bad sizes M=", a.M, " N=", a.N, " K=", a.K);
  WEFT_CHECK(a.A && a.B && a.C, "gemm: null matrix");
  // Row-major leading dimensions: the stored row length.
  WEFT_CHECK(a.lda >= (a.trans_a ? a.M : a.K) && a.lda >= 1, "gemm: lda=", a.lda, " too small");
  WEFT_CHECK(a.ldb >= (a.trans_b ? a.K : a.N) && a.ldb >= 1, "gemm: ldb=", a.ldb, " too small");
  WEFT_CHECK(a.ldc >= a.N && a.ldc >= 1, "gemm: ldc=", a.ldc, " too small for N=", a.N);
  if (a.epilogue != Epilogue::kNone) {
    WEFT_CHECK(!a.c_f32, "gemm: epilogues write bf16 outputs only");
    WEFT_CHECK(a.beta == 0.0f, "gemm: epilogues need beta = 0");
    WEFT_CHECK(a.bias, "gemm: the epilogue needs a bias");
  }
  WEFT_CHECK(a.batch >= 1 && (a.batch == 1 || a.epilogue == Epilogue::kNone),
             "gemm: batch=", a.batch, " (batched GEMMs take no epilogue)");
  if (a.epilogue == Epilogue::kBiasGelu)
    WEFT_CHECK(a.aux && a.ld_aux >= a.N && a.ld_aux % 8 == 0, "gemm: GELU aux needs ld_aux >= N",
               " and a multiple of 8, got ", a.ld_aux);
}

BlasLt::BlasLt() {
  WEFT_CUBLASLT_CHECK(cublasLtCreate(&handle_));
  WEFT_CUDA_DEVICE_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes));
}

BlasLt::~BlasLt() {
  if (workspace_) cudaFree(workspace_);
  if (handle_) cublasLtDestroy(handle_);
}

void BlasLt::gemm(const GemmArgs& g, StreamHandle s) {
  check_gemm_args(g);
  if (g.M == 0 || g.N == 0) return;
  // Column-major view: C^T (N x M) = op(B)^T (N x K) * op(A)^T (K x M). The row-major B
  // stored (K,N) is the column-major (N,K) matrix, so cuBLASLt's "A" is our B with our
  // trans_b, and its "B" is our A with our trans_a.
  const cublasOperation_t op_a = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const uint64_t a_rows = g.trans_b ? g.K : g.N, a_cols = g.trans_b ? g.N : g.K;
  const uint64_t b_rows = g.trans_a ? g.M : g.K, b_cols = g.trans_a ? g.K : g.M;
  const cudaDataType_t c_type = g.c_f32 ? CUDA_R_32F : CUDA_R_16BF;

  Desc d;
  WEFT_CUBLASLT_CHECK(cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  WEFT_CUBLASLT_CHECK(
      cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  WEFT_CUBLASLT_CHECK(
      cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  if (g.epilogue != Epilogue::kNone) {
    const cublasLtEpilogue_t epi =
        g.epilogue == Epilogue::kBias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    WEFT_CUBLASLT_CHECK(
        cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    const void* bias = g.bias;
    WEFT_CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                       &bias, sizeof(bias)));
    if (g.epilogue == Epilogue::kBiasGelu) {
      void* aux = g.aux;
      const int64_t ld_aux = g.ld_aux;
      WEFT_CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(
          d.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
      WEFT_CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                                         &ld_aux, sizeof(ld_aux)));
    }
  }
  WEFT_CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(&d.a, CUDA_R_16BF, a_rows, a_cols, g.ldb));
  WEFT_CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(&d.b, CUDA_R_16BF, b_rows, b_cols, g.lda));
  WEFT_CUBLASLT_CHECK(
      cublasLtMatrixLayoutCreate(&d.c, c_type, uint64_t(g.N), uint64_t(g.M), g.ldc));
  if (g.batch > 1) {  // our B is cuBLASLt's A and the other way round, as above
    const int32_t n = int32_t(g.batch);
    const int64_t strides[3] = {g.stride_b, g.stride_a, g.stride_c};
    cublasLtMatrixLayout_t layouts[3] = {d.a, d.b, d.c};
    for (int i = 0; i < 3; ++i) {
      WEFT_CUBLASLT_CHECK(cublasLtMatrixLayoutSetAttribute(
          layouts[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &n, sizeof(n)));
      WEFT_CUBLASLT_CHECK(cublasLtMatrixLayoutSetAttribute(
          layouts[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &strides[i], sizeof(int64_t)));
    }
  }

  // The heuristic assumes 256-byte aligned matrices unless told otherwise; per-head views
  // (attention) are only hs * 2 bytes apart, so tell it what each matrix really has.
  const size_t c_size = g.c_f32 ? 4 : 2;
  const uint32_t align_a = alignment(g.A, g.stride_a * 2, g.batch);
  const uint32_t align_b = alignment(g.B, g.stride_b * 2, g.batch);
  const uint32_t align_c = alignment(g.C, g.stride_c * int64_t(c_size), g.batch);
  Key key{int(op_a) * 4 + int(op_b),
          int(g.epilogue) * 2 + int(g.c_f32) + 4 * int(align_a | (align_b << 9) | (align_c << 18)),
          g.M,
          g.N,
          g.K,
          int(g.beta != 0.0f),
          g.lda,
          g.ldb,
          g.ldc,
          g.batch,
          g.stride_a,
          g.stride_b,
          g.stride_c};
  auto it = cache_.find(key);
  if (it == cache_.end()) {
    WEFT_CUBLASLT_CHECK(cublasLtMatmulPreferenceCreate(&d.pref));
    const size_t ws = kWorkspaceBytes;
    WEFT_CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(
        d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    // cuBLASLt's A is our B and the other way round; C and D are the same buffer.
    const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_b},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_a},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_c},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_c}};
    for (const auto& [attr, value] : aligns)
      WEFT_CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(d.pref, attr, &value, sizeof(value)));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    WEFT_CUBLASLT_CHECK(cublasLtMatmulAlgoGetHeuristic(handle_, d.op, d.a, d.b, d.c, d.c, d.pref, 1,
                                                       &result, &found));
    WEFT_ENSURE(found > 0, Error, "cuBLASLt has no algorithm for a bf16 GEMM M=", g.M, " N=", g.N,
                " K=", g.K, " (trans_a=", g.trans_a, ", trans_b=", g.trans_b, ")");
    it = cache_.emplace(key, std::make_shared<Algo>(Algo{result.algo})).first;
  }
  // The same buffer is C and D: with beta = 1 this is the accumulation the CPU does.
  WEFT_CUBLASLT_CHECK(cublasLtMatmul(handle_, d.op, &g.alpha, g.B, d.a, g.A, d.b, &g.beta, g.C, d.c,
                                     g.C, d.c, &it->second->algo, workspace_, kWorkspaceBytes, s));
}

}  // namespace weft::core::cuda
