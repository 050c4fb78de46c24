// Big host blocks in transparent huge pages. A block of at least kHugeMinBytes gets a mapping
// of its own that starts at a 2 MiB boundary and is advised MADV_HUGEPAGE: hosts commonly set
// transparent huge pages to `madvise` (given only to advised ranges), and a block in 2 MiB
// pages takes one page fault per 2 MiB instead of 512, and its copies and GEMMs miss the
// TLB far less. The tail past its last 2 MiB boundary stays in 4 KiB pages. Smaller blocks
// come from malloc as before. HostAllocator (tensors) and HostSegmentSource (the caching
// and planned arenas' segments) both allocate their blocks here.
#pragma once

#include <cstddef>

namespace weft::memory {

inline constexpr size_t kHugeBytes = size_t(2) << 20;
// The smallest block mapped in huge pages: glibc's largest mmap threshold, above which malloc
// maps (and faults in) every block anew anyway. Below it malloc reuses freed heap memory
// without faults, which a mapping per block would give up: at 2 MiB, a training step of
// configs/gpt-small.yaml at dim 512 (blocks of 2-8 MiB) ran 2.3x slower.
inline constexpr size_t kHugeMinBytes = size_t(32) << 20;

// `bytes` aligned to `alignment` (at most 4096; a big block is aligned to 2 MiB whatever
// it asks), or nullptr when the system has no memory for it.
void* allocate_host_block(size_t bytes, size_t alignment);
// A block from allocate_host_block with the same `bytes`.
void free_host_block(void* p, size_t bytes);

// Block `p` of `old_bytes` from allocate_host_block made a block of `new_bytes` that keeps its
// pages: the first min(old, new) bytes are p's, resident as they were (a shrink unmaps the
// tail; a grow extends the mapping, moving it, page tables and all, to a 2 MiB boundary when
// the range after it is taken, and the added tail is fresh). A freed block of one size and a
// request of another then cost the pages the sizes differ by, not a whole block of fresh
// ones (a resize's old and new layouts: memory::RecyclingAllocator). Only where both sizes
// are at least kHugeMinBytes (a mapping of its own); otherwise, or when the system refuses,
// nullptr and `p` is unchanged.
void* reshape_host_block(void* p, size_t old_bytes, size_t new_bytes);

}  // namespace weft::memory
