// Element-wise reduction kernels that CPU backends plug into their engines (Gloo's reduce
// function, MPI user ops for bf16) and the avg step they apply after a sum.
#pragma once

#include <cstddef>

#include "comm/communicator.h"
#include "core/dtype.h"

namespace weft::comm {

// out[i] = a[i] op b[i] for n elements; out may alias a or b. kAvg reduces as kSum (divide
// afterwards with divide_elements). bf16 goes through f32 with round-to-nearest-even per step.
void reduce_elements(void* out, const void* a, const void* b, size_t n, core::DType dtype,
                     ReduceOp op);

// data[i] /= divisor in place: exact IEEE division for f32/f64, through f32 for bf16,
// truncation toward zero for integers.
void divide_elements(void* data, size_t n, core::DType dtype, int divisor);

}  // namespace weft::comm
