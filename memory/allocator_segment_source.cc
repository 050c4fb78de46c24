// AllocatorSegmentSource: big segments through an Allocator, small ones from the host.
#include "memory/allocator_segment_source.h"

#include <cstdint>
#include <new>

#include "base/check.h"

namespace weft::memory {

AllocatorSegmentSource::AllocatorSegmentSource(Allocator& base, size_t min_bytes)
    : base_(base), min_bytes_(min_bytes) {}

void* AllocatorSegmentSource::reserve(size_t bytes) {
  WEFT_CHECK(bytes > 0 && bytes % kSegmentAlignment == 0, "segment size ", bytes,
             " is not a positive multiple of ", kSegmentAlignment);
  if (bytes < min_bytes_) return default_host_segment_source().reserve(bytes);
  void* p = nullptr;
  try {
    p = base_.allocate(bytes, Tag::kActivation);
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
  WEFT_CHECK(reinterpret_cast<uintptr_t>(p) % kSegmentAlignment == 0, "allocator ", base_.name(),
             " returned a block of ", bytes, " bytes not aligned to ", kSegmentAlignment);
  return p;
}

void AllocatorSegmentSource::release(void* ptr, size_t bytes) {
  // The size decides the source, as it did at reserve (release gets the same size).
  if (bytes < min_bytes_) return default_host_segment_source().release(ptr, bytes);
  base_.free(ptr);
}

}  // namespace weft::memory
