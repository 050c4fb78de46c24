// What `weft train` does with the job file's elastic and snapshot sections, and where a
// worker that weft run restarted picks the job up (elastic.on_change: restart).
#pragma once

#include <csignal>
#include <optional>
#include <string>

#include "core/config/job_spec.h"
#include "launch/epoch_notice.h"
#include "parallel/launch_env.h"

namespace weft::launch {

// ConfigError, naming the key, for a job-file setting that would do nothing where this
// worker runs: snapshot.redundancy without snapshots, replica on fewer than 2 nodes, ec on
// fewer than k + m (--nnodes MAX), snapshot.ec without redundancy: ec, and the elastic keys
// of a fixed world (below). Also checks elastic.min_nodes/max_nodes, when set, against the
// node range weft run was started with (--nnodes MIN:MAX): they must agree.
void refuse_unsupported_job_settings(const core::JobSpec& spec, const parallel::LaunchEnv& env);

// ConfigError naming the first elastic key (min_nodes, max_nodes, on_change, old_state,
// transfer_connections) set to other than its default when `launcher` (LaunchEnv::launcher)
// is not weft run: mpirun, srun and a lone process have a fixed world, where they do nothing.
void refuse_elastic_keys_of_a_fixed_world(const core::ElasticSpec& el, const std::string& launcher);

// The checkpoint this worker resumes from: `resume_flag` (--resume) when given; else, in an
// attempt after a restart (TORCHELASTIC_RESTART_COUNT > 0), checkpoint.dir when it holds a
// step folder; "" when there is nothing to resume (the attempt starts from step 0).
std::string resume_source(const core::JobSpec& spec, const parallel::LaunchEnv& env,
                          const std::string& resume_flag);

// Whether this run continues an earlier one's run folder and metrics (--resume, or a
// restarted attempt, which replaces the lines of the steps it repeats).
bool continues_run(const parallel::LaunchEnv& env, bool resume_flag);

// A spare's worker, started parked (WEFT_PARKED=1) by its agent while the node waits as a
// spare: its rank, world and epoch are guesses (the lost node's place in a full world) until
// the agent's first notice says where it enters. It prepares what does not depend on them
// (config, data, plans of the likely worlds, its state's pages) and then waits here.
inline constexpr const char* kParkedVar = "WEFT_PARKED";
bool parked_worker();

// Blocks, costing no CPU (inotify on the notice's folder; five looks a second besides, for a stop
// signal), until the agent posts the first epoch this worker enters (returned) or `stop` is set by
// a signal (nullopt: the spare was never admitted, and ends cleanly).
std::optional<EpochNotice> wait_for_admission(const EpochWatch& watch,
                                              const volatile std::sig_atomic_t& stop);

}  // namespace weft::launch
