// The allocator seam: tensors on every device get their bytes through this
// interface, so the caching and planned allocators can replace the plain one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace weft::memory {

// What an allocation is for; the trace recorder and the planner group by it.
enum class Tag : uint8_t { kActivation, kParameter, kGradient, kOptimizer, kWorkspace, kComm, kOther };
const char* tag_name(Tag t);

struct AllocatorStats {
  size_t bytes_live = 0;       // bytes handed out and not yet freed (as requested)
  size_t bytes_reserved = 0;   // bytes the allocator holds from the system
  size_t bytes_live_peak = 0;
  size_t bytes_reserved_peak = 0;
  size_t num_allocs = 0;
  size_t num_frees = 0;
  // 1 - peak_live / peak_reserved: the share of reserved memory never used at the peak.
  double fragmentation() const {
    return bytes_reserved_peak ? 1.0 - double(bytes_live_peak) / double(bytes_reserved_peak) : 0.0;
  }
};

// Contract:
// - allocate(n, tag) returns a pointer aligned to kAlignment to at least n bytes, or
//   throws std::bad_alloc when the memory cannot be had. allocate(0) returns a valid,
//   unique pointer that must still be freed.
// - free(p) returns a pointer obtained from this allocator and not yet freed; any other
//   pointer throws InternalError without changing state.
// - Thread-safe: any thread may allocate and free concurrently.
// - The allocator must outlive every block it handed out.
class Allocator {
 public:
  static constexpr size_t kAlignment = 64;  // one cache line; also enough for AVX-512
  virtual ~Allocator() = default;
  virtual void* allocate(size_t bytes, Tag tag = Tag::kOther) = 0;
  virtual void free(void* ptr) = 0;
  virtual AllocatorStats stats() const = 0;
  virtual std::string name() const = 0;
};

// The process-wide default host allocator (a plain aligned malloc with statistics).
// Tensors use it unless given another; executors pass their own arena allocator.
Allocator& default_host_allocator();

}  // namespace weft::memory
