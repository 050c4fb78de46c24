// The erasure code against a reference written here from first principles: GF(2^8) with
// ISA-L's polynomial 0x11d, the Cauchy matrix as gf_gen_cauchy1_matrix documents it, and
// Gaussian elimination of our own. Encode must match it byte for byte; every erasure
// pattern up to m must rebuild the original bytes; more is refused.
#include "checkpoint/erasure_code.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "base/config.h"
#include "base/error.h"

namespace weft::checkpoint {
namespace {

// ---- The reference: byte-at-a-time GF(2^8), x^8 + x^4 + x^3 + x^2 + 1 (0x11d). ----

uint8_t gf_mul_bits(uint8_t a, uint8_t b) {
  unsigned p = 0, x = a;
  for (; b; b >>= 1) {
    if (b & 1) p ^= x;
    x <<= 1;
    if (x & 0x100) x ^= 0x11d;
  }
  return uint8_t(p);
}

struct Gf {
  std::vector<uint8_t> mul = std::vector<uint8_t>(256 * 256);  // mul[a * 256 + b]
  std::array<uint8_t, 256> inv{};
  Gf() {
    for (int a = 0; a < 256; ++a)
      for (int b = 0; b < 256; ++b) mul[size_t(a * 256 + b)] = gf_mul_bits(uint8_t(a), uint8_t(b));
    for (int a = 1; a < 256; ++a)
      for (int b = 1; b < 256; ++b)
        if (mul[size_t(a * 256 + b)] == 1) inv[size_t(a)] = uint8_t(b);
  }
  uint8_t operator()(uint8_t a, uint8_t b) const { return mul[size_t(a) * 256 + b]; }
};
const Gf& gf() {
  static const Gf g;
  return g;
}

// (k+m) x k: identity rows, then parity row r, column j = 1 / ((k + r) + j), where + in
// GF(2^8) is xor (ISA-L's erasure_code.h: "1/(i + j) | i != j, i:{0,k-1} j:{k,m-1}").
std::vector<uint8_t> ref_matrix(int k, int m) {
  std::vector<uint8_t> a(size_t((k + m) * k), 0);
  for (int i = 0; i < k; ++i) a[size_t(i * k + i)] = 1;
  for (int r = k; r < k + m; ++r)
    for (int j = 0; j < k; ++j) a[size_t(r * k + j)] = gf().inv[size_t(r ^ j)];
  return a;
}

using Frags = std::vector<std::vector<uint8_t>>;

// Parity of `data` (k fragments) by the matrix, byte by byte.
Frags ref_encode(const Frags& data, int m) {
  const int k = int(data.size());
  const size_t len = data[0].size();
  std::vector<uint8_t> a = ref_matrix(k, m);
  Frags parity(size_t(m), std::vector<uint8_t>(len, 0));
  for (int r = 0; r < m; ++r)
    for (int j = 0; j < k; ++j) {
      const uint8_t c = a[size_t((k + r) * k + j)];
      const uint8_t* row = &gf().mul[size_t(c) * 256];
      for (size_t b = 0; b < len; ++b) parity[size_t(r)][b] ^= row[data[size_t(j)][b]];
    }
  return parity;
}

// The k data fragments from k survivors (indices into data-then-parity), by Gauss-Jordan
// elimination on [rows of the matrix | survivor bytes].
Frags ref_decode(const Frags& all, const std::vector<int>& survivors, int k, int m) {
  std::vector<uint8_t> a = ref_matrix(k, m);
  const size_t len = all[0].size();
  std::vector<std::vector<uint8_t>> lhs;
  Frags rhs;
  for (int s : survivors) {
    lhs.emplace_back(&a[size_t(s * k)], &a[size_t(s * k + k)]);
    rhs.push_back(all[size_t(s)]);
  }
  for (int col = 0; col < k; ++col) {
    int pivot = col;
    while (pivot < k && lhs[size_t(pivot)][size_t(col)] == 0) ++pivot;
    if (pivot == k) ADD_FAILURE() << "reference: singular survivor matrix";
    if (pivot == k) return {};
    std::swap(lhs[size_t(col)], lhs[size_t(pivot)]);
    std::swap(rhs[size_t(col)], rhs[size_t(pivot)]);
    const uint8_t scale = gf().inv[lhs[size_t(col)][size_t(col)]];
    for (uint8_t& x : lhs[size_t(col)]) x = gf()(x, scale);
    for (uint8_t& x : rhs[size_t(col)]) x = gf()(x, scale);
    for (int r = 0; r < k; ++r) {
      const uint8_t f = lhs[size_t(r)][size_t(col)];
      if (r == col || f == 0) continue;
      for (int j = 0; j < k; ++j) lhs[size_t(r)][size_t(j)] ^= gf()(f, lhs[size_t(col)][size_t(j)]);
      for (size_t b = 0; b < len; ++b) rhs[size_t(r)][b] ^= gf()(f, rhs[size_t(col)][b]);
    }
  }
  return rhs;
}

// ---- Helpers ----

const std::vector<std::pair<int, int>> kShapes = {{2, 1}, {3, 2}, {4, 2}, {6, 3}};
const std::vector<size_t> kLengths = {1, 7, 4095, (size_t(1) << 20) + 3};

Frags random_frags(int count, size_t len, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Frags f(static_cast<size_t>(count), std::vector<uint8_t>(len));
  for (auto& v : f)
    for (auto& b : v) b = uint8_t(rng());
  return f;
}

// k data fragments followed by m parity fragments encoded by `ec`.
Frags encoded(const ErasureCode& ec, size_t len, uint64_t seed) {
  Frags all = random_frags(ec.k() + ec.m(), len, seed);
  std::vector<const uint8_t*> data;
  std::vector<uint8_t*> parity;
  for (int i = 0; i < ec.k(); ++i) data.push_back(all[size_t(i)].data());
  for (int j = 0; j < ec.m(); ++j) parity.push_back(all[size_t(ec.k() + j)].data());
  ec.encode(data, parity, len);
  return all;
}

std::vector<uint8_t*> pointers(Frags& f) {
  std::vector<uint8_t*> p;
  for (auto& v : f) p.push_back(v.data());
  return p;
}

// Every subset of [0, n) with 1..max elements, ascending.
std::vector<std::vector<int>> patterns(int n, int max) {
  std::vector<std::vector<int>> out;
  for (uint32_t mask = 1; mask < (1u << n); ++mask) {
    std::vector<int> p;
    for (int i = 0; i < n; ++i)
      if (mask & (1u << i)) p.push_back(i);
    if (int(p.size()) <= max) out.push_back(p);
  }
  return out;
}

std::string shape(int k, int m, size_t len) {
  return "k=" + std::to_string(k) + " m=" + std::to_string(m) + " len=" + std::to_string(len);
}

#define REQUIRE_ISAL() \
  if (!WEFT_HAVE_ISAL) GTEST_SKIP() << "built without ISA-L"

// ---- Tests ----

TEST(ErasureCode, ReferenceFieldIsIsaLsField) {
  // Fixed points of 0x11d that a wrong polynomial or a wrong bit order would miss.
  EXPECT_EQ(gf_mul_bits(0x80, 0x02), 0x1d);
  EXPECT_EQ(gf_mul_bits(0x02, 0x8e), 0x01);  // 2 * 0x8e = 0x11c ^ 0x11d
  EXPECT_EQ(gf().inv[2], 0x8e);
  for (int a = 1; a < 256; ++a) EXPECT_EQ(gf()(uint8_t(a), gf().inv[size_t(a)]), 1) << a;
}

TEST(ErasureCode, EncodeMatchesReferenceByteForByte) {
  REQUIRE_ISAL();
  for (auto [k, m] : kShapes) {
    ErasureCode ec(k, m);
    ASSERT_EQ(ec.k(), k);
    ASSERT_EQ(ec.m(), m);
    for (size_t len : kLengths) {
      Frags all = encoded(ec, len, uint64_t(k * 1000 + m) + len);
      Frags data(all.begin(), all.begin() + k);
      Frags want = ref_encode(data, m);
      for (int j = 0; j < m; ++j)
        ASSERT_TRUE(all[size_t(k + j)] == want[size_t(j)]) << shape(k, m, len) << " parity " << j;
    }
  }
}

TEST(ErasureCode, EncodeOfLongBuffersCrossesChunksCorrectly) {
  REQUIRE_ISAL();
  // Longer than any chunk and not a multiple of one, with data aligned off a page.
  ErasureCode ec(4, 2);
  const size_t len = (size_t(3) << 20) + 4097;
  Frags all = random_frags(6 + 4, len + 1, 77);
  std::vector<const uint8_t*> data;
  std::vector<uint8_t*> parity;
  for (int i = 0; i < 4; ++i) data.push_back(all[size_t(i)].data() + 1);
  for (int j = 0; j < 2; ++j) parity.push_back(all[size_t(4 + j)].data() + 1);
  ec.encode(data, parity, len);
  Frags d;
  for (int i = 0; i < 4; ++i) d.emplace_back(data[size_t(i)], data[size_t(i)] + len);
  Frags want = ref_encode(d, 2);
  for (int j = 0; j < 2; ++j)
    EXPECT_TRUE(std::equal(want[size_t(j)].begin(), want[size_t(j)].end(), parity[size_t(j)]))
        << "parity " << j;
}

TEST(ErasureCode, UpdatesInAnyOrderAndOverSubRangesGiveTheReferenceParity) {
  REQUIRE_ISAL();
  // A parity holder adds fragments as they arrive, some in pieces, some shorter than the
  // stripe (zero-padded): the sum must be the reference's parity of the padded data.
  for (auto [k, m] : kShapes) {
    ErasureCode ec(k, m);
    const size_t len = (size_t(1) << 20) + 333;
    Frags data = random_frags(k, len, uint64_t(k * 31 + m));
    const size_t short_len = len / 3 + 5;  // data fragment 0 is short: zeros after it
    std::fill(data[0].begin() + long(short_len), data[0].end(), 0);
    Frags parity(size_t(m), std::vector<uint8_t>(len, 0));
    std::vector<uint8_t*> out;
    for (auto& p : parity) out.push_back(p.data());
    for (int i = k - 1; i >= 0; --i) {  // reverse order; odd fragments in two pieces
      const size_t n = i == 0 ? short_len : len;
      if (i % 2 == 0) {
        ec.encode_update(i, data[size_t(i)].data(), out, n);
        continue;
      }
      const size_t half = n / 2 + 7;
      ec.encode_update(i, data[size_t(i)].data(), out, half);
      std::vector<uint8_t*> tail;
      for (auto* p : out) tail.push_back(p + half);
      ec.encode_update(i, data[size_t(i)].data() + half, tail, n - half);
    }
    Frags want = ref_encode(data, m);
    for (int j = 0; j < m; ++j)
      ASSERT_TRUE(parity[size_t(j)] == want[size_t(j)]) << shape(k, m, len) << " parity " << j;
  }
  ErasureCode ec(2, 1);
  uint8_t b = 0, *p = &b;
  EXPECT_THROW(ec.encode_update(2, &b, {p}, 1), InternalError);
  EXPECT_THROW(ec.encode_update(0, &b, {p, p}, 1), InternalError);
}

TEST(ErasureCode, AHolderOfOneParityRowComputesThatRowAlone) {
  REQUIRE_ISAL();
  // The holder of parity fragment k + j adds every data fragment to row j only: its bytes
  // must be the reference's row j, and no other row is touched.
  for (auto [k, m] : kShapes) {
    ErasureCode ec(k, m);
    const size_t len = (size_t(1) << 18) + 77;
    Frags data = random_frags(k, len, uint64_t(k * 13 + m * 7));
    Frags want = ref_encode(data, m);
    for (int j = 0; j < m; ++j) {
      std::vector<uint8_t> row(len, 0);
      for (int i = 0; i < k; ++i) ec.encode_update(i, data[size_t(i)].data(), {row.data()}, len, j);
      ASSERT_TRUE(row == want[size_t(j)]) << shape(k, m, len) << " row " << j;
    }
  }
  ErasureCode ec(3, 2);
  uint8_t b = 0, *p = &b;
  EXPECT_THROW(ec.encode_update(0, &b, {p}, 1, 2), InternalError);     // row 2 of 2
  EXPECT_THROW(ec.encode_update(0, &b, {p, p}, 1, 1), InternalError);  // rows 1..2 of 2
  EXPECT_THROW(ec.encode_update(0, &b, {p}, 1, -1), InternalError);
}

TEST(ErasureCode, ReconstructsEveryErasurePatternUpToM) {
  REQUIRE_ISAL();
  for (auto [k, m] : kShapes) {
    ErasureCode ec(k, m);
    for (size_t len : kLengths) {
      const Frags original = encoded(ec, len, uint64_t(k * 31 + m) + len);
      Frags work = original;
      std::vector<uint8_t*> ptrs = pointers(work);
      for (const std::vector<int>& lost : patterns(k + m, m)) {
        for (int e : lost) std::fill(work[size_t(e)].begin(), work[size_t(e)].end(), uint8_t(0xA5));
        std::vector<int> order(lost.rbegin(), lost.rend());  // any order is accepted
        ec.reconstruct(ptrs, order, len);
        for (int f = 0; f < k + m; ++f)
          ASSERT_TRUE(work[size_t(f)] == original[size_t(f)])
              << shape(k, m, len) << ": fragment " << f << " wrong after losing "
              << ::testing::PrintToString(lost);
      }
    }
  }
}

TEST(ErasureCode, ReferenceDecodesIsaLsParity) {
  REQUIRE_ISAL();
  // An independent decoder reads ISA-L's fragments: from every set of k survivors.
  for (auto [k, m] : kShapes) {
    ErasureCode ec(k, m);
    const size_t len = 515;
    const Frags all = encoded(ec, len, uint64_t(k + m));
    for (const std::vector<int>& lost : patterns(k + m, m)) {
      std::vector<int> survivors;
      for (int i = 0; i < k + m && int(survivors.size()) < k; ++i)
        if (!std::count(lost.begin(), lost.end(), i)) survivors.push_back(i);
      Frags data = ref_decode(all, survivors, k, m);
      ASSERT_EQ(int(data.size()), k);
      for (int i = 0; i < k; ++i)
        ASSERT_TRUE(data[size_t(i)] == all[size_t(i)])
            << shape(k, m, len) << ": data " << i << " from "
            << ::testing::PrintToString(survivors);
    }
  }
}

TEST(ErasureCode, ManyPatternsOutgrowTheDecodeCacheAndStayCorrect) {
  REQUIRE_ISAL();
  // (10, 3) has 377 patterns of up to 3 losses: more than the cache holds, so entries are
  // evicted and rebuilt; run them twice.
  ErasureCode ec(10, 3);
  const size_t len = 100;
  const Frags original = encoded(ec, len, 5);
  Frags work = original;
  std::vector<uint8_t*> ptrs = pointers(work);
  for (int round = 0; round < 2; ++round)
    for (const std::vector<int>& lost : patterns(13, 3)) {
      for (int e : lost) std::fill(work[size_t(e)].begin(), work[size_t(e)].end(), uint8_t(round));
      ec.reconstruct(ptrs, lost, len);
      ASSERT_TRUE(work == original)
          << "round " << round << ", lost " << ::testing::PrintToString(lost);
    }
}

TEST(ErasureCode, ConcurrentReconstructsOnOneObject) {
  REQUIRE_ISAL();
  ErasureCode ec(4, 2);
  const size_t len = 200000;
  const Frags original = encoded(ec, len, 9);
  std::vector<std::vector<int>> lost = patterns(6, 2);
  std::vector<std::thread> threads;
  std::vector<int> bad(4, 0);
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      Frags work = original;
      std::vector<uint8_t*> ptrs = pointers(work);
      for (size_t i = size_t(t); i < lost.size(); i += 2) {  // overlapping, so the cache is shared
        for (int e : lost[i]) std::fill(work[size_t(e)].begin(), work[size_t(e)].end(), uint8_t(t));
        ec.reconstruct(ptrs, lost[i], len);
        bad[size_t(t)] += work != original;
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad, std::vector<int>(4, 0));
}

TEST(ErasureCode, MoreThanMErasuresIsAnIoErrorAndTouchesNothing) {
  REQUIRE_ISAL();
  ErasureCode ec(3, 2);
  const size_t len = 64;
  const Frags original = encoded(ec, len, 3);
  Frags work = original;
  try {
    ec.reconstruct(pointers(work), {0, 2, 4}, len);
    FAIL() << "3 erasures with m=2 were accepted";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("at most 2"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(work == original);
  EXPECT_THROW(ec.reconstruct(pointers(work), {0, 1, 2, 3, 4}, len), IoError);
}

TEST(ErasureCode, MisuseIsAnInternalError) {
  REQUIRE_ISAL();
  ErasureCode ec(3, 2);
  Frags work = random_frags(5, 8, 1);
  std::vector<uint8_t*> ptrs = pointers(work);
  EXPECT_THROW(ec.reconstruct(ptrs, {1, 1}, 8), InternalError);  // repeated
  EXPECT_THROW(ec.reconstruct(ptrs, {5}, 8), InternalError);     // out of range
  EXPECT_THROW(ec.reconstruct(ptrs, {-1}, 8), InternalError);
  EXPECT_THROW(ec.reconstruct({ptrs.begin(), ptrs.end() - 1}, {0}, 8), InternalError);
  std::vector<const uint8_t*> data = {ptrs[0], ptrs[1]};
  EXPECT_THROW(ec.encode(data, {ptrs[3], ptrs[4]}, 8), InternalError);  // 2 data, k=3
  data.push_back(nullptr);
  EXPECT_THROW(ec.encode(data, {ptrs[3], ptrs[4]}, 8), InternalError);
  // Nothing lost, or a zero length: nothing to do, nothing written.
  const Frags before = work;
  ec.reconstruct(ptrs, {}, 8);
  ec.reconstruct(ptrs, {0, 4}, 0);
  EXPECT_TRUE(work == before);
}

TEST(ErasureCode, BadShapeIsAConfigErrorNamingSnapshotEc) {
  for (auto [k, m] :
       std::vector<std::pair<int, int>>{{0, 1}, {1, 0}, {-1, 2}, {2, -1}, {200, 56}}) {
    try {
      ErasureCode ec(k, m);
      FAIL() << "k=" << k << " m=" << m << " accepted";
    } catch (const ConfigError& e) {
      EXPECT_EQ(e.field(), "snapshot.ec") << e.what();
      EXPECT_NE(std::string(e.what()).find("k + m <= 255"), std::string::npos) << e.what();
    }
  }
  if (WEFT_HAVE_ISAL) {
    EXPECT_NO_THROW(ErasureCode(200, 55));
    EXPECT_NO_THROW(ErasureCode(1, 1));
  }
}

TEST(ErasureCode, WithoutIsaLTheConstructorSaysWhatToInstall) {
  if (WEFT_HAVE_ISAL) GTEST_SKIP() << "built with ISA-L";
  try {
    ErasureCode ec(2, 1);
    FAIL() << "constructed without ISA-L";
  } catch (const NotSupported& e) {
    EXPECT_NE(std::string(e.what()).find("libisal-dev"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace weft::checkpoint
