// Whether memory was faulted in or found resident: the tests of the allocators that keep
// pages for later blocks (reshape, recycling, an arena's segments) and of populate.
#pragma once

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace weft::test {

// Resident pages of [p, p + bytes), by mincore (0 when mincore refuses the range).
inline size_t resident_pages(const void* p, size_t bytes) {
  const size_t page = size_t(::sysconf(_SC_PAGESIZE));
  const auto at = reinterpret_cast<uintptr_t>(p);
  const uintptr_t lo = at / page * page;
  const size_t n = (at + bytes - lo + page - 1) / page;
  std::vector<unsigned char> v(n);
  if (::mincore(reinterpret_cast<void*>(lo), n * page, v.data()) != 0) return 0;
  size_t r = 0;
  for (unsigned char c : v) r += c & 1;
  return r;
}

// This thread's minor page faults so far (other threads' do not count).
inline size_t thread_minor_faults() {
  rusage u{};
  ::getrusage(RUSAGE_THREAD, &u);
  return size_t(u.ru_minflt);
}

}  // namespace weft::test
