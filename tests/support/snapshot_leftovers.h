// What a test's snapshot jobs leave on this machine, removed at the end of the test however
// it ends: the job's segments (a killed weft run's agent keeps them for a restart that never
// comes) and the sockets and locks of its killed agents (a node lost whole leaves them).
// Header-only: for test binaries that link weft_checkpoint.
#pragma once

#include <string>

#include "checkpoint/snapshot_agent_files.h"
#include "checkpoint/snapshot_segment.h"

namespace weft::test {

inline void remove_snapshot_leftovers(const std::string& job) {
  for (const std::string& n : checkpoint::snapshot_segments(job))
    checkpoint::SnapshotSegment::unlink(n);
  checkpoint::remove_stale_agent_files(job);
}

// Removes them when it goes out of scope: declare it before the job starts.
struct SnapshotLeftovers {
  std::string job;
  ~SnapshotLeftovers() { remove_snapshot_leftovers(job); }
};

}  // namespace weft::test
