// safetensors files: the weights format shared with PyTorch (ARCHITECTURE.md, "Weights
// and data files"). Layout: 8-byte little-endian header length N, N bytes of JSON
// {"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {..}}, then
// the tensor bytes, offsets relative to the end of the header.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace weft::core::io {

// The dtype names of the format. Weft's safetensors files hold weights, so the reader and
// the writer take the floating-point dtypes only: F32, BF16 and F64. Any other (U8, I32,
// I64, F16, ...) is refused naming the tensor and the dtype, never converted.
const char* safetensors_dtype_name(DType t);

struct SafetensorsEntry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin = 0, end = 0;  // byte range, relative to data_start
};

struct SafetensorsHeader {
  std::vector<SafetensorsEntry> tensors;  // in header order
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;  // 8 + header length
  uint64_t file_size = 0;
};

// Reads and checks the header only: one JSON object filling the declared header length but
// for trailing padding spaces; every dtype one of the above; shapes non-negative; each
// tensor's byte range of the size its shape and dtype need; the ranges tiling the data
// section exactly (from 0 to the end of the file, no gap, no overlap), so a header length
// that is off by any byte is refused rather than read shifted. Errors name the path:
// ConfigError(field, ...) when `field` names the flag or key the path came from
// ("--init-weights"), IoError otherwise.
SafetensorsHeader read_safetensors_header(const std::string& path, const std::string& field = {});

// Loads every tensor into host memory (contiguous, the file's dtype). `metadata`, when
// given, receives the __metadata__ strings.
std::map<std::string, Tensor> load_safetensors(
    const std::string& path, const std::string& field = {},
    std::map<std::string, std::string>* metadata = nullptr);

// Writes host tensors (any strides) sorted by name, with an 8-byte aligned data section,
// to a temporary file renamed into place, so a crash never leaves a half-written file at
// `path`. Throws IoError on write failure and, before writing anything, for a tensor of a
// dtype the reader refuses or holding a NaN or infinity (naming the tensor: weights that
// diverged are not exported); NotSupported for a tensor not on the host.
void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

}  // namespace weft::core::io
