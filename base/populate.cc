// Mapping pages in ahead of their use, in pieces (populate.h).
#include "base/populate.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace weft {

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22  // Linux 5.14; older headers lack the names
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

std::vector<std::pair<uintptr_t, uintptr_t>> populate_pieces(const void* p, size_t bytes,
                                                             size_t page) {
  std::vector<std::pair<uintptr_t, uintptr_t>> out;
  const auto at = reinterpret_cast<uintptr_t>(p);
  const uintptr_t lo = (at + page - 1) / page * page, hi = (at + bytes) / page * page;
  const uintptr_t piece = std::max<uintptr_t>(kPopulatePieceBytes / page * page, page);
  for (uintptr_t from = lo; from < hi; from += piece) out.push_back({from, std::min(hi, from + piece)});
  return out;
}

int populate_pages(void* p, size_t bytes, PageAccess access) {
  const int advice = access == PageAccess::kWrite ? MADV_POPULATE_WRITE : MADV_POPULATE_READ;
  for (const auto& [from, to] : populate_pieces(p, bytes, size_t(::sysconf(_SC_PAGESIZE))))
    if (::madvise(reinterpret_cast<void*>(from), to - from, advice) != 0) return errno;
  return 0;
}

}  // namespace weft
