// HostSegmentSource: host blocks (big ones in huge pages, memory/huge_pages.h) with an
// optional capacity to emulate a full device.
#include "memory/segment_source.h"

#include <cstdint>
#include <cstdlib>

#include "base/check.h"
#include "memory/huge_pages.h"

namespace weft::memory {

void* HostSegmentSource::reserve(size_t bytes) {
  WEFT_CHECK(bytes > 0 && bytes % kSegmentAlignment == 0, "segment size ", bytes,
             " is not a positive multiple of ", kSegmentAlignment);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (bytes > capacity_ - held_) return nullptr;
    held_ += bytes;
  }
  void* p = allocate_host_block(bytes, kSegmentAlignment);
  if (!p) {
    std::lock_guard<std::mutex> lock(mu_);
    held_ -= bytes;
  }
  return p;
}

void HostSegmentSource::release(void* ptr, size_t bytes) {
  free_host_block(ptr, bytes);
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
