// CachingAllocator: the baseline the field uses, modelled on PyTorch's CUDA caching
// allocator (c10/cuda/CUDACachingAllocator.cpp) so that comparisons with it are fair.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <unordered_map>
#include <vector>

#include "memory/allocator.h"
#include "memory/pointer_map.h"
#include "memory/segment_source.h"

namespace weft::memory {

// PyTorch's constants and its max_split_size knob; the defaults are PyTorch's.
struct CachingOptions {
  size_t min_block = 512;             // every request is rounded up to this (kMinBlockSize)
  size_t small_size = 1 << 20;        // requests <= this use the small pool (kSmallSize)
  size_t small_segment = 2 << 20;     // segment size of the small pool (kSmallBuffer)
  size_t large_segment = 20 << 20;    // segment for requests below min_large_alloc (kLargeBuffer)
  size_t min_large_alloc = 10 << 20;  // from here on a segment is the request (kMinLargeAlloc)
  size_t round_large = 2 << 20;       // ... rounded up to this (kRoundLarge)
  size_t max_split_size = SIZE_MAX;   // blocks this large are never split (max_split_size_mb)
};

// What the caching allocator holds, for tests and `memory_snapshot()`-style reports.
struct CachingBlockInfo {
  size_t offset = 0;     // from the segment start
  size_t size = 0;       // bytes of the block (rounded)
  size_t requested = 0;  // bytes asked for; 0 when free
  bool allocated = false;
};
struct CachingSegmentInfo {
  uintptr_t address = 0;
  size_t bytes = 0;
  bool small = false;
  std::vector<CachingBlockInfo> blocks;  // in address order, covering the segment
};
struct CachingStats {
  size_t num_segments = 0;
  size_t bytes_allocated = 0;       // live bytes as rounded blocks
  size_t bytes_inactive_split = 0;  // free bytes in segments that still hold a live block
  size_t num_segment_reserves = 0;
  size_t num_segment_releases = 0;
  size_t num_alloc_retries = 0;  // reserve failed, cache flushed, tried again
  size_t num_ooms = 0;
};

// Pools, rounding and splitting follow PyTorch:
// - a request is rounded up to a multiple of min_block; <= small_size goes to the small
//   pool, served from small_segment segments; larger ones go to the large pool, served
//   from large_segment segments below min_large_alloc and from segments of the request
//   rounded up to round_large above;
// - a free block is found best-fit (smallest block that fits, then lowest address) in a
//   size-ordered set; it is split when the remainder is >= min_block (small pool) or
//   > small_size (large pool), and the remainder goes back to the pool;
// - a freed block merges with free neighbours of the same segment; segments never merge,
//   which is where the order-dependent fragmentation of this design comes from;
// - when the source is exhausted, the allocator releases every cached segment without a
//   live block and retries once before throwing std::bad_alloc.
// One stream, so a freed block is reusable at once. Thread-safe (one mutex).
class CachingAllocator final : public Allocator {
 public:
  // `source` must outlive the allocator; nullptr uses default_host_segment_source().
  explicit CachingAllocator(CachingOptions options = {}, SegmentSource* source = nullptr);
  // Releases every segment. Blocks still live are a caller's bug; they become dangling.
  ~CachingAllocator() override;
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  void* allocate(size_t bytes, Tag tag = Tag::kOther) override;
  void free(void* ptr) override;
  AllocatorStats stats() const override;
  std::string name() const override { return "caching"; }

  // Returns every segment that holds no live block to the source (torch.cuda.empty_cache).
  void empty_cache();
  // For an arena whose owner is gone while some blocks are still live (a send in flight
  // keeps its buffer until its communicator drops it): returns every segment without a live
  // block now, and each other one as soon as its last block is freed, instead of caching
  // them for requests that will not come. Requests still work (they reserve anew).
  void release_as_freed();
  // True when `ptr` is a live block of this allocator (lets a wrapper route a free).
  bool owns(const void* ptr) const;
  CachingStats caching_stats() const;
  std::vector<CachingSegmentInfo> snapshot() const;  // segments in address order
  const CachingOptions& options() const { return options_; }

 private:
  struct Block {
    char* ptr;
    size_t size;
    size_t requested = 0;
    bool allocated = false;
    bool small;
    Block* prev = nullptr;  // neighbours in the same segment, in address order
    Block* next = nullptr;
  };
  struct BySizeThenAddress {
    bool operator()(const Block* a, const Block* b) const {
      return a->size != b->size ? a->size < b->size : a->ptr < b->ptr;
    }
  };
  using Pool = std::set<Block*, BySizeThenAddress>;

  size_t round_size(size_t bytes) const;
  size_t segment_size(size_t rounded) const;
  Pool& pool_of(bool small) { return small ? small_pool_ : large_pool_; }
  Block* take_free_block(bool small, size_t size);
  Block* reserve_segment(bool small, size_t size);
  bool should_split(const Block* b, size_t size) const;
  void release_cached_segments();  // callers hold mu_
  // Returns the segment whose one free block is `head` (callers hold mu_).
  void release_segment(Block* head);
  void note_peaks();

  CachingOptions options_;
  SegmentSource* source_;
  mutable std::mutex mu_;
  Pool small_pool_, large_pool_;
  struct Segment {
    size_t bytes;
    bool small;
    Block* head;  // the lowest block; merges keep the lower block, so this never changes
  };
  bool release_freed_ = false;         // release_as_freed(): no caching from now on
  PointerMap<Block*> live_;            // allocated blocks by pointer
  std::map<char*, Segment> segments_;  // by start address
  AllocatorStats stats_;
  CachingStats caching_;
};

}  // namespace weft::memory
