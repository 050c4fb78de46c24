// `weft bench memory`: caching allocator vs the offline plan on traces recorded from real
// training steps of Weft's trainer, plus modelled pipeline traces where the real ones
// need the multi-rank runtime.
#pragma once

#include "launch/args.h"

namespace weft::launch {

int run_memory_comparison(const Args& a);

}  // namespace weft::launch
