// Helpers the benchmarks share: the driver side of `weft bench train` (one measurement
// process per (config, threads) for Weft and for PyTorch, the CPU's FMA peak, the table), and
// one layout trained on real local ranks under `weft run` with its step times read back
// (`weft bench scaling` and `weft bench search`).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

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

// The median and the lower quartile (nearest rank) of `v`; NaN when empty.
double median(std::vector<double> v);
double quartile1(std::vector<double> v);

// Bytes per second of one thread's memcpy between two buffers of `bytes`, both written
// before (touched memory: a copy that faults nothing), best of `tries`.
double memcpy_bytes_per_second(size_t bytes, int tries = 5);

// The overrides of a short timing run: `steps` steps, warm-up below the step count
// (validation wants it), no evaluation, no log lines, one thread per rank, output in `out`.
std::vector<std::string> short_run_sets(int steps, const std::string& out);

// Step times of one layout trained on real ranks (metrics step_ms of steps 1..steps-1: the
// first pays for first-touch and connections). Times in ms; NaN where not measured.
struct LayoutTimes {
  double q1_ms, median_ms, tokens_per_s, compute_ms, comm_ms;  // compute/comm: rank 0's q1
  std::string error;    // non-empty: no usable timings (the log is kept and named)
  std::string warning;  // the run exited badly after writing every step: timings kept
  // The means of the same steps: step_ms, and rank 0's compute_ms and comm_ms.
  double mean_ms = std::nan(""), compute_mean_ms = std::nan(""), comm_mean_ms = std::nan("");
};

// Runs `weft train --config config --set ...` (sets, then short_run_sets(steps)) on `world`
// local processes under `weft run --standalone`, one BLAS thread each and the plan executor
// at world 1 too (WEFT_PLAN_EXECUTOR), the rest of the environment (OPENBLAS_CORETYPE) as
// it is. Blocks until the run exits; its temporary folder is removed unless something
// failed. Never throws: failures land in `error`. `tag` names the temporary folder.
LayoutTimes run_layout(const std::string& config, const std::vector<std::string>& sets, int world,
                       int steps, const std::string& tag);

}  // namespace weft::launch
