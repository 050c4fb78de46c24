// HostSegmentSource: aligned_alloc with an optional capacity to emulate a full device.
#include "memory/segment_source.h"

#include <cstdint>
#include <cstdlib>

#include "base/check.h"

namespace weft::memory {

void* HostSegmentSource::reserve(size_t bytes) {
  WEFT_CHECK(bytes > 0 && bytes % kSegmentAlignment == 0, "segment size ", bytes,
             " is not a positive multiple of ", kSegmentAlignment);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (bytes > capacity_ - held_) return nullptr;
    held_ += bytes;
  }
  void* p = std::aligned_alloc(kSegmentAlignment, bytes);
  if (!p) {
    std::lock_guard<std::mutex> lock(mu_);
    held_ -= bytes;
  }
  return p;
}

void HostSegmentSource::release(void* ptr, size_t bytes) {
  std::free(ptr);
  std::lock_guard<std::mutex> lock(mu_);
  held_ -= bytes;
}

size_t HostSegmentSource::bytes_held() const {
  std::lock_guard<std::mutex> lock(mu_);
  return held_;
}

SegmentSource& default_host_segment_source() {
  static HostSegmentSource* instance = new HostSegmentSource();
  return *instance;
}

}  // namespace weft::memory
