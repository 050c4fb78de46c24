// `weft snapshot-agent --job ID --node N --socket PATH`: the process on each node that owns
// the in-memory snapshot segments of a job (checkpoint/snapshot_segment.h, issue 15; REFT's
// snapshot management process), so that a trainer crash or a kill -9 of every worker on
// the node loses nothing. Workers reserve, commit and list segments over the line protocol
// of checkpoint/snapshot_protocol.h.
//
// At start it takes the agent lock of the job and node (/dev/shm/weft-agent-<job>-n<node>.lock,
// flock: never two agents for one job and node), or keeps the one handed to it (--lock-fd),
// adopts the job's data segments of this
// node that exist (a restarted agent: they keep their data; it becomes their owner): those
// named by its --node, and those of a later epoch's index (a resize renumbers the nodes)
// that its guardian guards, and
// removes the segments of any other job that is abandoned (their owner process is gone, so
// is its guardian, the weft run that would restart it, and they are older than
// --abandoned-after seconds, 60 by default: a segment made a moment ago by a tool or a test
// that has not yet handed it to its agent is not judged). It logs
// one line per event to stderr, prefixed
// "[snapshot-agent]". SIGTERM/SIGINT: it stops serving and exits 0, keeping the segments
// (the job may restart it); `finish` removes the job's segments and it exits 0.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/snapshot_segment.h"

namespace weft::launch {

struct SnapshotAgentOptions {
  std::string job_id;  // 16 hex digits
  int node = 0;        // the node's index when the agent starts (segment names, adoption)
  std::string socket;  // the Unix socket it serves
  double abandoned_after_s = 60;  // other jobs' ownerless segments younger than this stay
  // The process that restarts this agent when it dies (weft run; --guardian, else the
  // agent's parent; 0: none), recorded in every segment it owns: while it lives, a dead
  // agent's segments are not abandoned (its successor is about to adopt them).
  int guardian_pid = 0;
  // snapshot.redundancy: replica (snapshot_replicas.h). `listen` ("host:port", port 0: any)
  // is where the other nodes' agents push to it; "" = no peers (it pushes nothing either).
  // The job token (WEFT_JOB_TOKEN) authenticates them; without one only peers on this
  // machine are accepted unless `insecure`.
  std::string listen;
  // "replica": reserve counts the replicas it will hold; "ec": parity (snapshot_parity.h)
  // with k data and m parity fragments per stripe.
  std::string redundancy = "none";
  int ec_k = 2, ec_m = 1;
  bool insecure = false;
  // The agent lock, already taken by the process that started the agent (weft run, which
  // chose the index by taking it: --lock-fd); -1: the agent takes it at start.
  int lock_fd = -1;
};

// What the agent's background "on committed" stage receives for each commit a worker
// reported: the segment (kept mapped while the stage holds it, even once unlinked) and its
// newest committed meta. The stage is where replica push and EC encode plug in; a stage
// that falls behind sees only the newest commit of each segment.
struct CommittedEvent {
  std::string name;
  std::shared_ptr<const checkpoint::SnapshotSegment> segment;
  checkpoint::SnapshotMeta meta;
  // The rank's place among the node's ranks of that epoch (by rank) and their count:
  // erasure coding cuts local rank l into the stripes of l (snapshot_parity.h).
  int local = -1, locals = 0;
};
using CommittedHandler = std::function<void(const CommittedEvent&)>;

// What a stage handler sends for an event: its segment's newest committed slot when it is of
// `epoch` and its sequence is not the one `sent` records for the segment; nullopt otherwise
// (also for an inconsistent newest slot: `weft snapshot verify` says why).
std::optional<checkpoint::SnapshotSegment::View> newest_unsent(
    const CommittedEvent& e, int64_t epoch, const std::map<std::string, int64_t>& sent);

// A restarted agent's adoption of the segments of `kinds` its dead predecessor left for job
// `job`: each one whose owner is gone is mapped writable, made this process's (with
// `guardian_pid` as its guardian), and handed to `take(name, parsed name, segment, previous
// owner pid)`; one it cannot open is logged and left. Live agents' segments (several nodes on
// one machine) are left alone, and so are those another live guardian (another node's weft
// run on this machine) will have its own restarted agent take over.
void adopt_orphans(const std::string& job, const std::vector<checkpoint::SegmentKind>& kinds,
                   int guardian_pid,
                   const std::function<void(const std::string&, const checkpoint::SegmentName&,
                                            std::shared_ptr<checkpoint::SnapshotSegment>, int)>& take,
                   const std::function<void(const std::string&)>& log);

// Serves until SIGTERM/SIGINT or `finish`; returns the exit code (0). `on_committed` runs on
// the stage's thread, one event at a time, after the replica push when the agent has peers
// (none: the stage only pushes, or drains). Throws IoError when the socket, the peers'
// port or the lock cannot be taken (another agent serves this job and node).
int run_snapshot_agent(const SnapshotAgentOptions& o, CommittedHandler on_committed = {});

// The memory a node can give to new snapshot segments, for reserve's check.
struct NodeMemory {
  int64_t total = 0;      // MemTotal
  int64_t available = 0;  // MemAvailable
  int64_t shm_free = 0;   // free bytes of /dev/shm (statvfs)
};
NodeMemory read_node_memory();
// The margin kept free: 5% of MemTotal, at least 256 MiB (see snapshot_agent_reserve.cc).
int64_t snapshot_memory_margin(const NodeMemory& m);
// What new segments may take: the lesser of MemAvailable and free /dev/shm, less the margin.
double snapshot_room(const NodeMemory& m);
// The bytes a segment of `capacity` payload bytes per slot and `slots` slots takes: a header
// page, then per slot a header page, one crc32c per block and the payload. An estimate for
// the memory checks (the segment's own layout may differ by a few pages).
double snapshot_segment_bytes(int64_t capacity, int slots);

}  // namespace weft::launch
