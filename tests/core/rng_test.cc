// Philox4x32-10 against the Random123 known-answer vectors, and the draws built on it:
// deterministic, a function of the index alone, with the right moments.
#include "core/rng.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>

namespace weft::core {
namespace {

TEST(Rng, PhiloxKnownAnswers) {
  // Random123 kat_vectors, philox4x32 with 10 rounds.
  EXPECT_EQ(philox4x32({0, 0, 0, 0}, {0, 0}),
            (PhiloxCounter{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(philox4x32({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}),
            (PhiloxCounter{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(philox4x32({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}),
            (PhiloxCounter{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

TEST(Rng, StableHashIsFnv1a) {
  EXPECT_EQ(stable_hash(""), 14695981039346656037ull);
  EXPECT_EQ(stable_hash("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_NE(stable_hash("h.0.attn.qkv.weight"), stable_hash("h.1.attn.qkv.weight"));
}

TEST(Rng, DeterministicAndIndexAddressed) {
  CounterRng a(1234, stable_hash("wte.weight")), b(1234, stable_hash("wte.weight"));
  std::vector<uint32_t> forward;
  for (uint64_t i = 0; i < 64; ++i) forward.push_back(a.u32(i));
  // Same values drawn in reverse order, from another instance: only the index matters.
  for (uint64_t i = 64; i-- > 0;) EXPECT_EQ(b.u32(i), forward[i]) << i;
  for (uint64_t i : {0ull, 5ull, 1ull << 40}) {
    EXPECT_EQ(a.normal(i), b.normal(i));
    EXPECT_EQ(a.uniform(i), b.uniform(i));
  }
  // Another seed or stream gives another sequence.
  CounterRng other_seed(1235, stable_hash("wte.weight")),
      other_stream(1234, stable_hash("wpe.weight"));
  int same_seed = 0, same_stream = 0;
  for (uint64_t i = 0; i < 64; ++i) {
    same_seed += other_seed.u32(i) == forward[i];
    same_stream += other_stream.u32(i) == forward[i];
  }
  EXPECT_LE(same_seed, 1);
  EXPECT_LE(same_stream, 1);
  // Streams that differ only in the high 32 bits are distinct too.
  CounterRng lo(7, 1), hi(7, 1 | (1ull << 32));
  EXPECT_NE(lo.u32(0), hi.u32(0));
  // Indices beyond 2^32 words are distinct from the low ones.
  std::set<uint32_t> seen;
  for (uint64_t i : {0ull, 1ull << 32, 1ull << 34, 1ull << 40}) seen.insert(a.u32(i));
  EXPECT_EQ(seen.size(), 4u);
}

TEST(Rng, UniformAndNormalMoments) {
  CounterRng r(42, 7);
  const int n = 100000;
  double su = 0, sn = 0, sn2 = 0;
  float umin = 1, umax = 0;
  for (int i = 0; i < n; ++i) {
    const float u = r.uniform(uint64_t(i));
    umin = std::min(umin, u);
    umax = std::max(umax, u);
    su += u;
    const double z = r.normal(uint64_t(i));
    ASSERT_TRUE(std::isfinite(z));
    sn += z;
    sn2 += z * z;
  }
  EXPECT_GE(umin, 0.0f);
  EXPECT_LT(umax, 1.0f);
  EXPECT_NEAR(su / n, 0.5, 0.005);  // sd of the mean: 0.29 / sqrt(1e5) ~ 0.001
  const double mean = sn / n, var = sn2 / n - mean * mean;
  EXPECT_NEAR(mean, 0.0, 0.015);  // sd of the mean ~ 0.003
  EXPECT_NEAR(var, 1.0, 0.03);    // sd of the variance ~ 0.0045
}

}  // namespace
}  // namespace weft::core
