// Segments from an Allocator: lets a caching or planned arena take its big ranges from a
// memory::RecyclingAllocator, so that when the arena goes (an online resize drops one trainer
// and builds the next in the same process) its pages are kept for the next layout's blocks
// (reserved, or reshaped spares) instead of being unmapped and then faulted in anew.
#pragma once

#include <string>

#include "memory/allocator.h"
#include "memory/segment_source.h"

namespace weft::memory {

class AllocatorSegmentSource final : public SegmentSource {
 public:
  // Segments of at least `min_bytes` come from `base`, smaller ones from the host source:
  // a block below the host allocator's mapping size is only Allocator::kAlignment-aligned,
  // and is too small to be worth keeping. `base` must outlive every segment it serves.
  explicit AllocatorSegmentSource(Allocator& base, size_t min_bytes = size_t(32) << 20);
  // nullptr when `base` throws std::bad_alloc (the contract: the caller flushes and retries).
  void* reserve(size_t bytes) override;
  void release(void* ptr, size_t bytes) override;
  std::string name() const override { return "allocator:" + base_.name(); }

 private:
  Allocator& base_;
  const size_t min_bytes_;
};

}  // namespace weft::memory
