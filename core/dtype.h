// Element types and their sizes; bf16 conversion helpers (round to nearest even).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

namespace weft::core {

enum class DType : uint8_t { kF32, kF64, kBF16, kI32, kI64, kU8 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);
// Parses "f32", "bf16", ...; throws ConfigError naming `field` otherwise.
DType parse_dtype(const std::string& s, const std::string& field);

template <typename T>
constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::kF32; }
template <> constexpr DType dtype_of<double>() { return DType::kF64; }
template <> constexpr DType dtype_of<int32_t>() { return DType::kI32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::kI64; }
template <> constexpr DType dtype_of<uint8_t>() { return DType::kU8; }

// bfloat16 is stored as the top 16 bits of an IEEE float.
struct bf16 {
  uint16_t bits;
};
template <> constexpr DType dtype_of<bf16>() { return DType::kBF16; }

inline bf16 float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{uint16_t((u >> 16) | 0x40)};  // keep NaN a NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{uint16_t(u >> 16)};
}
inline float bf16_to_float(bf16 h) {
  uint32_t u = uint32_t(h.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace weft::core
