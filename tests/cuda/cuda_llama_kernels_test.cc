// The Llama block's CUDA kernels (RMSNorm, rotary embedding, SwiGLU, grouped-query
// attention) against the CPU reference (core/cpu/kernels.h) on random inputs exact in
// bf16. The f32 overloads share the CPU's f32 arithmetic up to reduction order and libm,
// so they are held to f32 tolerances; the bf16 ones to the bf16 tolerances of
// cuda_kernels_test.cc. Sizes are not multiples of any block or tile. Skipped without a GPU.
#include <gtest/gtest.h>

#include <string>

#include "core/cpu/kernels.h"
#include "core/cuda/kernels.h"
#include "cuda_test_util.h"

namespace weft::core::cuda {
namespace {

using testing::close;
using testing::Gpu;
using testing::random_bf16;

// f32: element-wise results differ by a few ulps (FMA contraction, expf vs the CPU's vexp);
// row and column reductions are f32 on the GPU and double on the CPU.
constexpr double kRtF32 = 1e-5, kAtF32 = 1e-6;  // element-wise
constexpr double kRtRed = 1e-4, kAtRed = 1e-4;  // results of reductions (dx, dw)
constexpr double kRt = 2e-2, kAt = 2e-2;        // bf16 outputs: 8 bits of mantissa

// RMSNorm forward, then the backward with dx and dw accumulating into random values.
template <typename S>
void check_rmsnorm(DType dt, int64_t N, int64_t C, double rt_y, double at_y, double rt_dx,
                   double at_dx, double rt_dw, double at_dw) {
  Gpu gpu;
  auto x = random_bf16(N * C, 60, 3.0f), w = random_bf16(C, 61), dy = random_bf16(N * C, 62);
  auto dx0 = random_bf16(N * C, 63), dw0 = random_bf16(C, 64);
  Tensor gx = gpu.put({N, C}, x, dt), gw = gpu.put({C}, w, dt), gy = gpu.zeros({N, C}, dt);
  Tensor grstd = gpu.zeros({N}, DType::kF32);
  rmsnorm_forward(gx.data<S>(), gw.data<S>(), gy.data<S>(), grstd.data<float>(), N, C, 1e-5f,
                  gpu.stream());
  std::vector<float> y(N * C), r(N);
  cpu::rmsnorm_forward<float>(x.data(), w.data(), y.data(), r.data(), N, C, 1e-5f);
  EXPECT_TRUE(close(gpu.get(gy), y, rt_y, at_y));
  EXPECT_TRUE(close(gpu.get(grstd), r, 1e-5, 1e-6));

  Tensor gdy = gpu.put({N, C}, dy, dt), gdx = gpu.put({N, C}, dx0, dt);
  Tensor gdw = gpu.put({C}, dw0, DType::kF32);
  Tensor ws = gpu.zeros({int64_t(rmsnorm_backward_workspace(N, C))}, DType::kF32);
  rmsnorm_backward(gdy.data<S>(), gx.data<S>(), gw.data<S>(), grstd.data<float>(), gdx.data<S>(),
                   true, gdw.data<float>(), N, C, ws.data<float>(), gpu.stream());
  std::vector<float> dx = dx0, dw = dw0;
  cpu::rmsnorm_backward<float>(dy.data(), x.data(), w.data(), r.data(), dx.data(), true, dw.data(),
                               N, C);
  EXPECT_TRUE(close(gpu.get(gdx), dx, rt_dx, at_dx));
  EXPECT_TRUE(close(gpu.get(gdw), dw, rt_dw, at_dw));
}

TEST(CudaLlamaKernels, RmsNormF32) {
  WEFT_REQUIRE_GPU();
  check_rmsnorm<float>(DType::kF32, 300, 200, kRtF32, kAtF32, kRtRed, kAtRed, kRtRed, kAtRed);
  check_rmsnorm<float>(DType::kF32, 7, 33, kRtF32, kAtF32, kRtRed, kAtRed, kRtRed, kAtRed);
}
TEST(CudaLlamaKernels, RmsNormBf16) {
  WEFT_REQUIRE_GPU();
  check_rmsnorm<bf16>(DType::kBF16, 300, 200, kRt, kAt, kRt, 5e-2, 1e-3, 1e-2);
}

// Rotary embedding of a (B,T,heads*hs) tensor: out of place and in place forward, the
// backward accumulating and in place; T = 1000 reaches large angles.
template <typename S>
void check_rope(DType dt, int64_t B, int64_t T, int64_t heads, int64_t hs, double rt, double at) {
  Gpu gpu;
  const int64_t n = B * T * heads * hs;
  const double theta = 10000.0;
  auto x = random_bf16(n, 70), dy = random_bf16(n, 71), dx0 = random_bf16(n, 72);
  Tensor gx = gpu.put({n}, x, dt), gy = gpu.zeros({n}, dt);
  rope_forward(gx.data<S>(), gy.data<S>(), B, T, heads, hs, theta, gpu.stream());
  std::vector<float> y(n);
  cpu::rope_forward<float>(x.data(), y.data(), B, T, heads, hs, theta);
  EXPECT_TRUE(close(gpu.get(gy), y, rt, at)) << "T=" << T << " heads=" << heads;
  rope_forward(gx.data<S>(), gx.data<S>(), B, T, heads, hs, theta, gpu.stream());
  EXPECT_TRUE(close(gpu.get(gx), y, rt, at)) << "in place";

  Tensor gdy = gpu.put({n}, dy, dt), gdx = gpu.put({n}, dx0, dt);
  rope_backward(gdy.data<S>(), gdx.data<S>(), true, B, T, heads, hs, theta, gpu.stream());
  std::vector<float> dx = dx0;
  cpu::rope_backward<float>(dy.data(), dx.data(), true, B, T, heads, hs, theta);
  EXPECT_TRUE(close(gpu.get(gdx), dx, rt, at)) << "accumulating backward";
  rope_backward(gdy.data<S>(), gdy.data<S>(), false, B, T, heads, hs, theta, gpu.stream());
  cpu::rope_backward<float>(dy.data(), dx.data(), false, B, T, heads, hs, theta);
  EXPECT_TRUE(close(gpu.get(gdy), dx, rt, at)) << "in-place backward";
}

TEST(CudaLlamaKernels, RopeF32) {
  WEFT_REQUIRE_GPU();
  check_rope<float>(DType::kF32, 2, 37, 4, 16, kRtF32, kAtF32);    // q: H heads
  check_rope<float>(DType::kF32, 1, 1000, 2, 64, kRtF32, kAtF32);  // k: KV heads, long T
}
TEST(CudaLlamaKernels, RopeBf16) {
  WEFT_REQUIRE_GPU();
  check_rope<bf16>(DType::kBF16, 2, 37, 4, 16, kRt, 1e-2);
}

// SwiGLU with gates reaching the capped exponent; backward accumulating, then overwriting.
template <typename S>
void check_swiglu(DType dt, double rt, double at, double rt_b, double at_b) {
  Gpu gpu;
  const int64_t n = 4099;
  auto gate = random_bf16(n, 80, 4.0f), up = random_bf16(n, 81), dout = random_bf16(n, 82);
  gate[0] = 100.0f, gate[1] = -100.0f, gate[2] = 0.0f;
  auto dg0 = random_bf16(n, 83), du0 = random_bf16(n, 84);
  Tensor gg = gpu.put({n}, gate, dt), gu = gpu.put({n}, up, dt), go = gpu.zeros({n}, dt);
  swiglu_forward(gg.data<S>(), gu.data<S>(), go.data<S>(), n, gpu.stream());
  std::vector<float> out(n);
  cpu::swiglu_forward<float>(gate.data(), up.data(), out.data(), n);
  EXPECT_TRUE(close(gpu.get(go), out, rt, at));

  Tensor gd = gpu.put({n}, dout, dt), gdg = gpu.put({n}, dg0, dt), gdu = gpu.put({n}, du0, dt);
  for (bool acc : {true, false}) {
    swiglu_backward(gd.data<S>(), gg.data<S>(), gu.data<S>(), gdg.data<S>(), gdu.data<S>(), acc, n,
                    gpu.stream());
    std::vector<float> dg = dg0, du = du0;
    cpu::swiglu_backward<float>(dout.data(), gate.data(), up.data(), dg.data(), du.data(), acc, n);
    EXPECT_TRUE(close(gpu.get(gdg), dg, rt_b, at_b)) << "accumulate=" << acc;
    EXPECT_TRUE(close(gpu.get(gdu), du, rt_b, at_b)) << "accumulate=" << acc;
  }
}

TEST(CudaLlamaKernels, SwigluF32) {
  WEFT_REQUIRE_GPU();
  check_swiglu<float>(DType::kF32, kRtF32, kAtF32, kRtF32, 1e-5);
}
TEST(CudaLlamaKernels, SwigluBf16) {
  WEFT_REQUIRE_GPU();
  check_swiglu<bf16>(DType::kBF16, kRt, 1e-2, kRt, 1e-2);
}

// Grouped-query attention on cuBLASLt against the CPU's: the saved probabilities, out,
// then the backward overwriting (on random buffers) and accumulating. bf16 inputs, so
// bf16 tolerances, those of the GPT attention GEMM test.
void check_gqa(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hs, uint32_t seed) {
  Gpu gpu;
  const int64_t nq = B * T * H * hs, nk = B * T * KV * hs;
  auto q = random_bf16(nq, seed), k = random_bf16(nk, seed + 1), v = random_bf16(nk, seed + 2);
  auto dout = random_bf16(nq, seed + 3), dq0 = random_bf16(nq, seed + 4);
  auto dk0 = random_bf16(nk, seed + 5), dv0 = random_bf16(nk, seed + 6);
  Tensor gq = gpu.put({nq}, q, DType::kBF16), gk = gpu.put({nk}, k, DType::kBF16);
  Tensor gv = gpu.put({nk}, v, DType::kBF16), gout = gpu.zeros({nq}, DType::kBF16);
  Tensor gatt = gpu.zeros({B, H, T, T}, DType::kBF16);
  Tensor scores = gpu.zeros({int64_t(attention_gemm_workspace(T, H))}, DType::kF32);
  gqa_attention_gemm_forward(gpu.blas(), gq.data<bf16>(), gk.data<bf16>(), gv.data<bf16>(),
                             gout.data<bf16>(), gatt.data<bf16>(), scores.data<float>(), B, T, H,
                             KV, hs, gpu.stream());
  std::vector<float> out(nq), att(B * H * T * T);
  cpu::gqa_attention_forward<float>(q.data(), k.data(), v.data(), out.data(), att.data(), B, T, H,
                                    KV, hs);
  const std::string what = "T=" + std::to_string(T) + " H=" + std::to_string(H) +
                           " KV=" + std::to_string(KV) + " hs=" + std::to_string(hs);
  EXPECT_TRUE(close(gpu.get(gatt), att, kRt, 1e-4)) << what;
  EXPECT_TRUE(close(gpu.get(gout), out, kRt, kAt)) << what;

  Tensor gdo = gpu.put({nq}, dout, DType::kBF16), gdq = gpu.put({nq}, dq0, DType::kBF16);
  Tensor gdk = gpu.put({nk}, dk0, DType::kBF16), gdv = gpu.put({nk}, dv0, DType::kBF16);
  Tensor dscores = gpu.zeros({int64_t(attention_gemm_workspace(T, H))}, DType::kF32);
  Tensor ds = gpu.zeros({H, T, T}, DType::kBF16);
  std::vector<float> dq = dq0, dk = dk0, dv = dv0;
  for (bool acc : {false, true}) {  // overwrite the random values, then add to the result
    gqa_attention_gemm_backward(gpu.blas(), gdo.data<bf16>(), gq.data<bf16>(), gk.data<bf16>(),
                                gv.data<bf16>(), gatt.data<bf16>(), gdq.data<bf16>(),
                                gdk.data<bf16>(), gdv.data<bf16>(), acc, dscores.data<float>(),
                                ds.data<bf16>(), B, T, H, KV, hs, gpu.stream());
    cpu::gqa_attention_backward<float>(dout.data(), q.data(), k.data(), v.data(), att.data(),
                                       dq.data(), dk.data(), dv.data(), acc, B, T, H, KV, hs);
    EXPECT_TRUE(close(gpu.get(gdq), dq, 3e-2, 5e-2)) << what << " accumulate=" << acc;
    EXPECT_TRUE(close(gpu.get(gdk), dk, 3e-2, 5e-2)) << what << " accumulate=" << acc;
    EXPECT_TRUE(close(gpu.get(gdv), dv, 3e-2, 5e-2)) << what << " accumulate=" << acc;
  }
}

TEST(CudaLlamaKernels, GqaAttentionTwoQueryHeadsPerKvHead) {
  WEFT_REQUIRE_GPU();
  check_gqa(2, 77, 4, 2, 16, 100);
}
TEST(CudaLlamaKernels, GqaAttentionFourQueryHeadsPerKvHead) {
  WEFT_REQUIRE_GPU();
  check_gqa(1, 130, 8, 2, 64, 110);
}
TEST(CudaLlamaKernels, GqaAttentionOneKvHead) {
  WEFT_REQUIRE_GPU();
  check_gqa(2, 33, 3, 1, 32, 120);
}
TEST(CudaLlamaKernels, GqaAttentionKvHeadsEqualHeads) {
  WEFT_REQUIRE_GPU();
  check_gqa(2, 65, 4, 4, 16, 130);
}
TEST(CudaLlamaKernels, GqaAttentionOneRow) {
  WEFT_REQUIRE_GPU();
  check_gqa(3, 1, 4, 2, 16, 140);
}

}  // namespace
}  // namespace weft::core::cuda
