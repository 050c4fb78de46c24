// core::Tensor: views share storage, slice/select strides, copies with dtype
// conversion (bf16 round-to-nearest-even), clone and contiguous.
#include "core/tensor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "base/error.h"

namespace weft::core {
namespace {

Tensor iota(const Shape& shape) {
  std::vector<float> v(size_t(shape_numel(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(i);
  return Tensor::from_vector(shape, v);
}

TEST(Tensor, EmptyZerosAndShape) {
  Tensor z = Tensor::zeros({2, 3}, DType::kF64);
  EXPECT_TRUE(z.defined());
  EXPECT_EQ(z.numel(), 6);
  EXPECT_EQ(z.dim(), 2);
  EXPECT_EQ(z.size(-1), 3);
  EXPECT_EQ(z.nbytes(), 48u);
  EXPECT_EQ(z.strides(), (std::vector<int64_t>{3, 1}));
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(z.item_at(i), 0.0);
  EXPECT_FALSE(Tensor().defined());
  EXPECT_THROW(Tensor::empty({2, -1}, DType::kF32), InternalError);
  EXPECT_THROW(Tensor::from_vector<float>({2, 2}, {1, 2, 3}), InternalError);
  EXPECT_THROW(z.data<float>(), InternalError);  // wrong dtype
}

TEST(Tensor, ViewSharesStorage) {
  Tensor t = iota({2, 6});
  Tensor v = t.view({3, 4});
  EXPECT_EQ(v.shape(), (Shape{3, 4}));
  EXPECT_EQ(v.data<float>(), t.data<float>());
  v.data<float>()[5] = 42.0f;
  EXPECT_EQ(t.item_at(5), 42.0);
  EXPECT_THROW(t.view({5, 2}), InternalError);
  EXPECT_THROW(t.slice(1, 0, 3).view({6}), InternalError);  // not contiguous
}

TEST(Tensor, SliceAndSelect) {
  Tensor t = iota({3, 4});  // rows 0..3, 4..7, 8..11
  Tensor s = t.slice(1, 1, 2);
  EXPECT_EQ(s.shape(), (Shape{3, 2}));
  EXPECT_FALSE(s.is_contiguous());
  EXPECT_EQ(s.to_vector<float>(), (std::vector<float>{1, 2, 5, 6, 9, 10}));
  Tensor rows = t.slice(0, 1, 2);
  EXPECT_TRUE(rows.is_contiguous());
  EXPECT_EQ(rows.item_at(0), 4.0);
  Tensor col = t.select(1, 3);
  EXPECT_EQ(col.shape(), (Shape{3}));
  EXPECT_EQ(col.to_vector<float>(), (std::vector<float>{3, 7, 11}));
  Tensor row = t.select(-2, 2);
  EXPECT_EQ(row.to_vector<float>(), (std::vector<float>{8, 9, 10, 11}));
  // Writes through a slice land in the parent.
  s.fill_(-1.0);
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{0, -1, -1, 3, 4, -1, -1, 7, 8, -1, -1, 11}));
  EXPECT_THROW(t.slice(1, 3, 2), InternalError);
  EXPECT_THROW(t.select(0, 3), InternalError);
}

TEST(Tensor, CloneAndContiguousCopy) {
  Tensor t = iota({2, 3});
  Tensor c = t.clone();
  c.data<float>()[0] = 99.0f;
  EXPECT_EQ(t.item_at(0), 0.0);  // deep copy
  Tensor s = t.slice(1, 1, 2);
  Tensor sc = s.contiguous();
  EXPECT_TRUE(sc.is_contiguous());
  EXPECT_NE(sc.raw_data(), s.raw_data());
  EXPECT_EQ(sc.to_vector<float>(), (std::vector<float>{1, 2, 4, 5}));
  EXPECT_EQ(t.contiguous().raw_data(), t.raw_data());  // already contiguous: same storage
}

TEST(Tensor, CopyFromConvertsDtypes) {
  Tensor d = Tensor::from_vector<double>({4}, {0.1, -2.5, 3.0, 1e10});
  Tensor f = Tensor::empty({4}, DType::kF32);
  f.copy_from(d);
  EXPECT_EQ(f.to_vector<float>(), (std::vector<float>{0.1f, -2.5f, 3.0f, 1e10f}));
  Tensor i = Tensor::empty({3}, DType::kI32);
  i.copy_from(Tensor::from_vector<float>({3}, {7.0f, -3.0f, 0.0f}));
  EXPECT_EQ(i.to_vector<int32_t>(), (std::vector<int32_t>{7, -3, 0}));
  Tensor back = i.to(DType::kF64);
  EXPECT_EQ(back.to_vector<double>(), (std::vector<double>{7, -3, 0}));
  EXPECT_THROW(f.copy_from(Tensor::zeros({5}, DType::kF32)), InternalError);
}

TEST(Tensor, CopyFromStridedSourceAndDestination) {
  Tensor t = iota({3, 4});
  Tensor dst = Tensor::zeros({3, 2}, DType::kF64);
  dst.copy_from(t.slice(1, 2, 2));  // strided f32 -> contiguous f64
  EXPECT_EQ(dst.to_vector<double>(), (std::vector<double>{2, 3, 6, 7, 10, 11}));
  Tensor big = Tensor::zeros({3, 4}, DType::kF32);
  big.slice(1, 0, 2).copy_from(dst);  // contiguous f64 -> strided f32
  EXPECT_EQ(big.to_vector<float>(), (std::vector<float>{2, 3, 0, 0, 6, 7, 0, 0, 10, 11, 0, 0}));
}

float bf16_roundtrip(float x) {
  Tensor f = Tensor::from_vector<float>({1}, {x});
  Tensor h = f.to(DType::kBF16);
  EXPECT_EQ(h.nbytes(), 2u);
  return float(h.item());
}

TEST(Tensor, Bf16RoundsToNearestEven) {
  // bf16 keeps 8 significant bits: the spacing just above 1 is 2^-7.
  const float ulp = 1.0f / 128;
  EXPECT_EQ(bf16_roundtrip(1.0f), 1.0f);
  EXPECT_EQ(bf16_roundtrip(1.0f + ulp), 1.0f + ulp);                 // exact
  EXPECT_EQ(bf16_roundtrip(1.0f + ulp / 2), 1.0f);                   // tie -> even (down)
  EXPECT_EQ(bf16_roundtrip(1.0f + 3 * ulp / 2), 1.0f + 2 * ulp);     // tie -> even (up)
  EXPECT_EQ(bf16_roundtrip(1.0f + ulp / 2 + ulp / 64), 1.0f + ulp);  // above the tie
  EXPECT_EQ(bf16_roundtrip(1.0f + ulp / 2 - ulp / 64), 1.0f);        // below the tie
  EXPECT_EQ(bf16_roundtrip(-3.0f), -3.0f);
  EXPECT_EQ(bf16_roundtrip(0.1f), 0.10009765625f);  // 0x3DCD
  EXPECT_TRUE(std::isnan(bf16_roundtrip(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(std::isinf(bf16_roundtrip(std::numeric_limits<float>::infinity())));
  // The largest finite float rounds up to infinity in bf16, as round-to-nearest says.
  EXPECT_TRUE(std::isinf(bf16_roundtrip(std::numeric_limits<float>::max())));
  // bf16 -> f32 is exact.
  Tensor h = Tensor::from_vector<float>({2}, {1.5f, -0.375f}).to(DType::kBF16);
  EXPECT_EQ(h.to(DType::kF32).to_vector<float>(), (std::vector<float>{1.5f, -0.375f}));
}

TEST(Tensor, ZeroAndFill) {
  Tensor t = iota({2, 3});
  t.select(0, 1).zero_();
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{0, 1, 2, 0, 0, 0}));
  t.fill_(2.5);
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(t.item_at(i), 2.5);
}

}  // namespace
}  // namespace weft::core
