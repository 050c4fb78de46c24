// The allocator seam: tensors on every device get their bytes through this
// interface, so the caching and planned allocators can replace the plain one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace weft::memory {

// What an allocation is for; the trace recorder and the planner group by it.
enum class Tag : uint8_t {
  kActivation,
  kParameter,
  kGradient,
  kOptimizer,
  kWorkspace,
  kComm,
  kOther
};
const char* tag_name(Tag t);
// Inverse of tag_name; returns false (and leaves *out alone) for an unknown name.
bool parse_tag(const std::string& name, Tag* out);

// Which part of a training step is running; allocations made in one phase and freed
// in another have the lifetimes the offline planner groups together.
enum class Phase : uint8_t { kForward, kBackward, kOptimizer, kOther };
const char* phase_name(Phase p);
bool parse_phase(const std::string& name, Phase* out);

struct AllocatorStats {
  size_t bytes_live = 0;      // bytes handed out and not yet freed (as requested)
  size_t bytes_reserved = 0;  // bytes the allocator holds from the system
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
// - Step context (optional): an executor that knows its schedule calls begin_step() when
//   a training step starts and set_phase() whenever the phase or micro-batch changes.
//   Allocators that trace or replay a step use it; the others ignore it (the defaults do
//   nothing), so calling it is always safe. Decorators forward it to what they wrap.
//   Both are cheap and never throw; calls from several threads interleave in any order,
//   so an executor that wants a reproducible trace makes them from one thread.
class Allocator {
 public:
  static constexpr size_t kAlignment = 64;  // one cache line; also enough for AVX-512
  virtual ~Allocator() = default;
  virtual void* allocate(size_t bytes, Tag tag = Tag::kOther) = 0;
  virtual void free(void* ptr) = 0;
  virtual AllocatorStats stats() const = 0;
  virtual std::string name() const = 0;

  // Block `p` (live, from this allocator) made a block of `bytes` whose first bytes, up to the
  // smaller size, are p's and whose pages stay where they were resident; p is then gone and
  // the result is freed like any block. nullptr, p unchanged, where the allocator cannot
  // (the default; HostAllocator for blocks in mappings of their own, memory/huge_pages.h).
  virtual void* reshape(void* p, size_t bytes) { return nullptr; }

  // A new step starts: allocation event indices restart at 0 for tracing and planning.
  virtual void begin_step() {}
  // From now on allocations belong to `phase` of micro-batch `micro_batch` (-1: none).
  // Every call opens a new span, even with the same arguments as the last one: a second
  // forward of micro-batch 3 (another virtual-pipeline chunk) is a different span, and an
  // executor may fence a part whose allocations vary (MoE experts) with two calls. Calls
  // with no allocation or free in between open one span, not several.
  virtual void set_phase(Phase phase, int micro_batch = -1) {}
};

// Sets the phase for the life of the scope and restores `after` at its end, so that an
// exception inside a phase does not leave the allocator tagging later work with it.
class PhaseScope {
 public:
  PhaseScope(Allocator& alloc, Phase phase, int micro_batch = -1, Phase after = Phase::kOther)
      : alloc_(alloc), after_(after) {
    alloc_.set_phase(phase, micro_batch);
  }
  ~PhaseScope() { alloc_.set_phase(after_, -1); }
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  Allocator& alloc_;
  Phase after_;
};

// The process-wide default host allocator (a plain aligned malloc with statistics).
// Tensors use it unless given another; executors pass their own arena allocator.
Allocator& default_host_allocator();

}  // namespace weft::memory
