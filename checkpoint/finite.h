// The last line of defence against saving a diverged run: a scan of the bytes about to be
// written for NaN and infinities, run on each box right after it is gathered (in cache).
#pragma once

#include <cstdint>
#include <string>

#include "base/error.h"
#include "core/dtype.h"

namespace weft::checkpoint {

// A save refused because a state tensor holds a non-finite value. A run-time failure (exit
// 1); `weft ckpt import` turns it into a ConfigError naming its input file.
class NonFiniteStateError : public Error {
 public:
  using Error::Error;
};

// The number of NaN and infinite elements among `n` elements of `dtype` at `data` (0 for
// integer dtypes). Reads the exponent bits only, so it is one cheap vectorisable pass.
int64_t count_non_finite(const void* data, int64_t n, core::DType dtype);

}  // namespace weft::checkpoint
