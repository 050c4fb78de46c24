// Layout invariance with real processes: the single-process core::Trainer as the reference,
// then the same job on N forked ranks (Gloo over 127.0.0.1) through parallel::ParallelTrainer,
// comparing every step's loss and the gathered final weights.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/config/job_spec.h"
#include "planner/cost.h"

namespace weft::test {

// Relative tolerances, a few times the deviations measured over 30 steps on every layout of
// layout_long_test.cc: f32 sums regrouped by a layout (dp, pp, ep, ZeRO) move the loss, the
// gradient norm and the balance loss by at most 6e-8 and the final weights by 3e-7;
// splitting a reduction inside a kernel (tp) moves the weights by up to 1.6e-6. On an AMD
// EPYC host (OpenBLAS's Zen kernels, 2026-12-05) a tp2 step's gradient norm moved by 2.2e-7
// (NonfiniteLayout.Tp2: 1.9158053 against 1.9158049, two f32 ulps), so kSplit's scalars
// allow 5e-7: a dropped or doubly applied step moves them by percents. On a host whose CPU
// OpenBLAS 0.3.21 does not recognise (a VM's "Intel(R) Xeon(R) Processor" with AVX-512 and
// AMX, 2026-12-06: it falls back to its Prescott kernels when OPENBLAS_CORETYPE is unset) tp2
// and tp2 x pp2 moved the final weights by 5.72e-6 (SkylakeX's kernels there: 4.7e-6;
// Haswell's: 6.4e-7), so kSplit's weights allow 1e-5.
struct Tolerance {
  double scalars;  // per step's loss, gradient norm and balance loss: |x - ref| / |ref|
  double weights;  // final weights: max |w - ref| / max |ref| over all parameters
};
inline constexpr Tolerance kRegroup{2e-7, 1e-6}, kSplit{5e-7, 1e-5};

struct LayoutCase {
  std::string config;  // under configs/
  int world = 1;
  std::vector<std::string> overrides;  // --set style, e.g. "parallel.tp=2"
  int steps = 6;
  Tolerance tolerance = kRegroup;
  // Plan with this cost model instead of the trainer's (nodes of a few ranks, no latency):
  // the choices a multi-node job of large tensors makes (pipeline traffic across nodes)
  // then run here too, on this model's small tensors.
  std::optional<planner::CostModel> cost;
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
