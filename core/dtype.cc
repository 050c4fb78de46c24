// DType names and sizes.
#include "core/dtype.h"

#include "base/error.h"

namespace weft::core {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kF64: return 8;
    case DType::kBF16: return 2;
    case DType::kI32: return 4;
    case DType::kI64: return 8;
    case DType::kU8: return 1;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kF64: return "f64";
    case DType::kBF16: return "bf16";
    case DType::kI32: return "i32";
    case DType::kI64: return "i64";
    case DType::kU8: return "u8";
  }
  return "?";
}

DType parse_dtype(const std::string& s, const std::string& field) {
  for (DType t : {DType::kF32, DType::kF64, DType::kBF16, DType::kI32, DType::kI64, DType::kU8})
    if (s == dtype_name(t)) return t;
  throw ConfigError(field, "unknown dtype '" + s + "'; expected f32, bf16, f64, i32, i64 or u8");
}

}  // namespace weft::core
