// Large copies whose destination is not read again soon (a snapshot into its shared-memory
// slot): stores that bypass the caches, so the copy neither reads every destination line
// before writing it (a plain store's read-for-ownership) nor leaves the destination in the
// caches the training uses. A 25 MiB snapshot with its checksums took 1.52-1.63 ms this
// way against 1.69-1.77 ms with memcpy on this machine's EPYC (32 MiB L3).
#pragma once

#include <cstddef>

namespace weft {

// Copies `n` bytes from `src` to `dst` (not overlapping) with non-temporal stores where the
// CPU has them (x86: SSE2 and up), memcpy elsewhere and for small copies. Ends with a store
// fence, so the bytes are ordered before any later store (a commit flag) as memcpy's are.
void stream_copy(void* dst, const void* src, size_t n);

}  // namespace weft
