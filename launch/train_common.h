// What weft train's single-process loop and its multi-rank loop share: the stop signals,
// the progress line's pieces, checkpoint.every's rule, the restart banner.
#pragma once

#include <csignal>
#include <cstdint>
#include <string>

#include "core/config/job_spec.h"
#include "core/exec/trainer.h"
#include "core/io/metrics.h"
#include "parallel/launch_env.h"

namespace weft::launch {

// Set by SIGINT and SIGTERM once catch_stop_signals() ran: stop after the current step, with
// a final checkpoint (what schedulers send before they kill).
extern volatile std::sig_atomic_t g_train_stop;
void catch_stop_signals();

// The progress line's balance cell: MoE models with a balance loss show it (loss_free has
// none to show).
std::string aux_cell(const core::JobSpec& spec, double aux);

// Whether checkpoint.every saved at `done` steps (TrainerCheckpoints::after_step's rule).
bool saved_by_every(const core::JobSpec& spec, int64_t done);

inline double mib(size_t bytes) { return double(bytes) / (1024.0 * 1024.0); }

// A step's metrics line without its extras: the statistics, tokens/s over `secs`, the world
// that trained it, the membership epoch and the pass over the data (`data_epoch`).
core::io::StepMetrics step_metrics(const core::StepStats& st, double secs, int64_t world,
                                   int64_t epoch, int64_t data_epoch);

// Under weft run after a restart: which attempt this is and where it picks the job up.
void print_attempt(const core::JobSpec& spec, const parallel::LaunchEnv& env,
                   const std::string& resume);

}  // namespace weft::launch
