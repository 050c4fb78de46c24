// weft train on several ranks: every rank trains its part of the plan; rank 0 prints the
// progress line, writes the metrics and the run folder, and validates. Under weft run with
// elastic.on_change: reshard the worker outlives its world: when the membership changes it
// moves to the next epoch's world at a step boundary and the router hands it the new
// layout's state (live_resize.h), so the run goes on without a restart.
#pragma once

#include "core/config/job_spec.h"
#include "launch/args.h"
#include "parallel/launch_env.h"

namespace weft::launch {

int train_ranks(const Args& args, const core::JobSpec& spec, const parallel::LaunchEnv& env);

}  // namespace weft::launch
