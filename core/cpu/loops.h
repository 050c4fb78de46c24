// Internal helpers shared by the CPU kernels (not part of the kernels API): the
// static column partition used by reductions over rows, and argument checks that
// must run before a parallel region (an exception may not leave an OpenMP region).
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>

#include "base/check.h"

namespace weft::core::cpu::detail {

// Below this many element operations a parallel region costs more (fork, join, and
// spinning threads on a shared machine) than it saves; such calls run on one thread.
// Rows and columns are owned the same way either way, so results do not change.
inline constexpr int64_t kMinParallelWork = int64_t(1) << 15;
inline bool worth_threads(int64_t work) { return work >= kMinParallelWork; }

// Splits [0, cols) into one contiguous range per thread (multiples of 16 elements,
// so every thread starts on a cache line) and calls f(c0, c1) on each. Each column is
// owned by exactly one thread that visits the rows in order, so a reduction over rows
// done inside f gives the same bits for every thread count.
// `work` is the total element count (rows x cols) for the kMinParallelWork cut-off.
template <typename F>
void parallel_columns(int64_t cols, int64_t work, F&& f) {
  constexpr int64_t kAlign = 16;
  const int64_t units = (cols + kAlign - 1) / kAlign;
#pragma omp parallel if (parallel : worth_threads(work))
  {
    const int64_t nt = omp_get_num_threads(), tid = omp_get_thread_num();
    const int64_t u0 = units * tid / nt, u1 = units * (tid + 1) / nt;
    const int64_t c0 = std::min(cols, u0 * kAlign), c1 = std::min(cols, u1 * kAlign);
    if (c0 < c1) f(c0, c1);
  }
}

// Token ids / targets must lie in [0, V); checked serially before any parallel work.
inline void check_ids(const int32_t* ids, int64_t n, int64_t V, const char* what) {
  for (int64_t i = 0; i < n; ++i)
    WEFT_CHECK(ids[i] >= 0 && ids[i] < V, what, " ", ids[i], " at position ", i,
               " is outside the vocabulary [0, ", V, ")");
}

}  // namespace weft::core::cpu::detail
