// The job id: 16 hex digits chosen once per job and written into every temporary folder
// name and every metadata.json, so that two jobs sharing a checkpoint.dir never mix their
// files and retention deletes only the checkpoints of the job that runs it.
#pragma once

#include <string>

#include "comm/communicator.h"

namespace weft::checkpoint {

// A fresh random id (64 bits from std::random_device) as 16 lowercase hex digits.
std::string new_job_id();

// The id of a run started by weft run: the first 64 bits of SHA-256(run id) as 16 hex
// digits. Every attempt of one elastic job (restarts, a new world) has the same run id
// (TORCHELASTIC_RUN_ID, --rdzv-id), so it is one job for retention and resume.
std::string job_id_for_run(const std::string& run_id);

// This process's job id: job_id_for_run(TORCHELASTIC_RUN_ID) under weft run, else
// new_job_id().
std::string this_job_id();

// One id for every rank of `world`: rank 0 takes this_job_id() and broadcasts it.
// Collective; throws the communicator's errors.
std::string agree_job_id(comm::Communicator& world);

}  // namespace weft::checkpoint
