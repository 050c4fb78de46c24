// The Llama building blocks on CPU: RMSNorm, rotary embedding (rotate-half), grouped-query
// causal attention and the SiLU-gated product. Each forward against an independent
// computation (a direct loop, the reference's formula, GPT's attention on K and V
// repeated explicitly), each backward against central finite differences in double, and
// the accumulate flag (false overwrites a NaN buffer, true adds).
// The worst FD error of each check is recorded as a test property (--gtest_output=xml).
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "core/cpu/kernels.h"
#include "tests/core/grad_check.h"

namespace weft::core::cpu {
namespace {

using namespace gradcheck;

// Central differences with h = 1e-6 in double: truncation ~h^2 and rounding ~1e-16 / h,
// measured at 1e-10 .. 3e-9 relative here; a wrong term in a gradient is of order 1.
constexpr double kFdTol = 1e-7;

// Max abs difference relative to the largest expected magnitude (at least 1); NaN counts
// as the worst. Records the error under `what` and returns it.
double expect_close(const Vec& got, const Vec& want, double tol, const std::string& what) {
  EXPECT_EQ(got.size(), want.size()) << what;
  if (got.size() != want.size()) return kNaN;
  double scale = 1, worst = 0;
  size_t at = 0;
  for (double w : want) scale = std::max(scale, std::abs(w));
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = std::abs(got[i] - want[i]);
    if (!(d <= worst)) worst = d, at = i;
  }
  const double rel = worst / scale;
  EXPECT_LE(rel, tol) << what << ": element " << at << " got " << got[at] << " want " << want[at];
  char text[32];
  std::snprintf(text, sizeof text, "%.3g", rel);
  testing::Test::RecordProperty(what, text);
  return rel;
}

// backward(out, accumulate) into a NaN buffer with accumulate=false must give `want`;
// into a random buffer with accumulate=true, that buffer plus `want`.
void expect_accumulate_semantics(const std::function<void(double*, bool)>& backward,
                                 const Vec& want, const std::string& what) {
  Vec over(want.size(), kNaN);
  backward(over.data(), false);
  expect_close(over, want, 1e-12, what + " overwrite");
  const Vec prior = randn(want.size(), 99);
  Vec acc = prior;
  backward(acc.data(), true);
  expect_close(acc, plus(prior, want), 1e-12, what + " accumulate");
}

// ---- RMSNorm --------------------------------------------------------------------------

TEST(LlamaKernels, RmsNormMatchesDirectLoop) {
  const int64_t N = 7, C = 13;
  const double eps = 1e-5;
  const Vec x = randn(N * C, 1, 3.0), w = randn(C, 2);
  Vec y(N * C), rstd(N);
  rmsnorm_forward(x.data(), w.data(), y.data(), rstd.data(), N, C, eps);
  Vec want(N * C);
  for (int64_t n = 0; n < N; ++n) {
    double ms = 0;
    for (int64_t c = 0; c < C; ++c) ms += x[n * C + c] * x[n * C + c] / double(C);
    const double r = 1.0 / std::sqrt(ms + eps);
    EXPECT_NEAR(rstd[n], r, 1e-14 * r);
    for (int64_t c = 0; c < C; ++c) want[n * C + c] = x[n * C + c] * r * w[c];
  }
  expect_close(y, want, 1e-14, "rmsnorm y");
  // The float kernel stays within a few float ulps of the double result.
  const std::vector<float> xf(x.begin(), x.end()), wf(w.begin(), w.end());
  std::vector<float> yf(N * C), rf(N);
  rmsnorm_forward(xf.data(), wf.data(), yf.data(), rf.data(), N, C, 1e-5f);
  expect_close(Vec(yf.begin(), yf.end()), want, 1e-6, "rmsnorm y float");
}

TEST(LlamaKernels, RmsNormEpsDominatesNearZeroRows) {
  const int64_t C = 4;
  const Vec x(C, 0.0), w = {1, 2, 3, 4};
  Vec y(C, kNaN), rstd(1);
  rmsnorm_forward(x.data(), w.data(), y.data(), rstd.data(), 1, C, 1e-5);
  EXPECT_DOUBLE_EQ(rstd[0], 1.0 / std::sqrt(1e-5));
  for (double v : y) EXPECT_EQ(v, 0.0);
}

void check_rmsnorm_grad(int64_t N, int64_t C, uint64_t seed) {
  const double eps = 1e-5;
  Vec x = randn(N * C, seed), w = randn(C, seed + 1);
  const Vec R = randn(N * C, seed + 2);  // upstream gradient: loss = sum(y * R)
  auto loss = [&] {
    Vec y(N * C), r(N);
    rmsnorm_forward(x.data(), w.data(), y.data(), r.data(), N, C, eps);
    return dot(y, R);
  };
  Vec y(N * C), rstd(N);
  rmsnorm_forward(x.data(), w.data(), y.data(), rstd.data(), N, C, eps);
  Vec dx(N * C), dw_prior = randn(C, seed + 3), dw = dw_prior;
  rmsnorm_backward(R.data(), x.data(), w.data(), rstd.data(), dx.data(), false, dw.data(), N, C);
  const std::string tag = "rmsnorm N" + std::to_string(N) + " C" + std::to_string(C);
  expect_close(dx, numeric_grad(loss, x), kFdTol, tag + " dx");
  expect_close(dw, plus(dw_prior, numeric_grad(loss, w)), kFdTol, tag + " dw accumulates");
  expect_accumulate_semantics(
      [&](double* o, bool acc) {
        rmsnorm_backward(R.data(), x.data(), w.data(), rstd.data(), o, acc, nullptr, N, C);
      },
      dx, tag + " dx");
  // dx null: only the weight gradient.
  Vec dw2(C, 0.0);
  rmsnorm_backward<double>(R.data(), x.data(), w.data(), rstd.data(), nullptr, false, dw2.data(), N,
                           C);
  expect_close(dw2, numeric_grad(loss, w), kFdTol, tag + " dw with dx null");
}

TEST(LlamaKernels, RmsNormGrad) {
  check_rmsnorm_grad(10, 8, 11);
  check_rmsnorm_grad(3, 17, 12);
  check_rmsnorm_grad(1, 1, 13);
}

// ---- Rotary embedding -------------------------------------------------------------------

// The reference's formula for one (B,T,heads*hs) tensor: x * cos + rotate_half(x) * sin with
// rotate_half([a, b]) = [-b, a] and the angle of dimension d = t * theta^(-2 (d mod hs/2) / hs).
Vec rope_direct(const Vec& x, int64_t B, int64_t Tn, int64_t heads, int64_t hs, double theta) {
  const int64_t half = hs / 2;
  Vec y(x.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < Tn; ++t)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t d = 0; d < hs; ++d) {
          const int64_t base = ((b * Tn + t) * heads + h) * hs;
          const double inv = 1.0 / std::pow(theta, double(2 * (d % half)) / double(hs));
          const double ang = double(t) * inv;
          const double rh = d < half ? -x[base + d + half] : x[base + d - half];
          y[base + d] = x[base + d] * std::cos(ang) + rh * std::sin(ang);
        }
  return y;
}

TEST(LlamaKernels, RopeMatchesReferenceFormula) {
  struct Case {
    int64_t B, Tn, heads, hs;
    double theta;
  };
  for (const Case& c :
       {Case{2, 5, 3, 8, 10000.0}, Case{1, 33, 2, 2, 10000.0}, Case{2, 7, 1, 16, 500000.0}}) {
    const Vec x = randn(c.B * c.Tn * c.heads * c.hs, 21);
    Vec y(x.size(), kNaN);
    rope_forward(x.data(), y.data(), c.B, c.Tn, c.heads, c.hs, c.theta);
    const Vec want = rope_direct(x, c.B, c.Tn, c.heads, c.hs, c.theta);
    expect_close(y, want, 1e-15, "rope hs" + std::to_string(c.hs));
    // In place gives the same result.
    Vec inplace = x;
    rope_forward(inplace.data(), inplace.data(), c.B, c.Tn, c.heads, c.hs, c.theta);
    expect_close(inplace, y, 0, "rope in place");
  }
  // Position 0 is the identity; position 1 of a head of size 2 rotates its pair by 1 radian.
  const Vec x = {0.3, -1.2, 0.7, 2.0};  // T = 2, one head, hs = 2
  Vec y(4);
  rope_forward(x.data(), y.data(), 1, 2, 1, 2, 10000.0);
  EXPECT_EQ(y[0], x[0]);
  EXPECT_EQ(y[1], x[1]);
  EXPECT_NEAR(y[2], 0.7 * std::cos(1.0) - 2.0 * std::sin(1.0), 1e-15);
  EXPECT_NEAR(y[3], 2.0 * std::cos(1.0) + 0.7 * std::sin(1.0), 1e-15);
}

TEST(LlamaKernels, RopeFloatCloseToDouble) {
  const int64_t B = 1, Tn = 300, heads = 2, hs = 64;
  const Vec x = randn(B * Tn * heads * hs, 22);
  const std::vector<float> xf(x.begin(), x.end());
  std::vector<float> yf(xf.size());
  rope_forward(xf.data(), yf.data(), B, Tn, heads, hs, 10000.0);
  const Vec want = rope_direct(Vec(xf.begin(), xf.end()), B, Tn, heads, hs, 10000.0);
  expect_close(Vec(yf.begin(), yf.end()), want, 1e-6, "rope float");
}

TEST(LlamaKernels, RopeRejectsOddHeadSize) {
  Vec x(6), y(6);
  EXPECT_THROW(rope_forward(x.data(), y.data(), 1, 2, 1, 3, 10000.0), InternalError);
  EXPECT_THROW(rope_backward(x.data(), x.data(), true, 1, 3, 1, 2, 10000.0), InternalError);
}

TEST(LlamaKernels, RopeGrad) {
  for (const auto& [B, Tn, heads, hs] :
       {std::array<int64_t, 4>{2, 5, 3, 4}, std::array<int64_t, 4>{1, 9, 2, 8}}) {
    const double theta = 10000.0;
    Vec x = randn(B * Tn * heads * hs, 31);
    const Vec R = randn(x.size(), 32);
    auto loss = [&] {
      Vec y(x.size());
      rope_forward(x.data(), y.data(), B, Tn, heads, hs, theta);
      return dot(y, R);
    };
    Vec dx(x.size());
    rope_backward(R.data(), dx.data(), false, B, Tn, heads, hs, theta);
    const std::string tag = "rope T" + std::to_string(Tn) + " hs" + std::to_string(hs);
    expect_close(dx, numeric_grad(loss, x), kFdTol, tag + " dx");
    expect_accumulate_semantics(
        [&](double* o, bool acc) { rope_backward(R.data(), o, acc, B, Tn, heads, hs, theta); }, dx,
        tag + " dx");
  }
}

// ---- SiLU-gated product ------------------------------------------------------------------

TEST(LlamaKernels, SwigluMatchesFormulaAndSaturates) {
  const int64_t n = 37;
  Vec g = randn(n, 41, 3.0);
  const Vec u = randn(n, 42);
  g[0] = 0.0;
  Vec out(n, kNaN), want(n);
  swiglu_forward(g.data(), u.data(), out.data(), n);
  for (int64_t i = 0; i < n; ++i) want[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
  expect_close(out, want, 1e-15, "swiglu out");
  // Far into both tails: silu(g) -> g and -> 0, its slope -> 1 and -> 0, nothing NaN.
  const std::vector<float> gf = {-1000.f, -100.f, 100.f, 1000.f}, uf = {2.f, 2.f, 2.f, 2.f};
  std::vector<float> of(4), dg(4), du(4), ones(4, 1.f);
  swiglu_forward(gf.data(), uf.data(), of.data(), 4);
  swiglu_backward(ones.data(), gf.data(), uf.data(), dg.data(), du.data(), false, 4);
  for (int i = 0; i < 4; ++i) {
    const bool pos = gf[i] > 0;
    EXPECT_NEAR(of[i], pos ? 2 * gf[i] : 0.f, 1e-3f) << i;
    EXPECT_NEAR(dg[i], pos ? 2.f : 0.f, 1e-6f) << i;
    EXPECT_NEAR(du[i], pos ? gf[i] : 0.f, 1e-3f) << i;
  }
}

TEST(LlamaKernels, SwigluGrad) {
  const int64_t n = 53;
  Vec g = randn(n, 51, 2.5), u = randn(n, 52);
  g[0] = 0.0;
  const Vec R = randn(n, 53);
  auto loss = [&] {
    Vec out(n);
    swiglu_forward(g.data(), u.data(), out.data(), n);
    return dot(out, R);
  };
  Vec dg(n), du(n);
  swiglu_backward(R.data(), g.data(), u.data(), dg.data(), du.data(), false, n);
  expect_close(dg, numeric_grad(loss, g), kFdTol, "swiglu dgate");
  expect_close(du, numeric_grad(loss, u), kFdTol, "swiglu dup");
  // The flag applies to both outputs.
  expect_accumulate_semantics(
      [&](double* o, bool acc) {
        Vec other(n, acc ? 0.0 : kNaN);
        swiglu_backward(R.data(), g.data(), u.data(), o, other.data(), acc, n);
      },
      dg, "swiglu dgate");
  expect_accumulate_semantics(
      [&](double* o, bool acc) {
        Vec other(n, acc ? 0.0 : kNaN);
        swiglu_backward(R.data(), g.data(), u.data(), other.data(), o, acc, n);
      },
      du, "swiglu dup");
}

// ---- Grouped-query attention ---------------------------------------------------------------

struct GqaShape {
  int64_t B, Tn, H, KV, hs;
  std::string tag() const {
    return "gqa B" + std::to_string(B) + " T" + std::to_string(Tn) + " H" + std::to_string(H) +
           " KV" + std::to_string(KV) + " hs" + std::to_string(hs);
  }
};

// Shapes: groups of 2, 3 and 4 query heads (4 = one KV head), KV = H, odd sequence lengths,
// and T = 67 across the kernel's 64-row blocks.
const std::vector<GqaShape> kGqaShapes = {
    {2, 5, 4, 2, 4}, {1, 7, 6, 2, 6}, {2, 3, 3, 3, 2}, {1, 9, 4, 1, 4}, {1, 67, 4, 2, 2}};

// GPT's fused qkv (B,T,3C), C = H*hs, with KV head h / (H/KV) copied into head h of k and v.
Vec repeat_into_qkv(const Vec& q, const Vec& k, const Vec& v, const GqaShape& s) {
  const int64_t C = s.H * s.hs, group = s.H / s.KV;
  Vec qkv(s.B * s.Tn * 3 * C);
  for (int64_t row = 0; row < s.B * s.Tn; ++row)
    for (int64_t h = 0; h < s.H; ++h)
      for (int64_t i = 0; i < s.hs; ++i) {
        const int64_t kv = (row * s.KV + h / group) * s.hs + i;
        qkv[row * 3 * C + h * s.hs + i] = q[(row * s.H + h) * s.hs + i];
        qkv[row * 3 * C + C + h * s.hs + i] = k[kv];
        qkv[row * 3 * C + 2 * C + h * s.hs + i] = v[kv];
      }
  return qkv;
}

TEST(LlamaKernels, GqaEqualsGptAttentionOnRepeatedKv) {
  for (const GqaShape& s : kGqaShapes) {
    const int64_t C = s.H * s.hs, group = s.H / s.KV;
    const Vec q = randn(s.B * s.Tn * C, 61), k = randn(s.B * s.Tn * s.KV * s.hs, 62),
              v = randn(s.B * s.Tn * s.KV * s.hs, 63), dout = randn(s.B * s.Tn * C, 64);
    Vec out(s.B * s.Tn * C, kNaN), att(s.B * s.H * s.Tn * s.Tn, kNaN);
    gqa_attention_forward(q.data(), k.data(), v.data(), out.data(), att.data(), s.B, s.Tn, s.H,
                          s.KV, s.hs);
    const Vec qkv = repeat_into_qkv(q, k, v, s);
    Vec want_out(out.size()), want_att(att.size());
    attention_forward(qkv.data(), want_out.data(), want_att.data(), s.B, s.Tn, C, s.H);
    expect_close(out, want_out, 1e-14, s.tag() + " out");
    expect_close(att, want_att, 1e-14, s.tag() + " att");

    // Backward: dq as GPT's; dk and dv of a KV head sum GPT's over its query heads.
    Vec dq(q.size(), kNaN), dk(k.size(), kNaN), dv(v.size(), kNaN);
    gqa_attention_backward(dout.data(), q.data(), k.data(), v.data(), att.data(), dq.data(),
                           dk.data(), dv.data(), false, s.B, s.Tn, s.H, s.KV, s.hs);
    Vec dqkv(qkv.size());
    attention_backward(dout.data(), qkv.data(), want_att.data(), dqkv.data(), false, s.B, s.Tn, C,
                       s.H);
    Vec want_dq(dq.size()), want_dk(dk.size(), 0.0), want_dv(dv.size(), 0.0);
    for (int64_t row = 0; row < s.B * s.Tn; ++row)
      for (int64_t h = 0; h < s.H; ++h)
        for (int64_t i = 0; i < s.hs; ++i) {
          const int64_t kv = (row * s.KV + h / group) * s.hs + i;
          want_dq[(row * s.H + h) * s.hs + i] = dqkv[row * 3 * C + h * s.hs + i];
          want_dk[kv] += dqkv[row * 3 * C + C + h * s.hs + i];
          want_dv[kv] += dqkv[row * 3 * C + 2 * C + h * s.hs + i];
        }
    expect_close(dq, want_dq, 1e-13, s.tag() + " dq");
    expect_close(dk, want_dk, 1e-13, s.tag() + " dk");
    expect_close(dv, want_dv, 1e-13, s.tag() + " dv");
  }
}

TEST(LlamaKernels, GqaGrad) {
  for (const GqaShape& s : kGqaShapes) {
    Vec q = randn(s.B * s.Tn * s.H * s.hs, 71), k = randn(s.B * s.Tn * s.KV * s.hs, 72),
        v = randn(s.B * s.Tn * s.KV * s.hs, 73);
    const Vec R = randn(q.size(), 74);
    auto loss = [&] {
      Vec out(q.size()), att(s.B * s.H * s.Tn * s.Tn);
      gqa_attention_forward(q.data(), k.data(), v.data(), out.data(), att.data(), s.B, s.Tn, s.H,
                            s.KV, s.hs);
      return dot(out, R);
    };
    Vec out(q.size()), att(s.B * s.H * s.Tn * s.Tn), dq(q.size()), dk(k.size()), dv(v.size());
    gqa_attention_forward(q.data(), k.data(), v.data(), out.data(), att.data(), s.B, s.Tn, s.H,
                          s.KV, s.hs);
    gqa_attention_backward(R.data(), q.data(), k.data(), v.data(), att.data(), dq.data(), dk.data(),
                           dv.data(), false, s.B, s.Tn, s.H, s.KV, s.hs);
    expect_close(dq, numeric_grad(loss, q), kFdTol, s.tag() + " dq");
    expect_close(dk, numeric_grad(loss, k), kFdTol, s.tag() + " dk");
    expect_close(dv, numeric_grad(loss, v), kFdTol, s.tag() + " dv");
    // The flag covers all three gradients, dk and dv included (their group sum starts from
    // the prior contents, not from zero).
    auto run = [&](double* gq, double* gk, double* gv, bool acc) {
      gqa_attention_backward(R.data(), q.data(), k.data(), v.data(), att.data(), gq, gk, gv, acc,
                             s.B, s.Tn, s.H, s.KV, s.hs);
    };
    expect_accumulate_semantics(
        [&](double* o, bool acc) {
          Vec gk(k.size(), 0.0), gv(v.size(), 0.0);
          run(o, gk.data(), gv.data(), acc);
        },
        dq, s.tag() + " dq");
    expect_accumulate_semantics(
        [&](double* o, bool acc) {
          Vec gq(q.size(), 0.0), gv(v.size(), 0.0);
          run(gq.data(), o, gv.data(), acc);
        },
        dk, s.tag() + " dk");
    expect_accumulate_semantics(
        [&](double* o, bool acc) {
          Vec gq(q.size(), 0.0), gk(k.size(), 0.0);
          run(gq.data(), gk.data(), o, acc);
        },
        dv, s.tag() + " dv");
  }
}

TEST(LlamaKernels, GqaRejectsIndivisibleHeads) {
  Vec q(4 * 2), k(3 * 2), v(3 * 2), out(4 * 2), att(4);
  EXPECT_THROW(
      gqa_attention_forward(q.data(), k.data(), v.data(), out.data(), att.data(), 1, 1, 4, 3, 2),
      InternalError);
  EXPECT_THROW(gqa_attention_backward(out.data(), q.data(), k.data(), v.data(), att.data(),
                                      q.data(), k.data(), v.data(), false, 1, 1, 4, 0, 2),
               InternalError);
}

}  // namespace
}  // namespace weft::core::cpu
