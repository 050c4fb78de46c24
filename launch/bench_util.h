// The driver side of `weft bench train`: spawns one measurement process per (config,
// threads) for Weft and for PyTorch, measures the CPU's FMA peak, prints the table.
#pragma once

#include <cstdint>
#include <string>

#include "launch/args.h"

namespace weft::launch {

// One model of `weft bench train`: the same shapes on the Weft and the PyTorch side.
struct TrainBenchConfig {
  const char* name;
  const char* arch;  // gpt | llama
  int64_t layers, dim, heads, seq, batch, vocab;
  int64_t kv_heads, ffn_dim;  // llama only: key/value heads, SwiGLU width
};
// The config called `name` (S, M, LS), or nullptr.
const TrainBenchConfig* find_train_config(const std::string& name);
// "S, M, LS", for messages.
std::string train_config_names();

int run_train_comparison(const Args& a);
// Peak single-precision GFLOP/s of `threads` cores from a register-resident FMA loop.
double fma_peak_gflops(int threads);

}  // namespace weft::launch
