// Non-finite counting by exponent bits: an all-ones exponent is NaN or infinity in f32, f64
// and bf16 alike. Counting (not stopping at the first) keeps the loop branch-free.
#include "checkpoint/finite.h"

#include <cstring>

namespace weft::checkpoint {

namespace {

template <typename Bits>
int64_t count_exponent_all_ones(const void* data, int64_t n, Bits mask) {
  const auto* p = static_cast<const unsigned char*>(data);
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    Bits b;
    std::memcpy(&b, p + i * int64_t(sizeof(Bits)), sizeof(Bits));
    bad += (b & mask) == mask;
  }
  return bad;
}

}  // namespace

int64_t count_non_finite(const void* data, int64_t n, core::DType dtype) {
  switch (dtype) {
    case core::DType::kF32:
      return count_exponent_all_ones<uint32_t>(data, n, 0x7f800000u);
    case core::DType::kF64:
      return count_exponent_all_ones<uint64_t>(data, n, 0x7ff0000000000000ull);
    case core::DType::kBF16:
      return count_exponent_all_ones<uint16_t>(data, n, uint16_t(0x7f80));
    default:
      return 0;
  }
}

}  // namespace weft::checkpoint
