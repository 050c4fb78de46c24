// ArenaSegmentSource bookkeeping, the cudaMalloc behind DeviceArena, pinned buffers and
// the device executor's allocators.
#include "core/cuda/arena.h"

#include <cuda_runtime.h>

#include <cstdint>

#include "base/check.h"
#include "base/log.h"
#include "base/foreign_checks.h"

namespace weft::core::cuda {

ArenaSegmentSource::ArenaSegmentSource(void* base, size_t capacity, std::string name)
    : base_(static_cast<char*>(base)), capacity_(capacity), name_(std::move(name)) {
  WEFT_CHECK(base_ != nullptr && reinterpret_cast<uintptr_t>(base_) % kSegmentAlignment == 0,
             "arena base ", base, " is not aligned to ", kSegmentAlignment);
  // Only whole segments are handed out; a ragged tail would never fit a request.
  capacity_ -= capacity_ % kSegmentAlignment;
  if (capacity_ > 0) free_[0] = capacity_;
}

void* ArenaSegmentSource::reserve(size_t bytes) {
  WEFT_CHECK(bytes > 0 && bytes % kSegmentAlignment == 0, "segment size ", bytes,
             " is not a positive multiple of ", kSegmentAlignment);
  std::lock_guard<std::mutex> lock(mu_);
  auto best = free_.end();
  for (auto it = free_.begin(); it != free_.end(); ++it)  // few ranges: a scan is enough
    if (it->second >= bytes && (best == free_.end() || it->second < best->second)) best = it;
  if (best == free_.end()) return nullptr;
  size_t off = best->first, len = best->second;
  free_.erase(best);
  if (len > bytes) free_[off + bytes] = len - bytes;
  held_[off] = bytes;
  bytes_held_ += bytes;
  bytes_held_peak_ = std::max(bytes_held_peak_, bytes_held_);
  return base_ + off;
}

void ArenaSegmentSource::release(void* ptr, size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  char* p = static_cast<char*>(ptr);
  WEFT_CHECK(p >= base_ && p < base_ + capacity_, "release of ", ptr, " outside arena '", name_,
             "'");
  size_t off = size_t(p - base_);
  auto h = held_.find(off);
  WEFT_CHECK(h != held_.end(), "release of ", ptr, ": not a segment of arena '", name_, "'");
  WEFT_CHECK(h->second == bytes, "release of ", ptr, " with ", bytes, " bytes, reserved ",
             h->second);
  held_.erase(h);
  bytes_held_ -= bytes;
  // Insert, then merge with the free neighbours on either side.
  auto it = free_.emplace(off, bytes).first;
  if (auto next = std::next(it); next != free_.end() && it->first + it->second == next->first) {
    it->second += next->second;
    free_.erase(next);
  }
  if (it != free_.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second == it->first) {
      prev->second += it->second;
      free_.erase(it);
    }
  }
}

size_t ArenaSegmentSource::bytes_held() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_held_;
}
size_t ArenaSegmentSource::bytes_held_peak() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_held_peak_;
}
size_t ArenaSegmentSource::largest_free() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t m = 0;
  for (const auto& [off, len] : free_) m = std::max(m, len);
  return m;
}
size_t ArenaSegmentSource::num_free_ranges() const {
  std::lock_guard<std::mutex> lock(mu_);
  return free_.size();
}

DeviceArena::DeviceArena(size_t bytes) {
  WEFT_CUDA_DEVICE_CHECK(cudaMalloc(&base_, bytes));  // cudaMalloc aligns to 256 B at least
  source_ = std::make_unique<ArenaSegmentSource>(base_, bytes, "cuda");
}

DeviceArena::~DeviceArena() {
  source_.reset();
  if (base_) cudaFree(base_);
}

DeviceAllocators::DeviceAllocators(memory::SegmentSource& source, const std::string& kind)
    : source_(source), kind_(kind) {
  WEFT_CHECK(kind == "caching" || kind == "planned", "unknown allocator kind '", kind, "'");
  state_ = std::make_unique<memory::CachingAllocator>(memory::CachingOptions{}, &source_);
  caching_ = std::make_unique<memory::CachingAllocator>(memory::CachingOptions{}, &source_);
  recorder_ = std::make_unique<memory::TraceRecorder>(*caching_);
  current_ = recorder_.get();
}

void DeviceAllocators::begin_step(int64_t step) {
  if (step >= 1 && current_ == recorder_.get()) {
    if (kind_ != "planned") {
      current_ = caching_.get();  // blocks from step 0 still return through the recorder
      current_->begin_step();
      return;
    }
    memory::Trace trace = recorder_->trace();
    // The arena is fixed: give back what step 0 cached so the plan's arena fits beside it.
    caching_->empty_cache();
    planned_ = std::make_unique<memory::PlannedAllocator>(trace, memory::PlannedOptions{}, &source_,
                                                          &source_);
    current_ = planned_.get();
    WEFT_INFO("memory", "cuda: planned ", trace.records.size(), " allocations of step 0 into ",
              planned_->plan().arena_bytes >> 20, " MiB");
  }
  current_->begin_step();
}

PinnedBuffer::PinnedBuffer(size_t bytes) : bytes_(bytes) {
  WEFT_CUDA_DEVICE_CHECK(cudaMallocHost(&p_, bytes ? bytes : 1));
}
PinnedBuffer::~PinnedBuffer() {
  if (p_) cudaFreeHost(p_);
}
PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
  if (this != &o) {
    if (p_) cudaFreeHost(p_);
    p_ = o.p_;
    bytes_ = o.bytes_;
    o.p_ = nullptr;
  }
  return *this;
}

}  // namespace weft::core::cuda
