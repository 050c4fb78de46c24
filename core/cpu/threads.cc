// Thread counts for the CPU kernels: OpenMP for our loops, OpenBLAS for GEMM.
// The OpenMP build of OpenBLAS runs single-threaded inside our parallel regions,
// so the two never oversubscribe each other.
#include <cblas.h>
#include <omp.h>

#include "base/check.h"
#include "core/cpu/kernels.h"

namespace weft::core::cpu {

void set_num_threads(int n) {
  WEFT_CHECK(n >= 0, "set_num_threads(", n, "): expected 0 (keep default) or a positive count");
  if (n == 0) return;
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

int num_threads() { return omp_get_max_threads(); }

}  // namespace weft::core::cpu
