// Thread-count behaviour of the CPU kernels. Reductions (sum of squares for the
// gradient norm; bias, LayerNorm and embedding gradients) must give the same bits for
// 1 and 2 threads, and the row-parallel kernels must give the same bits as their
// one-thread run (sizes here are above the kernels' parallel cut-off).
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "base/error.h"
#include "core/cpu/kernels.h"

namespace weft::core::cpu {
namespace {

template <typename T>
std::vector<T> randn(size_t n, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> d(0.0, 1.0);
  std::vector<T> v(n);
  for (T& x : v) x = T(d(gen));
  return v;
}

class ThreadGuard {
 public:
  explicit ThreadGuard(int n) : saved_(num_threads()) { set_num_threads(n); }
  ~ThreadGuard() { set_num_threads(saved_); }

 private:
  int saved_;
};

template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// Runs `produce` with 1 and with 2 threads; every returned buffer must match bitwise.
void expect_same_bits_1_and_2(const std::function<std::vector<std::vector<float>>()>& produce) {
  std::vector<std::vector<float>> one, two;
  {
    ThreadGuard g(1);
    one = produce();
  }
  {
    ThreadGuard g(2);
    two = produce();
  }
  ASSERT_EQ(one.size(), two.size());
  for (size_t i = 0; i < one.size(); ++i) EXPECT_TRUE(same_bits(one[i], two[i])) << "buffer " << i;
}

TEST(KernelsThreads, SumSquaresSameBitsForOneAndTwoThreads) {
  const int64_t n = 100003;  // several reduction blocks and a partial one
  const auto xf = randn<float>(n, 1);
  const auto xd = randn<double>(n, 2);
  double f1, f2, d1, d2;
  {
    ThreadGuard g(1);
    f1 = sum_squares(xf.data(), n);
    d1 = sum_squares(xd.data(), n);
  }
  {
    ThreadGuard g(2);
    f2 = sum_squares(xf.data(), n);
    d2 = sum_squares(xd.data(), n);
  }
  EXPECT_EQ(std::memcmp(&f1, &f2, sizeof f1), 0) << f1 << " vs " << f2;
  EXPECT_EQ(std::memcmp(&d1, &d2, sizeof d1), 0) << d1 << " vs " << d2;
  double want = 0;
  for (float v : xf) want += double(v) * double(v);
  EXPECT_NEAR(f1, want, 1e-10 * want);
  EXPECT_EQ(sum_squares(xf.data(), 0), 0.0);
  const std::vector<float> three = {1.0f, -2.0f, 2.0f};
  EXPECT_EQ(sum_squares(three.data(), 3), 9.0);
}

// The gradient reductions over rows are owned per column, so the bits do not depend on
// how many threads ran them.
TEST(KernelsThreads, ColumnReductionsSameBitsForOneAndTwoThreads) {
  const int64_t N = 513, C = 100, V = 13;
  const auto dy = randn<float>(N * C, 3), x = randn<float>(N * C, 4), w = randn<float>(C, 5),
             b = randn<float>(C, 6);
  std::vector<int32_t> tokens(N);
  for (int64_t i = 0; i < N; ++i) tokens[i] = int32_t((i * 7) % V);
  std::vector<float> db_one;
  expect_same_bits_1_and_2([&] {
    std::vector<float> db(C, 0.f), dw(C * C, 0.f), y(N * C), mean(N), rstd(N), lw(C, 0.f),
        lb(C, 0.f), dwte(V * C, 0.f), dwpe(N * C, 0.f);
    linear_backward<float>(dy.data(), x.data(), nullptr, nullptr, false, nullptr, db.data(), N, C,
                           C);
    layernorm_forward(x.data(), w.data(), b.data(), y.data(), mean.data(), rstd.data(), N, C,
                      1e-5f);
    layernorm_backward<float>(dy.data(), x.data(), w.data(), mean.data(), rstd.data(), nullptr,
                              false, lw.data(), lb.data(), N, C);
    embedding_backward(dy.data(), tokens.data(), dwte.data(), dwpe.data(), 1, N, C);
    db_one = db;
    return std::vector<std::vector<float>>{db, lw, lb, dwte, dwpe};
  });
  // And the bias gradient is the column sum it claims to be.
  for (int64_t c = 0; c < C; ++c) {
    double s = 0;
    for (int64_t n = 0; n < N; ++n) s += dy[n * C + c];
    EXPECT_NEAR(db_one[c], s, 1e-4);
  }
}

TEST(KernelsThreads, RowKernelsSameBitsForOneAndTwoThreads) {
  const int64_t N = 300, C = 128, V = 200;
  const auto x = randn<float>(N * C, 7), dy = randn<float>(N * C, 8), w = randn<float>(C, 9),
             b = randn<float>(C, 10), logits = randn<float>(N * V, 11);
  std::vector<int32_t> targets(N);
  for (int64_t i = 0; i < N; ++i) targets[i] = int32_t((i * 31) % V);
  expect_same_bits_1_and_2([&] {
    std::vector<float> y(N * C), mean(N), rstd(N), dx(N * C), g(N * C), dg(N * C), s(N * C),
        ds(N * C), probs(N * V), losses(N), dl(N * V);
    layernorm_forward(x.data(), w.data(), b.data(), y.data(), mean.data(), rstd.data(), N, C,
                      1e-5f);
    layernorm_backward<float>(dy.data(), x.data(), w.data(), mean.data(), rstd.data(), dx.data(),
                              false, nullptr, nullptr, N, C);
    gelu_forward(x.data(), g.data(), N * C);
    gelu_backward(dy.data(), x.data(), dg.data(), false, N * C);
    softmax_forward(x.data(), s.data(), N, C);
    softmax_backward(dy.data(), s.data(), ds.data(), false, N, C);
    const double mean_loss =
        cross_entropy_forward(logits.data(), targets.data(), losses.data(), probs.data(), N, V);
    cross_entropy_backward(probs.data(), targets.data(), 1.0f / N, dl.data(), false, N, V);
    return std::vector<std::vector<float>>{y, mean, rstd,  dx,     g,  dg,
                                           s, ds,   probs, losses, dl, {float(mean_loss)}};
  });
}

TEST(KernelsThreads, AttentionSameBitsForOneAndTwoThreads) {
  const int64_t B = 2, Tn = 80, C = 32, H = 4;
  const auto qkv = randn<float>(B * Tn * 3 * C, 12), dout = randn<float>(B * Tn * C, 13);
  expect_same_bits_1_and_2([&] {
    std::vector<float> out(B * Tn * C), att(B * H * Tn * Tn), dqkv(B * Tn * 3 * C);
    attention_forward(qkv.data(), out.data(), att.data(), B, Tn, C, H);
    attention_backward(dout.data(), qkv.data(), att.data(), dqkv.data(), false, B, Tn, C, H);
    return std::vector<std::vector<float>>{out, att, dqkv};
  });
}

// Grouped-query attention sums dk and dv over the query heads of a group inside one thread;
// the Llama point-wise kernels and RMSNorm's weight gradient (a column reduction) must not
// depend on the thread count either.
TEST(KernelsThreads, LlamaKernelsSameBitsForOneAndTwoThreads) {
  const int64_t B = 2, Tn = 80, H = 4, KV = 2, hs = 8, N = B * Tn, C = 256;
  const auto q = randn<float>(N * H * hs, 21), k = randn<float>(N * KV * hs, 22),
             v = randn<float>(N * KV * hs, 23), dout = randn<float>(N * H * hs, 24);
  const auto x = randn<float>(N * C, 25), w = randn<float>(C, 26), dy = randn<float>(N * C, 27);
  expect_same_bits_1_and_2([&] {
    std::vector<float> out(N * H * hs), att(B * H * Tn * Tn), dq(q.size()), dk(k.size()),
        dv(v.size());
    gqa_attention_forward(q.data(), k.data(), v.data(), out.data(), att.data(), B, Tn, H, KV, hs);
    gqa_attention_backward(dout.data(), q.data(), k.data(), v.data(), att.data(), dq.data(),
                           dk.data(), dv.data(), false, B, Tn, H, KV, hs);
    std::vector<float> y(N * C), rstd(N), dx(N * C), dw(C, 0.f);
    rmsnorm_forward(x.data(), w.data(), y.data(), rstd.data(), N, C, 1e-5f);
    rmsnorm_backward(dy.data(), x.data(), w.data(), rstd.data(), dx.data(), false, dw.data(), N, C);
    std::vector<float> r(N * C), dr(N * C), s(N * C), dg(N * C), du(N * C);
    rope_forward(x.data(), r.data(), B, Tn, C / 64, 64, 10000.0);
    rope_backward(dy.data(), dr.data(), false, B, Tn, C / 64, 64, 10000.0);
    swiglu_forward(x.data(), dy.data(), s.data(), N * C);
    swiglu_backward(y.data(), x.data(), dy.data(), dg.data(), du.data(), false, N * C);
    return std::vector<std::vector<float>>{out, att, dq, dk, dv, y, rstd, dx, dw,
                                           r,   dr,  s,  dg, du};
  });
}

TEST(KernelsThreads, SetNumThreads) {
  const int saved = num_threads();
  set_num_threads(2);
  EXPECT_EQ(num_threads(), 2);
  set_num_threads(0);  // keeps the current setting
  EXPECT_EQ(num_threads(), 2);
  set_num_threads(saved);
  EXPECT_EQ(num_threads(), saved);
  EXPECT_THROW(set_num_threads(-1), InternalError);
}

}  // namespace
}  // namespace weft::core::cpu
