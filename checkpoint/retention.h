// Which folders under a checkpoint root a job may touch: the names of step and temporary
// folders, and retention (docs/checkpoint-format.md, "Retention"): a job deletes only its
// own checkpoints older than the one it just committed, and temporary folders of its own
// or of a writer that is provably dead.
#pragma once

#include <cstdint>
#include <string>

namespace weft::checkpoint {

// "step-00000010".
std::string step_name(int64_t step);
// The step of a folder named step-N (any parent path), or -1 for any other name.
int64_t step_of_folder(const std::string& path);

// "<root>/.tmp-step-00000010-<job_id>": one per job and step, so two jobs never share one.
std::string tmp_folder(const std::string& root, int64_t step, const std::string& job_id);
// Records this host and pid in `tmp` (file "owner"), so that a later save can tell a folder
// left by a crash from one another job is still writing. Removed before the commit.
void write_owner(const std::string& tmp);
void remove_owner(const std::string& tmp);

// After job `job_id` committed step `committed`: keeps the newest max(keep, 1) of this job's
// checkpoints at or before `committed` and deletes its older ones. Never deletes another
// job's checkpoint, one whose metadata does not verify, or a newer step. Also removes this
// job's temporary folders at or before `committed` other than `current_tmp`, and temporary
// folders whose owner file names this host and a process that no longer exists. Logs (never
// throws) when a folder cannot be removed.
void prune(const std::string& root, int64_t keep, int64_t committed, const std::string& job_id);

}  // namespace weft::checkpoint
