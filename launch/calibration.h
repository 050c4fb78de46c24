// Measures this machine for the cost model (what `weft calibrate` writes to the machine's
// cache and `weft bench scaling` predicts with): single-thread GEMM rates at several shapes,
// memcpy and a memory-bound kernel, Gloo collectives between processes under `weft run`
// (one process per rank, as the trainer runs) at 2, 4 and 8 ranks, and the executor's cost per
// instruction from a small model's world-1 steps.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/config/job_spec.h"
#include "planner/hardware.h"

namespace weft::launch {

struct CalibrationOptions {
  // World sizes of the Gloo probe (even, >= 2): 2 fits the link terms; the first world above
  // this machine's cores fits launch_oversub and sync_wait_oversub_by_burst, the largest
  // above that sync_wait_oversub_more_by_burst (its probe runs the step-like loop only).
  std::vector<int> probe_worlds = {2, 4, 8};
  // Probes per world; each call's time keeps the least, each step-like loop (sync_*) the
  // median (about 1-2 s a probe).
  int probe_repeats = 3;
  // Receives one line per measurement as it finishes (progress); may be empty.
  std::function<void(const std::string&)> progress;
};

// Measures and fits. The result names this machine (planner::this_machine()) and records
// every raw measurement; efficiencies are 1 (the rates are sustained, as measured). Throws
// Error when the communication probe fails (its log is kept and named), when its collectives
// contradict themselves after re-measuring (calibration_recheck.h), or when the model fitted
// from them does (planner/description_check.h).
planner::Hardware calibrate_machine(const CalibrationOptions& opt = {});

// Runs the communication probe on `n` processes of this machine (`weft calibrate --probe`
// under `weft run --standalone`): name -> seconds. Empty on failure, with a message on stderr.
// waits_only: the step-like loop alone (sync_*), without the collectives' sizes.
std::map<std::string, double> probe_collectives(int n, bool waits_only = false);
// `weft calibrate --probe FILE [--waits-only]`, on every rank: rank 0 writes `name seconds`
// lines to FILE.
int probe_worker(const std::string& path, bool waits_only = false);

// Median step of `steps` in-process steps at world 1 (after one warm-up), ms: through the
// single-process trainer, or (multi_rank) the plan executor on a one-rank loopback world.
// cpu_ms (optional) receives the median of the same steps' CPU time of the process: what a
// step took of the cores, without the time other processes held them.
double world1_step_ms(const core::JobSpec& spec, bool multi_rank, int steps,
                      double* cpu_ms = nullptr);

// The running `weft` binary, and a word quoted for sh -c: how the probes and the scaling
// bench start `weft run`.
std::string self_exe();
std::string shell_quote(const std::string& s);

}  // namespace weft::launch
