// Devices a tensor can live on. CPU is always built; CUDA plugs in behind
// WEFT_HAVE_CUDA (core/cuda/) without changing this interface.
#pragma once

#include <string>

namespace weft::core {

enum class DeviceType : uint8_t { kCPU, kCUDA };

struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;  // GPU ordinal; always 0 for the CPU

  static Device cpu() { return {DeviceType::kCPU, 0}; }
  static Device cuda(int i) { return {DeviceType::kCUDA, i}; }
  bool is_cpu() const { return type == DeviceType::kCPU; }
  bool operator==(const Device&) const = default;
  std::string to_string() const {
    return is_cpu() ? "cpu" : "cuda:" + std::to_string(index);
  }
};

}  // namespace weft::core
