// Layout invariance with real processes: the single-process core::Trainer as the reference,
// then the same job on N forked ranks (Gloo over 127.0.0.1) through parallel::ParallelTrainer,
// comparing every step's loss and the gathered final weights.
#pragma once

#include <string>
#include <vector>

#include "core/config/job_spec.h"

namespace weft::test {

struct LayoutCase {
  std::string config;  // under configs/
  int world = 1;
  std::vector<std::string> overrides;  // --set style, e.g. "parallel.tp=2"
  int steps = 6;
  double tolerance = 1e-5;  // relative: per step's loss and grad norm; weights normwise
};

struct LayoutOutcome {
  bool ran = false;
  std::string failure;        // run_ranks' summary when a rank failed
  double max_loss_rel = 0;    // worst |loss - ref| / |ref| over the steps
  double max_weight_rel = 0;  // max |w - ref| / max |ref| over all parameters
  double max_norm_rel = 0;    // the gradient norm likewise
  double max_aux_rel = 0;     // MoE balance loss likewise (0 for GPT)
  std::vector<double> losses, reference;
};

// Loads configs/<config> with the overrides (threads 1, eval off).
core::JobSpec layout_spec(const LayoutCase& c);

// Trains `c.steps` steps on one process and on `c.world` ranks and compares.
LayoutOutcome run_layout(const LayoutCase& c);

// Checks an outcome against its tolerance with GoogleTest assertions, printing the
// deviations (so a test log doubles as the table of measured deviations).
void expect_invariant(const LayoutCase& c, const LayoutOutcome& o);

}  // namespace weft::test
