// Forward CPU kernels against naive reference loops: GEMM (every transpose, leading
// dimensions with padding, batched), linear, softmax, LayerNorm, GELU, causal
// attention, embedding, cross-entropy, element-wise; plus the error paths.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "base/error.h"
#include "core/cpu/kernels.h"

namespace weft::core::cpu {
namespace {

template <typename T>
std::vector<T> randn(size_t n, uint64_t seed, double scale = 1.0) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> d(0.0, scale);
  std::vector<T> v(n);
  for (T& x : v) x = T(d(gen));
  return v;
}

// Restores the thread count a test changed.
class ThreadGuard {
 public:
  explicit ThreadGuard(int n) : saved_(num_threads()) { set_num_threads(n); }
  ~ThreadGuard() { set_num_threads(saved_); }

 private:
  int saved_;
};

// ---- GEMM ---------------------------------------------------------------------------

// C = alpha op(A) op(B) + beta C, computed element by element in double.
template <typename T>
void naive_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const T* A,
                int64_t lda, const T* B, int64_t ldb, double beta, T* C, int64_t ldc) {
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k)
        s += double(ta ? A[k * lda + i] : A[i * lda + k]) *
             double(tb ? B[j * ldb + k] : B[k * ldb + j]);
      C[i * ldc + j] = T(alpha * s + (beta == 0 ? 0.0 : beta * double(C[i * ldc + j])));
    }
}

template <typename T>
void check_gemm_all_transposes(double tol) {
  const int64_t M = 7, N = 5, K = 6, pad = 3;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const int64_t lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
      const auto A = randn<T>((ta ? K : M) * lda, 1);
      const auto B = randn<T>((tb ? N : K) * ldb, 2);
      const auto C0 = randn<T>(M * ldc, 3);
      auto got = C0, want = C0;
      gemm<T>(ta, tb, M, N, K, T(0.75), A.data(), lda, B.data(), ldb, T(0.5), got.data(), ldc);
      naive_gemm<T>(ta, tb, M, N, K, 0.75, A.data(), lda, B.data(), ldb, 0.5, want.data(), ldc);
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < ldc; ++j)
          EXPECT_NEAR(got[i * ldc + j], want[i * ldc + j], tol)
              << "ta=" << ta << " tb=" << tb << " at " << i << "," << j;
      // beta = 0 must overwrite without reading C, even NaN.
      std::vector<T> nan_c(M * ldc, std::numeric_limits<T>::quiet_NaN());
      gemm<T>(ta, tb, M, N, K, T(1), A.data(), lda, B.data(), ldb, T(0), nan_c.data(), ldc);
      auto ref = C0;
      naive_gemm<T>(ta, tb, M, N, K, 1.0, A.data(), lda, B.data(), ldb, 0.0, ref.data(), ldc);
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) EXPECT_NEAR(nan_c[i * ldc + j], ref[i * ldc + j], tol);
    }
}

TEST(KernelsForward, GemmAllTransposesFloat) { check_gemm_all_transposes<float>(1e-5); }
TEST(KernelsForward, GemmAllTransposesDouble) { check_gemm_all_transposes<double>(1e-12); }

TEST(KernelsForward, GemmEmptyInnerDimensionScalesC) {
  std::vector<double> C = {1, 2, 3, 4};
  gemm<double>(false, false, 2, 2, 0, 1.0, nullptr, 1, nullptr, 2, 0.5, C.data(), 2);
  EXPECT_EQ(C, (std::vector<double>{0.5, 1, 1.5, 2}));
}

TEST(KernelsForward, GemmRejectsBadLeadingDimension) {
  std::vector<double> A(6), B(6), C(4);
  EXPECT_THROW(gemm<double>(false, false, 2, 2, 3, 1.0, A.data(), 2, B.data(), 2, 0.0, C.data(), 2),
               InternalError);
}

template <typename T>
void check_gemm_batched(bool ta, bool tb, int64_t batch, double tol) {
  const int64_t M = 4, N = 6, K = 5;
  const int64_t lda = ta ? M : K, ldb = tb ? K : N, ldc = N;
  const int64_t sa = M * K + 2, sb = K * N + 1, sc = M * N + 3;  // gaps between matrices
  const auto A = randn<T>(sa * batch, 7), B = randn<T>(sb * batch, 8);
  const auto C0 = randn<T>(sc * batch, 9);
  auto got = C0, want = C0;
  gemm_batched<T>(ta, tb, M, N, K, T(1.5), A.data(), lda, sa, B.data(), ldb, sb, T(0.25),
                  got.data(), ldc, sc, batch);
  for (int64_t i = 0; i < batch; ++i)
    naive_gemm<T>(ta, tb, M, N, K, 1.5, A.data() + i * sa, lda, B.data() + i * sb, ldb, 0.25,
                  want.data() + i * sc, ldc);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << "at " << i;
}

TEST(KernelsForward, GemmBatched) {
  for (int threads : {1, 2}) {
    ThreadGuard g(threads);
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (int64_t batch : {1, 3, 5}) {
          check_gemm_batched<double>(ta, tb, batch, 1e-12);
          check_gemm_batched<float>(ta, tb, batch, 1e-5);
        }
  }
}

// ---- Linear, softmax, LayerNorm, GELU ---------------------------------------------------

TEST(KernelsForward, LinearMatchesNaive) {
  const int64_t N = 9, in = 7, out = 5;
  const auto x = randn<double>(N * in, 1), w = randn<double>(out * in, 2),
             b = randn<double>(out, 3);
  std::vector<double> y(N * out), y_nob(N * out, std::numeric_limits<double>::quiet_NaN());
  linear_forward(x.data(), w.data(), b.data(), y.data(), N, in, out);
  linear_forward(x.data(), w.data(), (const double*)nullptr, y_nob.data(), N, in, out);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < out; ++o) {
      double s = 0;
      for (int64_t i = 0; i < in; ++i) s += x[n * in + i] * w[o * in + i];
      EXPECT_NEAR(y[n * out + o], s + b[o], 1e-12);
      EXPECT_NEAR(y_nob[n * out + o], s, 1e-12);
    }
}

TEST(KernelsForward, SoftmaxRowsSumToOneAndMatchNaive) {
  const int64_t rows = 6, cols = 13;
  auto x = randn<float>(rows * cols, 4, 3.0);
  x[0] = 1000.0f;  // would overflow exp without the max subtraction
  x[cols + 1] = -1000.0f;
  std::vector<float> y(rows * cols);
  softmax_forward(x.data(), y.data(), rows, cols);
  for (int64_t r = 0; r < rows; ++r) {
    double mx = -1e300, z = 0, sum = 0;
    for (int64_t c = 0; c < cols; ++c) mx = std::max(mx, double(x[r * cols + c]));
    for (int64_t c = 0; c < cols; ++c) z += std::exp(double(x[r * cols + c]) - mx);
    for (int64_t c = 0; c < cols; ++c) {
      const float v = y[r * cols + c];
      ASSERT_TRUE(std::isfinite(v));
      EXPECT_NEAR(v, std::exp(double(x[r * cols + c]) - mx) / z, 1e-6);
      sum += v;
    }
    EXPECT_NEAR(sum, 1.0, 1e-6) << "row " << r;
  }
  EXPECT_NEAR(y[0], 1.0f, 1e-6);
}

TEST(KernelsForward, LayerNormNormalisesRows) {
  const int64_t N = 5, C = 64;
  const double eps = 1e-5;
  const auto x = randn<double>(N * C, 5, 4.0);
  const std::vector<double> ones(C, 1.0), zeros(C, 0.0);
  std::vector<double> y(N * C), mean(N), rstd(N);
  layernorm_forward(x.data(), ones.data(), zeros.data(), y.data(), mean.data(), rstd.data(), N, C,
                    eps);
  for (int64_t n = 0; n < N; ++n) {
    double mu = 0, var = 0, ym = 0, yv = 0;
    for (int64_t c = 0; c < C; ++c) mu += x[n * C + c] / C;
    for (int64_t c = 0; c < C; ++c) var += (x[n * C + c] - mu) * (x[n * C + c] - mu) / C;
    for (int64_t c = 0; c < C; ++c) ym += y[n * C + c] / C;
    for (int64_t c = 0; c < C; ++c) yv += y[n * C + c] * y[n * C + c] / C;
    EXPECT_NEAR(mean[n], mu, 1e-12);
    EXPECT_NEAR(rstd[n], 1.0 / std::sqrt(var + eps), 1e-12);
    EXPECT_NEAR(ym, 0.0, 1e-12);
    EXPECT_NEAR(yv, var / (var + eps), 1e-12);  // biased variance, eps inside the sqrt
  }
  // Weight and bias apply per channel.
  const auto w = randn<double>(C, 6), b = randn<double>(C, 7);
  std::vector<double> y2(N * C);
  layernorm_forward(x.data(), w.data(), b.data(), y2.data(), mean.data(), rstd.data(), N, C, eps);
  for (int64_t i = 0; i < N * C; ++i) EXPECT_NEAR(y2[i], y[i] * w[i % C] + b[i % C], 1e-12);
}

TEST(KernelsForward, GeluTanhApproximation) {
  const std::vector<double> x = {-3.0, -1.0, -0.1, 0.0, 0.5, 1.0, 2.5};
  std::vector<double> y(x.size());
  gelu_forward(x.data(), y.data(), int64_t(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    const double v = x[i];
    const double want =
        0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
    EXPECT_NEAR(y[i], want, 1e-14);
  }
  EXPECT_EQ(y[3], 0.0);
  EXPECT_NEAR(y[5], 0.8411919906082768, 1e-12);  // torch gelu(1.0, approximate='tanh')
}

// The float kernels use a vectorised exp (core/cpu/vmath.h); over wide input ranges
// they must stay within a few float ulps of the double kernels.
TEST(KernelsForward, FloatExpPathAccurate) {
  std::vector<double> xd;
  for (double v = -30.0; v <= 30.0; v += 0.01) xd.push_back(v);
  const int64_t n = int64_t(xd.size());
  std::vector<float> xf(xd.begin(), xd.end()), yf(n), dxf(n), ones(n, 1.0f);
  std::vector<double> xr(xf.begin(), xf.end()), yd(n), dxd(n), onesd(n, 1.0);
  gelu_forward(xf.data(), yf.data(), n);
  gelu_forward(xr.data(), yd.data(), n);
  gelu_backward(ones.data(), xf.data(), dxf.data(), false, n);
  gelu_backward(onesd.data(), xr.data(), dxd.data(), false, n);
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_NEAR(yf[i], yd[i], 4e-7 * std::max(1.0, std::abs(yd[i]))) << "gelu at " << xr[i];
    EXPECT_NEAR(dxf[i], dxd[i], 1e-6) << "gelu' at " << xr[i];
  }
  // Softmax over a row spanning ~80 units of logit: every probability within 1e-6 relative
  // (tiny ones are allowed an absolute 1e-12).
  const int64_t cols = 4001;
  std::vector<float> row(cols), p(cols);
  for (int64_t c = 0; c < cols; ++c) row[c] = float(-60.0 + 0.02 * double(c));
  std::vector<double> rowd(row.begin(), row.end()), pd(cols);
  softmax_forward(row.data(), p.data(), 1, cols);
  softmax_forward(rowd.data(), pd.data(), 1, cols);
  for (int64_t c = 0; c < cols; ++c) EXPECT_NEAR(p[c], pd[c], 1e-6 * pd[c] + 1e-12) << c;
}

// A NaN anywhere in a row must show up in the output (training divergence stays visible).
TEST(KernelsForward, NaNPropagates) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> x = {0.5f, nan, -1.0f}, y(3);
  gelu_forward(x.data(), y.data(), 3);
  EXPECT_TRUE(std::isnan(y[1]));
  EXPECT_FALSE(std::isnan(y[0]));
  softmax_forward(x.data(), y.data(), 1, 3);
  EXPECT_TRUE(std::isnan(y[0]) && std::isnan(y[2]));
  std::vector<float> losses(1), probs(3);
  const std::vector<int32_t> target = {0};
  EXPECT_TRUE(std::isnan(
      cross_entropy_forward(x.data(), target.data(), losses.data(), probs.data(), 1, 3)));
}

// ---- Attention ----------------------------------------------------------------------

// Naive causal attention in double: out and the probabilities.
void naive_attention(const std::vector<double>& qkv, std::vector<double>& out,
                     std::vector<double>& att, int64_t B, int64_t Tn, int64_t C, int64_t H) {
  const int64_t hs = C / H;
  const double scale = 1.0 / std::sqrt(double(hs));
  out.assign(B * Tn * C, 0.0);
  att.assign(B * H * Tn * Tn, 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < Tn; ++t) {
        const double* q = &qkv[(b * Tn + t) * 3 * C + h * hs];
        double* a = &att[((b * H + h) * Tn + t) * Tn];
        double mx = -1e300, z = 0;
        for (int64_t s = 0; s <= t; ++s) {
          const double* k = &qkv[(b * Tn + s) * 3 * C + C + h * hs];
          double d = 0;
          for (int64_t i = 0; i < hs; ++i) d += q[i] * k[i];
          a[s] = d * scale;
          mx = std::max(mx, a[s]);
        }
        for (int64_t s = 0; s <= t; ++s) z += (a[s] = std::exp(a[s] - mx));
        for (int64_t s = 0; s <= t; ++s) a[s] /= z;
        for (int64_t s = 0; s <= t; ++s)
          for (int64_t i = 0; i < hs; ++i)
            out[(b * Tn + t) * C + h * hs + i] +=
                a[s] * qkv[(b * Tn + s) * 3 * C + 2 * C + h * hs + i];
      }
}

void check_attention_forward(int64_t B, int64_t Tn, int64_t C, int64_t H) {
  const auto qkv = randn<double>(B * Tn * 3 * C, 11);
  std::vector<double> out(B * Tn * C),
      att(B * H * Tn * Tn, std::numeric_limits<double>::quiet_NaN());
  attention_forward(qkv.data(), out.data(), att.data(), B, Tn, C, H);
  std::vector<double> want_out, want_att;
  naive_attention(qkv, want_out, want_att, B, Tn, C, H);
  for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], want_out[i], 1e-12) << "out " << i;
  for (int64_t bh = 0; bh < B * H; ++bh)
    for (int64_t t = 0; t < Tn; ++t) {
      double sum = 0;
      for (int64_t s = 0; s < Tn; ++s) {
        const double a = att[(bh * Tn + t) * Tn + s];
        if (s > t) {
          EXPECT_EQ(a, 0.0) << "above the diagonal at " << bh << "," << t << "," << s;
        }
        EXPECT_NEAR(a, want_att[(bh * Tn + t) * Tn + s], 1e-12);
        sum += a;
      }
      EXPECT_NEAR(sum, 1.0, 1e-12);
    }
}

TEST(KernelsForward, AttentionMatchesNaive) { check_attention_forward(2, 5, 8, 2); }
TEST(KernelsForward, AttentionMatchesNaiveAcrossBlocks) { check_attention_forward(2, 130, 12, 3); }

// Output at position t must not change when anything at positions > t changes.
TEST(KernelsForward, AttentionIsCausal) {
  const int64_t B = 2, Tn = 70, C = 8, H = 2;
  const auto qkv = randn<double>(B * Tn * 3 * C, 12);
  std::vector<double> out(B * Tn * C), att(B * H * Tn * Tn);
  attention_forward(qkv.data(), out.data(), att.data(), B, Tn, C, H);
  for (int64_t t : {0, 3, 63, 64, 68}) {
    auto changed = qkv;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t s = t + 1; s < Tn; ++s)
        for (int64_t i = 0; i < 3 * C; ++i) changed[(b * Tn + s) * 3 * C + i] += 5.0 + double(i);
    std::vector<double> out2(B * Tn * C), att2(B * H * Tn * Tn);
    attention_forward(changed.data(), out2.data(), att2.data(), B, Tn, C, H);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t s = 0; s <= t; ++s)
        for (int64_t i = 0; i < C; ++i)
          ASSERT_NEAR(out2[(b * Tn + s) * C + i], out[(b * Tn + s) * C + i], 1e-13)
              << "t=" << t << " s=" << s;
    if (t + 1 < Tn) {  // and the perturbation does reach the later positions
      double diff = 0;
      for (int64_t i = 0; i < C; ++i)
        diff += std::abs(out2[(t + 1) * C + i] - out[(t + 1) * C + i]);
      EXPECT_GT(diff, 1e-6);
    }
  }
}

TEST(KernelsForward, AttentionFloatCloseToDouble) {
  const int64_t B = 2, Tn = 100, C = 16, H = 4;
  const auto qkv = randn<double>(B * Tn * 3 * C, 13);
  std::vector<float> qkvf(qkv.begin(), qkv.end());
  std::vector<float> out(B * Tn * C), att(B * H * Tn * Tn);
  attention_forward(qkvf.data(), out.data(), att.data(), B, Tn, C, H);
  std::vector<double> want_out, want_att;
  naive_attention(std::vector<double>(qkvf.begin(), qkvf.end()), want_out, want_att, B, Tn, C, H);
  for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], want_out[i], 1e-5);
}

TEST(KernelsForward, AttentionRejectsIndivisibleHeads) {
  std::vector<double> qkv(3 * 9), out(9), att(1);
  EXPECT_THROW(attention_forward(qkv.data(), out.data(), att.data(), 1, 1, 9, 2), InternalError);
}

// ---- Embedding, cross-entropy -------------------------------------------------------

TEST(KernelsForward, EmbeddingMatchesNaiveAndChecksIds) {
  const int64_t B = 2, Tn = 3, C = 4, V = 5;
  const auto wte = randn<float>(V * C, 21), wpe = randn<float>(Tn * C, 22);
  std::vector<int32_t> tokens = {4, 0, 2, 2, 1, 4};
  std::vector<float> out(B * Tn * C);
  embedding_forward(tokens.data(), wte.data(), wpe.data(), out.data(), B, Tn, C, V);
  for (int64_t bt = 0; bt < B * Tn; ++bt)
    for (int64_t c = 0; c < C; ++c)
      EXPECT_EQ(out[bt * C + c], wte[tokens[bt] * C + c] + wpe[(bt % Tn) * C + c]);
  for (int32_t bad : {-1, 5, 1 << 30}) {
    auto t = tokens;
    t[4] = bad;
    EXPECT_THROW(embedding_forward(t.data(), wte.data(), wpe.data(), out.data(), B, Tn, C, V),
                 InternalError)
        << bad;
  }
  std::vector<float> dwte(V * C), dwpe(Tn * C);
  tokens[2] = -3;
  EXPECT_THROW(embedding_backward(out.data(), tokens.data(), dwte.data(), dwpe.data(), B, Tn, C),
               InternalError);
}

TEST(KernelsForward, CrossEntropyStableAndMatchesNaive) {
  const int64_t N = 4, V = 7;
  auto logits = randn<float>(N * V, 31, 2.0);
  for (int64_t j = 0; j < V; ++j) logits[V + j] += 500.0f;  // large but equal shift: same loss
  logits[2 * V + 3] = 1e4f;                                 // one dominant logit
  const std::vector<int32_t> targets = {1, 6, 3, 0};
  std::vector<float> losses(N), probs(N * V);
  const double mean =
      cross_entropy_forward(logits.data(), targets.data(), losses.data(), probs.data(), N, V);
  double total = 0;
  for (int64_t n = 0; n < N; ++n) {
    double mx = -1e300, z = 0;
    for (int64_t j = 0; j < V; ++j) mx = std::max(mx, double(logits[n * V + j]));
    for (int64_t j = 0; j < V; ++j) z += std::exp(double(logits[n * V + j]) - mx);
    const double want = mx + std::log(z) - double(logits[n * V + targets[n]]);
    ASSERT_TRUE(std::isfinite(losses[n]));
    EXPECT_NEAR(losses[n], want, 1e-5 * std::max(1.0, want));
    total += want;
    double psum = 0;
    for (int64_t j = 0; j < V; ++j) psum += probs[n * V + j];
    EXPECT_NEAR(psum, 1.0, 1e-6);
  }
  EXPECT_NEAR(losses[2], 0.0, 1e-6);  // the target holds the dominant logit
  EXPECT_NEAR(mean, total / N, 1e-6);
  auto bad = targets;
  bad[1] = 7;
  EXPECT_THROW(cross_entropy_forward(logits.data(), bad.data(), losses.data(), probs.data(), N, V),
               InternalError);
  std::vector<float> d(N * V);
  EXPECT_THROW(cross_entropy_backward(probs.data(), bad.data(), 1.0f, d.data(), false, N, V),
               InternalError);
}

// ---- Element-wise -------------------------------------------------------------------

TEST(KernelsForward, ElementWise) {
  const int64_t n = 1003;
  const auto a = randn<float>(n, 41), b = randn<float>(n, 42);
  std::vector<float> y(n), z = b;
  add(a.data(), b.data(), y.data(), n);
  axpy(2.5f, a.data(), z.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(y[i], a[i] + b[i]);
    EXPECT_FLOAT_EQ(z[i], b[i] + 2.5f * a[i]);
  }
  scale(-0.5f, y.data(), n);
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(y[i], -0.5f * (a[i] + b[i]));
}

}  // namespace
}  // namespace weft::core::cpu
