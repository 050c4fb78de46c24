// The job id: 16 hex digits chosen once per job and written into every temporary folder
// name and every metadata.json, so that two jobs sharing a checkpoint.dir never mix their
// files and retention deletes only the checkpoints of the job that runs it.
#pragma once

#include <string>

#include "comm/communicator.h"

namespace weft::checkpoint {

// A fresh random id (64 bits from std::random_device) as 16 lowercase hex digits.
std::string new_job_id();

// One id for every rank of `world`: rank 0 draws it and broadcasts it. Collective; throws
// the communicator's errors.
std::string agree_job_id(comm::Communicator& world);

}  // namespace weft::checkpoint
