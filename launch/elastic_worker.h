// What `weft train` does with the job file's elastic and snapshot sections, and where a
// worker that weft run restarted picks the job up (elastic.on_change: restart).
#pragma once

#include <string>

#include "core/config/job_spec.h"
#include "parallel/launch_env.h"

namespace weft::launch {

// ConfigError ("... not yet ...", naming the key) for a job-file setting the trainer cannot
// act on yet: snapshot.redundancy: ec, and snapshot.ec (erasure-coded copies of snapshots on
// other nodes); and naming snapshot.redundancy for replica without snapshots or on fewer
// than 2 nodes (--nnodes MAX). Also checks elastic.min_nodes/max_nodes, when set, against
// the node range weft run was started with (--nnodes MIN:MAX): they must agree.
void refuse_unsupported_job_settings(const core::JobSpec& spec, const parallel::LaunchEnv& env);

// The checkpoint this worker resumes from: `resume_flag` (--resume) when given; else, in an
// attempt after a restart (TORCHELASTIC_RESTART_COUNT > 0), checkpoint.dir when it holds a
// step folder; "" when there is nothing to resume (the attempt starts from step 0).
std::string resume_source(const core::JobSpec& spec, const parallel::LaunchEnv& env,
                          const std::string& resume_flag);

// Whether this run continues an earlier one's run folder and metrics (--resume, or a
// restarted attempt, which replaces the lines of the steps it repeats).
bool continues_run(const parallel::LaunchEnv& env, bool resume_flag);

}  // namespace weft::launch
