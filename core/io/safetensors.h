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

// "F32", "F64", "BF16", "I32", "I64", "U8": the dtypes Weft reads and writes.
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

// Reads and checks the header only: every dtype supported, shapes non-negative, each
// tensor's byte range inside the file, of the size its shape and dtype need, and not
// overlapping another. Errors name the path: ConfigError(field, ...) when `field` names
// the flag or key the path came from ("--init-weights"), IoError otherwise.
SafetensorsHeader read_safetensors_header(const std::string& path, const std::string& field = {});

// Loads every tensor into host memory (contiguous, the file's dtype). `metadata`, when
// given, receives the __metadata__ strings.
std::map<std::string, Tensor> load_safetensors(
    const std::string& path, const std::string& field = {},
    std::map<std::string, std::string>* metadata = nullptr);

// Writes host tensors (any strides) sorted by name, with an 8-byte aligned data section,
// to a temporary file renamed into place, so a crash never leaves a half-written file at
// `path`. Throws IoError on write failure, NotSupported for a tensor not on the host.
void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

}  // namespace weft::core::io
