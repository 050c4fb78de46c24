// CachingAllocator: PyTorch's pools, best-fit, splitting and in-segment coalescing, on
// a pluggable segment source.
#include "memory/caching_allocator.h"

#include <algorithm>
#include <new>

#include "base/check.h"
#include "base/log.h"

namespace weft::memory {

namespace {
size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }
}  // namespace

CachingAllocator::CachingAllocator(CachingOptions options, SegmentSource* source)
    : options_(options), source_(source ? source : &default_host_segment_source()) {
  WEFT_CHECK(options_.min_block >= kAlignment && options_.min_block % kAlignment == 0 &&
                 SegmentSource::kSegmentAlignment % options_.min_block == 0,
             "min_block ", options_.min_block, " must be a multiple of ", kAlignment,
             " dividing the segment alignment");
  WEFT_CHECK(options_.small_segment >= options_.small_size &&
                 options_.small_segment % options_.min_block == 0 &&
                 options_.large_segment % options_.min_block == 0 &&
                 options_.round_large % options_.min_block == 0,
             "segment sizes must hold the largest small block and be multiples of min_block");
}

CachingAllocator::~CachingAllocator() {
  if (!live_.empty())
    WEFT_WARN("memory", "caching allocator destroyed with ", live_.size(), " live blocks");
  for (auto& [start, seg] : segments_) {
    for (Block* b = seg.head; b;) {
      Block* next = b->next;
      delete b;
      b = next;
    }
    source_->release(start, seg.bytes);
  }
}

size_t CachingAllocator::round_size(size_t bytes) const {
  return bytes < options_.min_block ? options_.min_block : round_up(bytes, options_.min_block);
}

size_t CachingAllocator::segment_size(size_t rounded) const {
  if (rounded <= options_.small_size) return options_.small_segment;
  if (rounded < options_.min_large_alloc) return std::max(options_.large_segment, rounded);
  return round_up(rounded, options_.round_large);
}

CachingAllocator::Block* CachingAllocator::take_free_block(bool small, size_t size) {
  Pool& pool = pool_of(small);
  Block key{nullptr, size, 0, false, small};
  auto it = pool.lower_bound(&key);  // smallest size >= request, lowest address among equals
  if (it == pool.end()) return nullptr;
  Block* b = *it;
  // PyTorch's two max_split_size rules: do not carve a small request out of an unsplittable
  // block, and do not hand a big request a block much larger than it.
  if (size < options_.max_split_size && b->size >= options_.max_split_size) return nullptr;
  if (size >= options_.max_split_size && b->size >= size + options_.large_segment) return nullptr;
  pool.erase(it);
  return b;
}

CachingAllocator::Block* CachingAllocator::reserve_segment(bool small, size_t size) {
  size_t bytes = segment_size(size);
  char* p = static_cast<char*>(source_->reserve(bytes));
  if (!p) {
    // As PyTorch does on a cudaMalloc failure: give the cache back and try once more.
    caching_.num_alloc_retries++;
    release_cached_segments();
    p = static_cast<char*>(source_->reserve(bytes));
  }
  if (!p) {
    caching_.num_ooms++;
    throw std::bad_alloc();
  }
  Block* b = new Block{p, bytes, 0, false, small};
  segments_.emplace(p, Segment{bytes, small, b});
  stats_.bytes_reserved += bytes;
  caching_.num_segments++;
  caching_.num_segment_reserves++;
  return b;
}

bool CachingAllocator::should_split(const Block* b, size_t size) const {
  size_t remaining = b->size - size;
  if (b->small) return remaining >= options_.min_block;
  return size < options_.max_split_size && remaining > options_.small_size;
}

void* CachingAllocator::allocate(size_t bytes, Tag) {
  std::lock_guard<std::mutex> lock(mu_);
  size_t size = round_size(bytes);
  bool small = size <= options_.small_size;
  Block* b = take_free_block(small, size);
  if (!b) b = reserve_segment(small, size);
  if (should_split(b, size)) {
    Block* rest = new Block{b->ptr + size, b->size - size, 0, false, b->small, b, b->next};
    if (b->next) b->next->prev = rest;
    b->next = rest;
    b->size = size;
    pool_of(small).insert(rest);
  }
  b->allocated = true;
  b->requested = bytes;
  live_.insert(b->ptr, b);
  stats_.bytes_live += bytes;
  stats_.num_allocs++;
  caching_.bytes_allocated += b->size;
  note_peaks();
  return b->ptr;
}

void CachingAllocator::free(void* ptr) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(ptr);
  WEFT_CHECK(it != live_.end(), "CachingAllocator::free of a pointer it did not allocate: ", ptr);
  Block* b = it->second;
  live_.erase(it);
  stats_.bytes_live -= b->requested;
  stats_.num_frees++;
  caching_.bytes_allocated -= b->size;
  b->allocated = false;
  b->requested = 0;
  Pool& pool = pool_of(b->small);
  // Merge with free neighbours of the same segment; the lower block absorbs the higher
  // one so that a segment's head block never changes.
  if (Block* next = b->next; next && !next->allocated) {
    pool.erase(next);
    b->size += next->size;
    b->next = next->next;
    if (b->next) b->next->prev = b;
    delete next;
  }
  if (Block* prev = b->prev; prev && !prev->allocated) {
    pool.erase(prev);
    prev->size += b->size;
    prev->next = b->next;
    if (prev->next) prev->next->prev = prev;
    delete b;
    b = prev;
  }
  pool.insert(b);
  if (release_freed_ && !b->prev && !b->next) release_segment(b);
}

void CachingAllocator::release_segment(Block* head) {
  auto it = segments_.find(head->ptr);
  WEFT_CHECK(it != segments_.end() && it->second.head == head, "no segment starts at block ",
             static_cast<void*>(head->ptr));
  pool_of(head->small).erase(head);
  source_->release(it->first, it->second.bytes);
  stats_.bytes_reserved -= it->second.bytes;
  caching_.num_segments--;
  caching_.num_segment_releases++;
  delete head;
  segments_.erase(it);
}

void CachingAllocator::release_cached_segments() {
  for (auto it = segments_.begin(); it != segments_.end();) {
    Block* head = (it++)->second.head;  // advanced first: the release erases the entry
    if (!head->allocated && !head->next) release_segment(head);  // one free block: the segment
  }
}

void CachingAllocator::release_as_freed() {
  std::lock_guard<std::mutex> lock(mu_);
  release_freed_ = true;
  release_cached_segments();
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  release_cached_segments();
}

void CachingAllocator::note_peaks() {
  stats_.bytes_live_peak = std::max(stats_.bytes_live_peak, stats_.bytes_live);
  stats_.bytes_reserved_peak = std::max(stats_.bytes_reserved_peak, stats_.bytes_reserved);
}

bool CachingAllocator::owns(const void* ptr) const {
  std::lock_guard<std::mutex> lock(mu_);
  return live_.contains(ptr);
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

CachingStats CachingAllocator::caching_stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  CachingStats c = caching_;
  c.bytes_inactive_split = 0;
  for (const auto& [start, seg] : segments_) {
    bool any_live = false;
    size_t free_bytes = 0;
    for (const Block* b = seg.head; b; b = b->next) {
      any_live |= b->allocated;
      if (!b->allocated) free_bytes += b->size;
    }
    if (any_live) c.bytes_inactive_split += free_bytes;
  }
  return c;
}

std::vector<CachingSegmentInfo> CachingAllocator::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<CachingSegmentInfo> out;
  for (const auto& [start, seg] : segments_) {
    CachingSegmentInfo info{reinterpret_cast<uintptr_t>(start), seg.bytes, seg.small, {}};
    for (const Block* b = seg.head; b; b = b->next)
      info.blocks.push_back({size_t(b->ptr - start), b->size, b->requested, b->allocated});
    out.push_back(std::move(info));
  }
  return out;
}

}  // namespace weft::memory
