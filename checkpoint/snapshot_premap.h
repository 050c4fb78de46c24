// Snapshot segments mapped in ahead, during training: a worker maps the replica segments it
// would offer to a recovery (launch/rank_snapshots.h, premap_replicas) while its world
// trains, so that a recovery's read of one is the checksum pass alone. Mapping in a 403 MiB
// replica slot took 50-81 ms of a node-loss recovery's snapshot reads.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "checkpoint/snapshot_segment.h"

namespace weft::checkpoint {

class PremappedSegments {
 public:
  // Maps the segments `names` read-only and maps in (populate) each of their committed slots
  // once. A segment mapped before keeps its mapping and its slots mapped in: the agent rewrites
  // a slot in the same tmpfs pages, which stay mapped. A name that now holds another segment (it
  // was recreated: another inode) is mapped anew. Segments not named are unmapped; one that
  // cannot be opened or mapped in is left out (a recovery maps it itself). Blocking; one
  // caller at a time (a thread of its own), while mapping() may run on any thread.
  void map_in(const std::vector<std::string>& names);
  // The mapping map_in made of `name`, when the name still holds that segment and every slot
  // committed there now was mapped in; else null (the reader maps it itself).
  std::shared_ptr<const SnapshotSegment> mapping(const std::string& name) const;

 private:
  struct Premapped {
    std::shared_ptr<const SnapshotSegment> segment;
    uint64_t inode = 0;  // when mapped
    std::set<int> slots_in;
  };
  mutable std::mutex mu_;
  std::map<std::string, Premapped> segments_;  // by name
};

// The inode of shared-memory segment `name` now (0: none): a segment recreated under the
// same name is another one.
uint64_t segment_inode(const std::string& name);

}  // namespace weft::checkpoint
