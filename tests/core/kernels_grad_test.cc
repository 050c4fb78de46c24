// Every backward CPU kernel against central finite differences of its forward, in
// double precision, on small random shapes; and the accumulate flag: true adds into
// the output, false overwrites it (checked against a NaN-filled buffer).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "core/cpu/kernels.h"
#include "tests/core/grad_check.h"

namespace weft::core::cpu {
namespace {

using namespace gradcheck;

// Max abs difference, relative to the size of the expected values (at least 1).
void expect_close(const Vec& got, const Vec& want, double tol, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 1, worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < want.size(); ++i) scale = std::max(scale, std::abs(want[i]));
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = std::abs(got[i] - want[i]);
    if (!(d <= worst)) worst = d, at = i;  // NaN counts as the worst
  }
  EXPECT_LE(worst / scale, tol) << what << ": element " << at << " got " << got[at] << " want "
                                << want[at];
}

// Runs `backward(out, accumulate)` twice: into a NaN buffer with accumulate=false (must
// equal `want`, no NaN left) and into a random buffer with accumulate=true (must equal
// that buffer plus `want`).
void expect_accumulate_semantics(const std::function<void(double*, bool)>& backward,
                                 const Vec& want, const char* what) {
  Vec over(want.size(), kNaN);
  backward(over.data(), false);
  expect_close(over, want, 1e-12, what);
  const Vec prior = randn(want.size(), 99);
  Vec acc = prior;
  backward(acc.data(), true);
  expect_close(acc, plus(prior, want), 1e-12, what);
}

constexpr double kTol = 1e-6;  // FD truncation (h^2) and rounding (eps/h) both ~1e-9 here

TEST(KernelsGrad, Linear) {
  const int64_t N = 6, in = 5, out = 4;
  Vec x = randn(N * in, 1), w = randn(out * in, 2), b = randn(out, 3);
  const Vec R = randn(N * out, 4);  // upstream gradient: loss = sum(y * R)
  auto loss = [&] {
    Vec y(N * out);
    linear_forward(x.data(), w.data(), b.data(), y.data(), N, in, out);
    return dot(y, R);
  };
  Vec dx(N * in), dw_prior = randn(out * in, 5), db_prior = randn(out, 6);
  Vec dw = dw_prior, db = db_prior;
  linear_backward(R.data(), x.data(), w.data(), dx.data(), false, dw.data(), db.data(), N, in, out);
  expect_close(dx, numeric_grad(loss, x), kTol, "dx");
  expect_close(dw, plus(dw_prior, numeric_grad(loss, w)), kTol, "dw accumulates");
  expect_close(db, plus(db_prior, numeric_grad(loss, b)), kTol, "db accumulates");

  const Vec want_dx = dx;
  expect_accumulate_semantics(
      [&](double* o, bool acc) {
        Vec dw2(out * in, 0.0);
        linear_backward(R.data(), x.data(), w.data(), o, acc, dw2.data(), nullptr, N, in, out);
      },
      want_dx, "linear dx");
  // dx null skips the input gradient; dw still right.
  Vec dw3(out * in, 0.0);
  linear_backward(R.data(), x.data(), w.data(), nullptr, false, dw3.data(), nullptr, N, in, out);
  expect_close(dw3, numeric_grad(loss, w), kTol, "dw with dx null");
}

TEST(KernelsGrad, LayerNorm) {
  const int64_t N = 10, C = 8;
  const double eps = 1e-5;
  Vec x = randn(N * C, 11), w = randn(C, 12), b = randn(C, 13);
  const Vec R = randn(N * C, 14);
  Vec mean(N), rstd(N);
  auto loss = [&] {
    Vec y(N * C), m(N), r(N);
    layernorm_forward(x.data(), w.data(), b.data(), y.data(), m.data(), r.data(), N, C, eps);
    return dot(y, R);
  };
  Vec y(N * C);
  layernorm_forward(x.data(), w.data(), b.data(), y.data(), mean.data(), rstd.data(), N, C, eps);
  Vec dx(N * C), dw_prior = randn(C, 15), db_prior = randn(C, 16);
  Vec dw = dw_prior, db = db_prior;
  layernorm_backward(R.data(), x.data(), w.data(), mean.data(), rstd.data(), dx.data(), false,
                     dw.data(), db.data(), N, C);
  expect_close(dx, numeric_grad(loss, x), kTol, "dx");
  expect_close(dw, plus(dw_prior, numeric_grad(loss, w)), kTol, "dw accumulates");
  expect_close(db, plus(db_prior, numeric_grad(loss, b)), kTol, "db accumulates");
  expect_accumulate_semantics(
      [&](double* o, bool acc) {
        layernorm_backward(R.data(), x.data(), w.data(), mean.data(), rstd.data(), o, acc, nullptr,
                           nullptr, N, C);
      },
      dx, "layernorm dx");
}

TEST(KernelsGrad, Gelu) {
  const int64_t n = 41;
  Vec x = randn(n, 21, 2.0);
  x[0] = 0.0;
  const Vec R = randn(n, 22);
  auto loss = [&] {
    Vec y(n);
    gelu_forward(x.data(), y.data(), n);
    return dot(y, R);
  };
  Vec dx(n);
  gelu_backward(R.data(), x.data(), dx.data(), false, n);
  expect_close(dx, numeric_grad(loss, x), kTol, "dx");
  expect_accumulate_semantics(
      [&](double* o, bool acc) { gelu_backward(R.data(), x.data(), o, acc, n); }, dx, "gelu dx");
}

TEST(KernelsGrad, Softmax) {
  const int64_t rows = 5, cols = 11;
  Vec x = randn(rows * cols, 31, 2.0);
  const Vec R = randn(rows * cols, 32);
  auto loss = [&] {
    Vec y(rows * cols);
    softmax_forward(x.data(), y.data(), rows, cols);
    return dot(y, R);
  };
  Vec y(rows * cols), dx(rows * cols);
  softmax_forward(x.data(), y.data(), rows, cols);
  softmax_backward(R.data(), y.data(), dx.data(), false, rows, cols);
  expect_close(dx, numeric_grad(loss, x), kTol, "dx");
  expect_accumulate_semantics(
      [&](double* o, bool acc) { softmax_backward(R.data(), y.data(), o, acc, rows, cols); }, dx,
      "softmax dx");
}

void check_attention_grad(int64_t B, int64_t Tn, int64_t C, int64_t H, uint64_t seed) {
  Vec qkv = randn(B * Tn * 3 * C, seed);
  const Vec R = randn(B * Tn * C, seed + 1);
  auto loss = [&] {
    Vec out(B * Tn * C), att(B * H * Tn * Tn);
    attention_forward(qkv.data(), out.data(), att.data(), B, Tn, C, H);
    return dot(out, R);
  };
  Vec out(B * Tn * C), att(B * H * Tn * Tn), dqkv(qkv.size());
  attention_forward(qkv.data(), out.data(), att.data(), B, Tn, C, H);
  attention_backward(R.data(), qkv.data(), att.data(), dqkv.data(), false, B, Tn, C, H);
  expect_close(dqkv, numeric_grad(loss, qkv), kTol, "dqkv");
  expect_accumulate_semantics(
      [&](double* o, bool acc) {
        attention_backward(R.data(), qkv.data(), att.data(), o, acc, B, Tn, C, H);
      },
      dqkv, "attention dqkv");
}

TEST(KernelsGrad, Attention) { check_attention_grad(2, 5, 8, 2, 41); }

// T = 70 crosses the kernel's 64-row block boundary (partial second block).
TEST(KernelsGrad, AttentionAcrossBlocks) { check_attention_grad(1, 70, 4, 2, 43); }

TEST(KernelsGrad, Embedding) {
  const int64_t B = 2, Tn = 5, C = 8, V = 11;
  const std::vector<int32_t> tokens = {3, 7, 3, 0, 10, 7, 7, 1, 3, 5};  // repeats on purpose
  Vec wte = randn(V * C, 51), wpe = randn(Tn * C, 52);
  const Vec R = randn(B * Tn * C, 53);
  auto loss = [&] {
    Vec out(B * Tn * C);
    embedding_forward(tokens.data(), wte.data(), wpe.data(), out.data(), B, Tn, C, V);
    return dot(out, R);
  };
  Vec dwte_prior = randn(V * C, 54), dwpe_prior = randn(Tn * C, 55);
  Vec dwte = dwte_prior, dwpe = dwpe_prior;
  embedding_backward(R.data(), tokens.data(), dwte.data(), dwpe.data(), B, Tn, C);
  expect_close(dwte, plus(dwte_prior, numeric_grad(loss, wte)), kTol, "dwte accumulates");
  expect_close(dwpe, plus(dwpe_prior, numeric_grad(loss, wpe)), kTol, "dwpe accumulates");
  // dwpe null: only the token table.
  Vec dwte2(V * C, 0.0);
  embedding_backward(R.data(), tokens.data(), dwte2.data(), nullptr, B, Tn, C);
  expect_close(dwte2, numeric_grad(loss, wte), kTol, "dwte with dwpe null");
  // dwte null: only the position table.
  Vec dwpe2(Tn * C, 0.0);
  embedding_backward<double>(R.data(), tokens.data(), nullptr, dwpe2.data(), B, Tn, C);
  expect_close(dwpe2, numeric_grad(loss, wpe), kTol, "dwpe with dwte null");
}

TEST(KernelsGrad, CrossEntropy) {
  const int64_t N = 10, V = 11;
  Vec logits = randn(N * V, 61, 3.0);
  const std::vector<int32_t> targets = {0, 10, 3, 3, 5, 9, 1, 2, 10, 4};
  const double dloss = 1.0 / double(N);  // gradient of the mean
  auto loss = [&] {
    Vec l(N);
    cross_entropy_forward(logits.data(), targets.data(), l.data(), (double*)nullptr, N, V);
    double s = 0;
    for (double v : l) s += v * dloss;
    return s;
  };
  Vec probs(N * V), losses(N), dlogits(N * V);
  const double mean =
      cross_entropy_forward(logits.data(), targets.data(), losses.data(), probs.data(), N, V);
  EXPECT_NEAR(mean, loss(), 1e-14);
  cross_entropy_backward(probs.data(), targets.data(), dloss, dlogits.data(), false, N, V);
  expect_close(dlogits, numeric_grad(loss, logits), kTol, "dlogits");
  expect_accumulate_semantics(
      [&](double* o, bool acc) {
        cross_entropy_backward(probs.data(), targets.data(), dloss, o, acc, N, V);
      },
      dlogits, "cross-entropy dlogits");
}

}  // namespace
}  // namespace weft::core::cpu
