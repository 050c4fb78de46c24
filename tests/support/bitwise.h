// Bit-for-bit comparisons of a trainer's tensors and step statistics: what the resize,
// adopt and finish tests assert where the same layout must give exactly the same numbers.
#pragma once

#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <cstring>

#include "core/tensor.h"
#include "core/exec/trainer.h"

namespace weft::test {

// Same shape, dtype and bytes.
inline bool same_bits(const core::Tensor& a, const core::Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  core::Tensor x = a.contiguous(), y = b.contiguous();
  return std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()) == 0;
}

// Every statistic of two steps equal bit for bit (a NaN's bits too: a dropped step).
inline void expect_same_stats(const core::StepStats& a, const core::StepStats& b) {
  EXPECT_EQ(a.step, b.step);
  EXPECT_EQ(std::bit_cast<uint64_t>(a.loss), std::bit_cast<uint64_t>(b.loss))
      << "step " << a.step << ": loss " << a.loss << " vs " << b.loss;
  EXPECT_EQ(std::bit_cast<uint64_t>(a.grad_norm), std::bit_cast<uint64_t>(b.grad_norm))
      << "step " << a.step << ": grad norm " << a.grad_norm << " vs " << b.grad_norm;
  EXPECT_EQ(std::bit_cast<uint64_t>(a.aux_loss), std::bit_cast<uint64_t>(b.aux_loss))
      << "step " << a.step;
  EXPECT_EQ(std::bit_cast<uint64_t>(a.lr), std::bit_cast<uint64_t>(b.lr)) << "step " << a.step;
  EXPECT_EQ(a.applied, b.applied);
}

}  // namespace weft::test
