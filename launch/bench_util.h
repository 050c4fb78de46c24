// The driver side of `weft bench train`: spawns one measurement process per (config,
// threads) for Weft and for PyTorch, measures the CPU's FMA peak, prints the table.
#pragma once

#include "launch/args.h"

namespace weft::launch {

int run_train_comparison(const Args& a);
// Peak single-precision GFLOP/s of `threads` cores from a register-resident FMA loop.
double fma_peak_gflops(int threads);

}  // namespace weft::launch
