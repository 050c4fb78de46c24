// Where caching and planned allocators get their big ranges ("segments") from: host
// memory here; a device arena (cudaMalloc, VMM) plugs in behind the same interface.
#pragma once

#include <cstddef>
#include <mutex>
#include <string>

namespace weft::memory {

// Contract:
// - reserve(bytes) returns the start of `bytes` contiguous bytes aligned to at least
//   kSegmentAlignment, owned by the caller until release(); or nullptr when the memory is
//   exhausted (the caller may free cached segments and retry). It never throws for
//   exhaustion; `bytes` must be a positive multiple of kSegmentAlignment (else
//   InternalError).
// - release(ptr, bytes) takes back a range from reserve() with the same size.
// - Thread-safe. The source must outlive every allocator that reserves from it.
class SegmentSource {
 public:
  static constexpr size_t kSegmentAlignment = 512;
  virtual ~SegmentSource() = default;
  virtual void* reserve(size_t bytes) = 0;
  virtual void release(void* ptr, size_t bytes) = 0;
  virtual std::string name() const = 0;
};

// Host segments from aligned_alloc. `capacity` caps the bytes held at once, so tests
// and benchmarks can emulate a device that runs out of memory.
class HostSegmentSource final : public SegmentSource {
 public:
  explicit HostSegmentSource(size_t capacity = SIZE_MAX) : capacity_(capacity) {}
  void* reserve(size_t bytes) override;
  void release(void* ptr, size_t bytes) override;
  std::string name() const override { return "host"; }
  size_t bytes_held() const;

 private:
  mutable std::mutex mu_;
  size_t capacity_;
  size_t held_ = 0;
};

// A process-wide host source for allocators built without one; never destroyed, so
// allocators in static storage may still release into it at exit.
SegmentSource& default_host_segment_source();

}  // namespace weft::memory
