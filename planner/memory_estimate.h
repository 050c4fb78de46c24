// Whether a job fits in memory, decided before anything is allocated: a closed-form
// estimate of one rank's bytes (the planner's tensor shapes, summed without building the
// graph, so a 100000-layer model is judged in microseconds) against what the machine has.
#pragma once

#include <cstdint>
#include <string>

#include "core/config/job_spec.h"
#include "planner/mesh.h"

namespace weft::planner {

// Bytes one rank holds at its peak, by kind (f32: the CPU trainers' dtype).
struct MemoryEstimate {
  double parameters = 0;   // the rank's weights (its tp/pp/ep share; / dp under zero 3)
  double gradients = 0;    // their gradients (/ dp under zero >= 2)
  double optimizer = 0;    // Adam's two moments (/ dp under zero >= 1)
  double activations = 0;  // saved for backward over the micro-batches in flight, plus the
                           // backward's working set of one layer and the logits
  double total() const { return parameters + gradients + optimizer + activations; }
};

// The largest rank's estimate for `spec` on `world` ranks. world 1 is the single-process
// trainer (the parallel: section does not apply); world > 1 resolves the degrees as the
// planner does (ConfigError for degrees that do not fit the world). Activations come out
// within about a third above the measured peak on the shipped configs (gpt-small: 57 MB
// estimated, 43 MiB measured); the process's fixed ~200 MiB (libraries, threads), the
// graph and the data are not counted, so the check only refuses what cannot fit.
MemoryEstimate estimate_memory(const core::JobSpec& spec, int world);

// One pipeline stage's share, for the plan search, which weighs stages of other sizes than
// an even split: `layers` of the model's layers (their average size), the embedding when
// `first`, the final norm and the head when `last` (a tied head keeps its own copy of the
// embedding on a later stage), and `in_flight` micro-batches of activations saved at once.
// Same counts as estimate_memory; zero shards over the data-parallel ranks; with
// `sequence_parallel` the activations tp replicates (norms, residuals) are cut by tp too.
struct StageShape {
  int64_t layers = 1;
  bool first = true, last = true;
  int64_t in_flight = 1;
};
MemoryEstimate estimate_stage_memory(const core::ModelSpec& m, const Degrees& deg, int zero,
                                     int64_t micro_batch, const std::string& recompute,
                                     const StageShape& stage, bool sequence_parallel = false);

// MemAvailable from /proc/meminfo in bytes; -1 when the file cannot be read.
int64_t available_memory_bytes();

// Throws ConfigError("model", ...) when estimate_memory exceeds the memory one rank may use:
// memory.limit_gib when set, else MemAvailable / `ranks_on_node`. The message names what
// the job needs by kind, what the machine has, and what to change. Does nothing when
// neither limit is known (no /proc/meminfo and no memory.limit_gib).
void check_fits_memory(const core::JobSpec& spec, int world, int ranks_on_node);

}  // namespace weft::planner
