// Each CUDA kernel against the CPU reference (core/cpu/kernels.h) on random inputs that
// are exact in bf16, with bf16 tolerances (outputs are rounded to bf16 once, accumulations
// are f32). Skipped when no GPU is present.
#include <gtest/gtest.h>

#include <cmath>

#include "core/cpu/kernels.h"
#include "core/cuda/kernels.h"
#include "cuda_test_util.h"

namespace weft::core::cuda {
namespace {

using testing::close;
using testing::Gpu;
using testing::random_bf16;
using testing::random_ids;
using testing::round_bf16;

constexpr double kRt = 2e-2, kAt = 2e-2;  // bf16 outputs: 8 bits of mantissa

TEST(CudaKernels, Casts) {
  WEFT_REQUIRE_GPU();
  Gpu gpu;
  std::vector<float> x = random_bf16(1000, 1);
  for (size_t i = 0; i < x.size(); i += 3) x[i] += 1e-3f;  // not exact: rounding matters
  Tensor d = gpu.put({1000}, x, DType::kF32);
  Tensor b = gpu.zeros({1000}, DType::kBF16);
  cast_f32_to_bf16(d.data<float>(), b.data<bf16>(), 1000, gpu.stream());
  Tensor back = gpu.zeros({1000}, DType::kF32);
  cast_bf16_to_f32(b.data<bf16>(), back.data<float>(), 1000, gpu.stream());
  EXPECT_EQ(gpu.get(back), round_bf16(x));  // round to nearest even, as float_to_bf16
}

TEST(CudaKernels, AddAccumulateGelu) {
  WEFT_REQUIRE_GPU();
  Gpu gpu;
  const int64_t n = 4099;
  auto a = random_bf16(n, 2, 2.0f), b = random_bf16(n, 3, 2.0f), dy = random_bf16(n, 4);
  Tensor da = gpu.put({n}, a, DType::kBF16), db = gpu.put({n}, b, DType::kBF16);
  Tensor y = gpu.zeros({n}, DType::kBF16);
  add(da.data<bf16>(), db.data<bf16>(), y.data<bf16>(), n, gpu.stream());
  std::vector<float> want(n);
  cpu::add<float>(a.data(), b.data(), want.data(), n);
  EXPECT_TRUE(close(gpu.get(y), round_bf16(want), 0, 0));  // one rounding of an exact sum
  accumulate(da.data<bf16>(), y.data<bf16>(), n, gpu.stream());
  for (int64_t i = 0; i < n; ++i) want[i] = round_bf16({want[i]})[0] + a[i];
  EXPECT_TRUE(close(gpu.get(y), want, kRt, 1e-3));

  gelu_forward(da.data<bf16>(), y.data<bf16>(), n, gpu.stream());
  cpu::gelu_forward<float>(a.data(), want.data(), n);
  EXPECT_TRUE(close(gpu.get(y), want, kRt, 1e-3));
  Tensor ddy = gpu.put({n}, dy, DType::kBF16), dx = gpu.put({n}, b, DType::kBF16);
  gelu_backward(ddy.data<bf16>(), da.data<bf16>(), dx.data<bf16>(), true, n, gpu.stream());
  std::vector<float> wdx = b;
  cpu::gelu_backward<float>(dy.data(), a.data(), wdx.data(), true, n);
  EXPECT_TRUE(close(gpu.get(dx), wdx, kRt, 1e-2));
}

TEST(CudaKernels, ColumnSum) {
  WEFT_REQUIRE_GPU();
  Gpu gpu;
  const int64_t R = 1000, C = 77;
  auto x = random_bf16(R * C, 5);
  Tensor dx = gpu.put({R, C}, x, DType::kBF16);
  std::vector<float> init = random_bf16(C, 6);
  Tensor out = gpu.put({C}, init, DType::kF32);
  Tensor ws = gpu.zeros({int64_t(column_sum_workspace(R, C))}, DType::kF32);
  column_sum(dx.data<bf16>(), R, C, out.data<float>(), ws.data<float>(), gpu.stream());
  std::vector<float> want = init;
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) want[c] += x[r * C + c];
  EXPECT_TRUE(close(gpu.get(out), want, 1e-4, 1e-3));
}

// C = op(A) op(B) for every transpose combination, f32 output accumulating (beta 1) and
// bf16 output overwriting, against the CPU GEMM on the same bf16-exact inputs.
TEST(CudaKernels, GemmAllTransposes) {
  WEFT_REQUIRE_GPU();
  Gpu gpu;
  const int64_t M = 67, N = 96, K = 136;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      auto a = random_bf16(M * K, 10 + ta), b = random_bf16(K * N, 20 + tb),
           c0 = random_bf16(M * N, 30);
      const int64_t lda = ta ? M : K, ldb = tb ? K : N;
      Tensor da = gpu.put({M * K}, a, DType::kBF16), dbm = gpu.put({K * N}, b, DType::kBF16);
      Tensor c32 = gpu.put({M * N}, c0, DType::kF32);
      GemmArgs g;
      g.trans_a = ta, g.trans_b = tb;
      g.M = M, g.N = N, g.K = K;
      g.A = da.data<bf16>(), g.lda = lda;
      g.B = dbm.data<bf16>(), g.ldb = ldb;
      g.alpha = 0.5f, g.beta = 1.0f;
      g.C = c32.data<float>(), g.c_f32 = true, g.ldc = N;
      gpu.blas().gemm(g, gpu.stream());
      std::vector<float> want = c0;
      cpu::gemm<float>(ta, tb, M, N, K, 0.5f, a.data(), lda, b.data(), ldb, 1.0f, want.data(), N);
      EXPECT_TRUE(close(gpu.get(c32), want, 1e-3, 1e-3)) << "ta=" << ta << " tb=" << tb;

      Tensor c16 = gpu.zeros({M * N}, DType::kBF16);
      g.C = c16.data<bf16>(), g.c_f32 = false, g.alpha = 1.0f, g.beta = 0.0f;
      gpu.blas().gemm(g, gpu.stream());
      cpu::gemm<float>(ta, tb, M, N, K, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, want.data(), N);
      EXPECT_TRUE(close(gpu.get(c16), want, kRt, kAt)) << "ta=" << ta << " tb=" << tb;
    }
}

// linear = x w^T + b through the bias epilogue; bias+GELU stores the pre-activation.
TEST(CudaKernels, GemmEpilogues) {
  WEFT_REQUIRE_GPU();
  Gpu gpu;
  const int64_t N = 64, in = 128, out = 192;
  auto x = random_bf16(N * in, 40), w = random_bf16(out * in, 41, 0.1f), b = random_bf16(out, 42);
  Tensor dx = gpu.put({N, in}, x, DType::kBF16), dw = gpu.put({out, in}, w, DType::kBF16);
  Tensor dbias = gpu.put({out}, b, DType::kBF16);
  Tensor y = gpu.zeros({N, out}, DType::kBF16), pre = gpu.zeros({N, out}, DType::kBF16);
  GemmArgs g;
  g.trans_b = true;
  g.M = N, g.N = out, g.K = in;
  g.A = dx.data<bf16>(), g.lda = in;
  g.B = dw.data<bf16>(), g.ldb = in;
  g.C = y.data<bf16>(), g.ldc = out;
  g.epilogue = Epilogue::kBias;
  g.bias = dbias.data<bf16>();
  gpu.blas().gemm(g, gpu.stream());
  std::vector<float> want(N * out), act(N * out);
  cpu::linear_forward<float>(x.data(), w.data(), b.data(), want.data(), N, in, out);
  EXPECT_TRUE(close(gpu.get(y), want, kRt, kAt));

  g.epilogue = Epilogue::kBiasGelu;
  g.aux = pre.data<bf16>(), g.ld_aux = out;
  gpu.blas().gemm(g, gpu.stream());
  EXPECT_TRUE(close(gpu.get(pre), want, kRt, kAt));
  // cuBLASLt's GELU is the tanh form too; compare with the CPU's on the rounded input.
  std::vector<float> pre_r = round_bf16(want);
  cpu::gelu_forward<float>(pre_r.data(), act.data(), N * out);
  EXPECT_TRUE(close(gpu.get(y), act, kRt, kAt));
}

TEST(CudaKernels, LayerNormForwardBackward) {
  WEFT_REQUIRE_GPU();
  Gpu gpu;
  const int64_t N = 300, C = 200;
  auto x = random_bf16(N * C, 50, 3.0f), w = random_bf16(C, 51), b = random_bf16(C, 52);
  auto dy = random_bf16(N * C, 53), dx0 = random_bf16(N * C, 54);
  auto dw0 = random_bf16(C, 55), db0 = random_bf16(C, 56);
  Tensor dX = gpu.put({N, C}, x, DType::kBF16), dW = gpu.put({C}, w, DType::kBF16);
  Tensor dB = gpu.put({C}, b, DType::kBF16), dY = gpu.zeros({N, C}, DType::kBF16);
  Tensor mean = gpu.zeros({N}, DType::kF32), rstd = gpu.zeros({N}, DType::kF32);
  layernorm_forward(dX.data<bf16>(), dW.data<bf16>(), dB.data<bf16>(), dY.data<bf16>(),
                    mean.data<float>(), rstd.data<float>(), N, C, 1e-5f, gpu.stream());
  std::vector<float> y(N * C), m(N), r(N);
  cpu::layernorm_forward<float>(x.data(), w.data(), b.data(), y.data(), m.data(), r.data(), N, C,
                                1e-5f);
  EXPECT_TRUE(close(gpu.get(dY), y, kRt, kAt));
  EXPECT_TRUE(close(gpu.get(mean), m, 1e-5, 1e-5));
  EXPECT_TRUE(close(gpu.get(rstd), r, 1e-4, 1e-5));

  Tensor gdy = gpu.put({N, C}, dy, DType::kBF16), gdx = gpu.put({N, C}, dx0, DType::kBF16);
  Tensor gdw = gpu.put({C}, dw0, DType::kF32), gdb = gpu.put({C}, db0, DType::kF32);
  Tensor ws = gpu.zeros({int64_t(layernorm_backward_workspace(N, C))}, DType::kF32);
  layernorm_backward(gdy.data<bf16>(), dX.data<bf16>(), dW.data<bf16>(), mean.data<float>(),
                     rstd.data<float>(), gdx.data<bf16>(), true, gdw.data<float>(),
                     gdb.data<float>(), N, C, ws.data<float>(), gpu.stream());
  std::vector<float> dx = dx0, dw = dw0, db = db0;
  cpu::layernorm_backward<float>(dy.data(), x.data(), w.data(), m.data(), r.data(), dx.data(), true,
                                 dw.data(), db.data(), N, C);
  EXPECT_TRUE(close(gpu.get(gdx), dx, kRt, 5e-2));
  EXPECT_TRUE(close(gpu.get(gdw), dw, 1e-3, 1e-2));
  EXPECT_TRUE(close(gpu.get(gdb), db, 1e-3, 1e-2));
}

TEST(CudaKernels, SoftmaxForwardBackward) {
  WEFT_REQUIRE_GPU();
  Gpu gpu;
  const int64_t R = 33, Cc = 1000;
  auto x = random_bf16(R * Cc, 60, 3.0f), dy = random_bf16(R * Cc, 61);
  Tensor dX = gpu.put({R, Cc}, x, DType::kBF16), dY = gpu.zeros({R, Cc}, DType::kBF16);
  softmax_forward(dX.data<bf16>(), dY.data<bf16>(), R, Cc, gpu.stream());
  std::vector<float> y(R * Cc), dx(R * Cc);
  cpu::softmax_forward<float>(x.data(), y.data(), R, Cc);
  EXPECT_TRUE(close(gpu.get(dY), y, kRt, 1e-4));
  // The backward on the CPU's (bf16-rounded) probabilities, as the GPU sees them.
  std::vector<float> yr = round_bf16(y);
  Tensor gy = gpu.put({R, Cc}, yr, DType::kBF16), gdy = gpu.put({R, Cc}, dy, DType::kBF16);
  Tensor gdx = gpu.zeros({R, Cc}, DType::kBF16);
  softmax_backward(gdy.data<bf16>(), gy.data<bf16>(), gdx.data<bf16>(), false, R, Cc, gpu.stream());
  cpu::softmax_backward<float>(dy.data(), yr.data(), dx.data(), false, R, Cc);
  EXPECT_TRUE(close(gpu.get(gdx), dx, kRt, 1e-4));
}

// Both variants of the causal softmax (row in registers up to T = 2048, re-read beyond).
TEST(CudaKernels, CausalSoftmaxShortAndLongRows) {
  WEFT_REQUIRE_GPU();
  Gpu gpu;
  for (int64_t T : {77, 2100}) {
    const int64_t rows = 2 * T;  // two heads
    auto S = random_bf16(rows * T, 65, 3.0f), dP = random_bf16(rows * T, 66);
    std::vector<float> P(rows * T, 0.0f), dS(rows * T, 0.0f);
    for (int64_t r = 0; r < rows; ++r) {  // the CPU's causal_softmax_row and its backward
      const int64_t n = r % T + 1;
      float mx = -INFINITY;
      for (int64_t j = 0; j < n; ++j) mx = std::max(mx, S[r * T + j]);
      double sum = 0;
      for (int64_t j = 0; j < n; ++j) sum += std::exp(double(S[r * T + j]) - mx);
      for (int64_t j = 0; j < n; ++j)
        P[r * T + j] = float(std::exp(double(S[r * T + j]) - mx) / sum);
    }
    std::vector<float> Pr = round_bf16(P);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t n = r % T + 1;
      double dot = 0;
      for (int64_t j = 0; j < n; ++j) dot += double(dP[r * T + j]) * Pr[r * T + j];
      for (int64_t j = 0; j < n; ++j) dS[r * T + j] = float(Pr[r * T + j] * (dP[r * T + j] - dot));
    }
    Tensor gS = gpu.put({rows * T}, S, DType::kF32), gP = gpu.put({rows * T}, dP, DType::kBF16);
    causal_softmax_forward(gS.data<float>(), gP.data<bf16>(), rows, T, gpu.stream());
    EXPECT_TRUE(close(gpu.get(gP), P, kRt, 1e-6)) << "T=" << T;
    Tensor gdP = gpu.put({rows * T}, dP, DType::kF32), gPr = gpu.put({rows * T}, Pr, DType::kBF16);
    Tensor gdS = gpu.zeros({rows * T}, DType::kBF16);
    causal_softmax_backward(gdP.data<float>(), gPr.data<bf16>(), gdS.data<bf16>(), rows, T,
                            gpu.stream());
    EXPECT_TRUE(close(gpu.get(gdS), dS, kRt, 1e-5)) << "T=" << T;
  }
}

TEST(CudaKernels, CrossEntropyForwardBackward) {
  WEFT_REQUIRE_GPU();
  Gpu gpu;
  const int64_t N = 40, V = 5003;
  auto logits = random_bf16(N * V, 70, 2.0f);
  auto tgt = random_ids(N, int32_t(V), 71);
  Tensor dl = gpu.put({N, V}, logits, DType::kBF16), dt = gpu.put({N}, tgt, DType::kI32);
  Tensor losses = gpu.zeros({N}, DType::kF32), probs = gpu.zeros({N, V}, DType::kBF16);
  Tensor mean = gpu.zeros({1}, DType::kF32);
  cross_entropy_forward(dl.data<bf16>(), dt.data<int32_t>(), losses.data<float>(),
                        probs.data<bf16>(), mean.data<float>(), N, V, gpu.stream());
  std::vector<float> l(N), p(N * V);
  double m = cpu::cross_entropy_forward<float>(logits.data(), tgt.data(), l.data(), p.data(), N, V);
  EXPECT_TRUE(close(gpu.get(losses), l, 1e-4, 1e-4));
  EXPECT_NEAR(gpu.get(mean)[0], m, 1e-4 * m);
  EXPECT_TRUE(close(gpu.get(probs), p, kRt, 1e-6));

  std::vector<float> pr = round_bf16(p), d(N * V);
  Tensor gp = gpu.put({N, V}, pr, DType::kBF16), gd = gpu.zeros({N, V}, DType::kBF16);
  cross_entropy_backward(gp.data<bf16>(), dt.data<int32_t>(), 0.25f, gd.data<bf16>(), false, N, V,
                         gpu.stream());
  cpu::cross_entropy_backward<float>(pr.data(), tgt.data(), 0.25f, d.data(), false, N, V);
  EXPECT_TRUE(close(gpu.get(gd), d, kRt, 1e-6));
}

TEST(CudaKernels, EmbeddingForwardBackward) {
  WEFT_REQUIRE_GPU();
  Gpu gpu;
  const int64_t B = 3, T = 17, C = 40, V = 50;
  auto wte = random_bf16(V * C, 80), wpe = random_bf16(T * C, 81),
       dout = random_bf16(B * T * C, 82);
  auto tok = random_ids(B * T, int32_t(V), 83);
  tok[5] = tok[6] = tok[40] = 7;  // repeated ids: the scatter must add
  Tensor gwte = gpu.put({V, C}, wte, DType::kBF16), gwpe = gpu.put({T, C}, wpe, DType::kBF16);
  Tensor gtok = gpu.put({B, T}, tok, DType::kI32), out = gpu.zeros({B, T, C}, DType::kBF16);
  embedding_forward(gtok.data<int32_t>(), gwte.data<bf16>(), gwpe.data<bf16>(), out.data<bf16>(), B,
                    T, C, gpu.stream());
  std::vector<float> want(B * T * C);
  cpu::embedding_forward<float>(tok.data(), wte.data(), wpe.data(), want.data(), B, T, C, V);
  EXPECT_TRUE(close(gpu.get(out), want, kRt, 1e-3));

  std::vector<float> dwte = random_bf16(V * C, 84), dwpe = random_bf16(T * C, 85);
  Tensor gdo = gpu.put({B, T, C}, dout, DType::kBF16);
  Tensor gdwte = gpu.put({V, C}, dwte, DType::kF32), gdwpe = gpu.put({T, C}, dwpe, DType::kF32);
  embedding_backward(gdo.data<bf16>(), gtok.data<int32_t>(), gdwte.data<float>(),
                     gdwpe.data<float>(), B, T, C, gpu.stream());
  cpu::embedding_backward<float>(dout.data(), tok.data(), dwte.data(), dwpe.data(), B, T, C);
  EXPECT_TRUE(close(gpu.get(gdwte), dwte, 1e-5, 1e-5));
  EXPECT_TRUE(close(gpu.get(gdwpe), dwpe, 1e-5, 1e-5));
}

// Flash attention against the CPU's explicit (T,T) attention: T not a multiple of the
// tiles, head sizes 16 and 64, and the accumulating backward.
void check_attention(int64_t B, int64_t T, int64_t C, int64_t H, uint32_t seed) {
  Gpu gpu;
  auto qkv = random_bf16(B * T * 3 * C, seed, 1.0f), dout = random_bf16(B * T * C, seed + 1);
  auto dqkv0 = random_bf16(B * T * 3 * C, seed + 2);
  Tensor g_qkv = gpu.put({B, T, 3 * C}, qkv, DType::kBF16);
  Tensor g_out = gpu.zeros({B, T, C}, DType::kBF16), lse = gpu.zeros({B, H, T}, DType::kF32);
  attention_forward(g_qkv.data<bf16>(), g_out.data<bf16>(), lse.data<float>(), B, T, C, H,
                    gpu.stream());
  std::vector<float> out(B * T * C), att(B * H * T * T);
  cpu::attention_forward<float>(qkv.data(), out.data(), att.data(), B, T, C, H);
  EXPECT_TRUE(close(gpu.get(g_out), out, kRt, kAt)) << "T=" << T << " hs=" << C / H;

  Tensor g_do = gpu.put({B, T, C}, dout, DType::kBF16);
  Tensor g_dqkv = gpu.put({B, T, 3 * C}, dqkv0, DType::kBF16);
  Tensor ws = gpu.zeros({int64_t(attention_backward_workspace(B, T, H))}, DType::kF32);
  attention_backward(g_do.data<bf16>(), g_qkv.data<bf16>(), lse.data<float>(), g_dqkv.data<bf16>(),
                     true, ws.data<float>(), B, T, C, H, gpu.stream());
  std::vector<float> dqkv = dqkv0;
  cpu::attention_backward<float>(dout.data(), qkv.data(), att.data(), dqkv.data(), true, B, T, C,
                                 H);
  EXPECT_TRUE(close(gpu.get(g_dqkv), dqkv, 3e-2, 3e-2)) << "T=" << T << " hs=" << C / H;
}
// The cuBLASLt attention against the same reference; its saved probabilities are the CPU's
// att in bf16.
void check_attention_gemm(int64_t B, int64_t T, int64_t C, int64_t H, uint32_t seed) {
  Gpu gpu;
  auto qkv = random_bf16(B * T * 3 * C, seed, 1.0f), dout = random_bf16(B * T * C, seed + 1);
  auto dqkv0 = random_bf16(B * T * 3 * C, seed + 2);
  Tensor g_qkv = gpu.put({B, T, 3 * C}, qkv, DType::kBF16);
  Tensor g_out = gpu.zeros({B, T, C}, DType::kBF16), g_att = gpu.zeros({B, H, T, T}, DType::kBF16);
  Tensor scores = gpu.zeros({int64_t(attention_gemm_workspace(T, H))}, DType::kF32);
  attention_gemm_forward(gpu.blas(), g_qkv.data<bf16>(), g_out.data<bf16>(), g_att.data<bf16>(),
                         scores.data<float>(), B, T, C, H, gpu.stream());
  std::vector<float> out(B * T * C), att(B * H * T * T);
  cpu::attention_forward<float>(qkv.data(), out.data(), att.data(), B, T, C, H);
  EXPECT_TRUE(close(gpu.get(g_att), att, kRt, 1e-4)) << "T=" << T;
  EXPECT_TRUE(close(gpu.get(g_out), out, kRt, kAt)) << "T=" << T;

  Tensor g_do = gpu.put({B, T, C}, dout, DType::kBF16);
  Tensor g_dqkv = gpu.put({B, T, 3 * C}, dqkv0, DType::kBF16);
  Tensor dscores = gpu.zeros({int64_t(attention_gemm_workspace(T, H))}, DType::kF32);
  Tensor ds = gpu.zeros({H, T, T}, DType::kBF16);
  attention_gemm_backward(gpu.blas(), g_do.data<bf16>(), g_qkv.data<bf16>(), g_att.data<bf16>(),
                          g_dqkv.data<bf16>(), true, dscores.data<float>(), ds.data<bf16>(), B, T,
                          C, H, gpu.stream());
  std::vector<float> dqkv = dqkv0;
  cpu::attention_backward<float>(dout.data(), qkv.data(), att.data(), dqkv.data(), true, B, T, C,
                                 H);
  EXPECT_TRUE(close(gpu.get(g_dqkv), dqkv, 3e-2, 5e-2)) << "T=" << T;
}
TEST(CudaKernels, AttentionGemmHeadSize16) {
  WEFT_REQUIRE_GPU();
  check_attention_gemm(2, 77, 64, 4, 93);
}
TEST(CudaKernels, AttentionGemmHeadSize64) {
  WEFT_REQUIRE_GPU();
  check_attention_gemm(2, 128, 256, 4, 94);
}

TEST(CudaKernels, AttentionHeadSize16) {
  WEFT_REQUIRE_GPU();
  check_attention(2, 77, 64, 4, 90);
}
TEST(CudaKernels, AttentionHeadSize64) {
  WEFT_REQUIRE_GPU();
  check_attention(1, 130, 128, 2, 91);
}
TEST(CudaKernels, AttentionHeadSize32OneRow) {
  WEFT_REQUIRE_GPU();
  check_attention(3, 1, 96, 3, 92);
}

TEST(CudaKernels, GlobalNormAndAdamWMultiTensor) {
  WEFT_REQUIRE_GPU();
  Gpu gpu;
  // 40 tensors: more than one launch's worth of descriptors, sizes across chunk edges.
  std::vector<int64_t> sizes;
  for (int i = 0; i < 40; ++i) sizes.push_back(1 + (int64_t(i) * 7919) % 40000);
  std::vector<std::vector<float>> p, g, m, v;
  std::vector<Tensor> dp, dg, dm, dv, dpb;
  double ss = 0;
  for (int i = 0; i < 40; ++i) {
    const int64_t n = sizes[i];
    p.push_back(random_bf16(n, 100 + i));
    g.push_back(random_bf16(n, 200 + i, 0.1f));
    m.push_back(random_bf16(n, 300 + i, 0.01f));
    v.push_back(random_bf16(n, 400 + i, 0.01f));
    for (float& x : v.back()) x = std::fabs(x);
    ss += cpu::sum_squares<float>(g.back().data(), n);
    dp.push_back(gpu.put({n}, p.back(), DType::kF32));
    dg.push_back(gpu.put({n}, g.back(), DType::kF32));
    dm.push_back(gpu.put({n}, m.back(), DType::kF32));
    dv.push_back(gpu.put({n}, v.back(), DType::kF32));
    dpb.push_back(gpu.zeros({n}, DType::kBF16));
  }
  std::vector<const float*> gptr;
  for (auto& t : dg) gptr.push_back(t.data<float>());
  Tensor norm = gpu.zeros({1}, DType::kF64);
  Tensor ws = gpu.zeros({int64_t(sum_squares_workspace(sizes))}, DType::kF64);
  global_norm(gptr, sizes, norm.data<double>(), ws.data<double>(), gpu.stream());
  const double gn = std::sqrt(ss);
  EXPECT_NEAR(to_host(norm, gpu.stream()).item(), gn, 1e-9 * gn);

  AdamWHyper hp{3e-3, 0.9, 0.95, 1e-8, 0.1, /*grad_clip=*/1.0, /*step=*/3};
  std::vector<AdamWTensor> list;
  for (int i = 0; i < 40; ++i)
    list.push_back({dp[i].data<float>(), dg[i].data<float>(), dm[i].data<float>(),
                    dv[i].data<float>(), dpb[i].data<bf16>(), sizes[i], i % 3 != 0});
  adamw_multi(list, hp, norm.data<double>(), gpu.stream());
  const double clip = std::min(1.0, 1.0 / (gn + 1e-6));
  for (int i = 0; i < 40; ++i) {
    cpu::AdamWParams cp{hp.lr, hp.beta1, hp.beta2, hp.eps, hp.weight_decay, hp.step, clip};
    cpu::adamw_update<float>(p[i].data(), g[i].data(), m[i].data(), v[i].data(), sizes[i], cp,
                             i % 3 != 0);
    EXPECT_TRUE(close(gpu.get(dp[i]), p[i], 1e-5, 1e-6)) << "tensor " << i;
    EXPECT_TRUE(close(gpu.get(dm[i]), m[i], 1e-5, 1e-7)) << "tensor " << i;
    EXPECT_TRUE(close(gpu.get(dv[i]), v[i], 1e-5, 1e-9)) << "tensor " << i;
    EXPECT_EQ(gpu.get(dpb[i]), round_bf16(gpu.get(dp[i]))) << "tensor " << i;  // compute copy
  }
}

}  // namespace
}  // namespace weft::core::cuda
