// Mapping pages in ahead of their use (MADV_POPULATE_READ / MADV_POPULATE_WRITE, Linux 5.14),
// in pieces.
//
// Why pieces: one madvise call holds the process's mmap lock (read side) for its whole range,
// and anything that changes the address space (a thread's stack, an mmap or munmap, a large
// malloc or free) waits for the writer side until the call ends; once a writer waits, every
// page fault of every other thread waits behind it too. A recovering survivor populates
// hundreds of MiB on one thread (its next layout's blocks, a snapshot slot) while its entry
// starts threads and maps segments on another: 600 MiB in one call held a thread's creation
// for 472-578 ms on the bench host (load 6), in 4 MiB pieces for at most 5-15 ms.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace weft {

enum class PageAccess { kRead, kWrite };

// The most one madvise call of populate_pages maps in.
inline constexpr size_t kPopulatePieceBytes = size_t(4) << 20;

// The [begin, end) address ranges populate_pages hands the kernel for `bytes` at `p` with
// pages of `page` bytes: the whole pages inside the range, at most kPopulatePieceBytes each
// and every piece but the last a multiple of `page`, in order. Empty when no whole page fits.
std::vector<std::pair<uintptr_t, uintptr_t>> populate_pieces(const void* p, size_t bytes,
                                                             size_t page);

// Maps the whole pages of [p, p + bytes) in for `access`, piece by piece (populate_pieces).
// Returns 0, or the errno of the first piece that failed (EINVAL: a kernel before 5.14, whose
// pages then fault in as they are used; ENOMEM or EFAULT: out of memory, or not mapped so).
// The partial pages at both ends are left alone: a caller that writes them faults them.
int populate_pages(void* p, size_t bytes, PageAccess access);

}  // namespace weft
