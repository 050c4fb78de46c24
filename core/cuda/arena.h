// The device arena: one large cudaMalloc, carved into segments for the memory/ allocators
// (caching now, planned once a trace exists), so a training step never calls cudaMalloc.
// The carving (ArenaSegmentSource) is plain bookkeeping over an address range and is
// tested on the CPU; DeviceArena only adds the cudaMalloc that backs it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "memory/caching_allocator.h"
#include "memory/planned_allocator.h"
#include "memory/segment_source.h"
#include "memory/trace.h"

namespace weft::core::cuda {

// Segments from a fixed range [base, base + capacity), best fit (smallest free range that
// fits, then lowest address), neighbours coalesced on release. It never touches the bytes,
// so any range works: device memory in production, a host buffer in tests.
// Contract: that of SegmentSource (nullptr when no free range fits; release() of a range
// not reserved, or with another size, throws InternalError and changes nothing).
class ArenaSegmentSource final : public memory::SegmentSource {
 public:
  // `base` must be aligned to kSegmentAlignment; the range must outlive the source.
  ArenaSegmentSource(void* base, size_t capacity, std::string name = "arena");
  void* reserve(size_t bytes) override;
  void release(void* ptr, size_t bytes) override;
  std::string name() const override { return name_; }

  size_t capacity() const { return capacity_; }
  size_t bytes_held() const;
  size_t bytes_held_peak() const;
  size_t largest_free() const;  // the biggest single range reserve() could still hand out
  size_t num_free_ranges() const;

 private:
  char* base_;
  size_t capacity_;
  std::string name_;
  mutable std::mutex mu_;
  std::map<size_t, size_t> free_;  // offset -> length, disjoint and never adjacent
  std::map<size_t, size_t> held_;  // offset -> length
  size_t bytes_held_ = 0, bytes_held_peak_ = 0;
};

// Owns one cudaMalloc of `bytes` on the current device and the source that carves it.
// Throws weft::Error when the device cannot give that much.
class DeviceArena {
 public:
  explicit DeviceArena(size_t bytes);
  ~DeviceArena();
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;
  memory::SegmentSource& source() { return *source_; }
  const ArenaSegmentSource& arena() const { return *source_; }

 private:
  void* base_ = nullptr;
  std::unique_ptr<ArenaSegmentSource> source_;
};

// The allocators of one device executor over one segment source: `state` for persistent
// values (parameters, gradients, optimizer state; caching), `activations()` for the
// per-micro-batch values: caching, or, with kind "planned", a recorder during step 0 and
// a PlannedAllocator built from that trace from step 1 on (the CPU trainer's scheme,
// core/exec/activation_memory.h, on device segments).
class DeviceAllocators {
 public:
  DeviceAllocators(memory::SegmentSource& source, const std::string& kind);
  memory::Allocator& state() { return *state_; }
  memory::Allocator& activations() { return *current_; }
  // Before every step; switches to the plan after step 0 when the kind is "planned".
  void begin_step(int64_t step);
  memory::AllocatorStats activation_stats() const { return current_->stats(); }

 private:
  memory::SegmentSource& source_;
  std::string kind_;
  std::unique_ptr<memory::CachingAllocator> state_;
  std::unique_ptr<memory::CachingAllocator> caching_;
  std::unique_ptr<memory::TraceRecorder> recorder_;
  std::unique_ptr<memory::PlannedAllocator> planned_;
  memory::Allocator* current_ = nullptr;
};

// Page-locked host memory for staging copies (cudaMallocHost): copies from it run
// asynchronously on a stream. Throws weft::Error when the memory cannot be had.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(size_t bytes);
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& o) noexcept : p_(o.p_), bytes_(o.bytes_) { o.p_ = nullptr; }
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  void* data() const { return p_; }
  size_t bytes() const { return bytes_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace weft::core::cuda
