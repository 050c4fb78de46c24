// In-memory snapshots, the protocol between a worker and its node's snapshot agent
// (launch/snapshot_agent.h, issue 15): a Unix domain socket (path in WEFT_SNAPSHOT_SOCKET),
// one JSON object per line, each request answered by one reply line. Every reply has "ok";
// a refusal has "error" and, when the user's job file must change, "field" (the YAML key).
//
//   {"op":"reserve","job":J,"node":N,"epoch":E,"ranks":[{"rank":r,"world":w,"bytes":B},...],
//    "parity_bytes":P,"allocate":A}
//     -> {"ok":true,"segments":[name per rank, in request order]}
//     -> {"ok":false,"field":"snapshot.every","error":"...sizes, free memory, the fix"}
//   The agent creates each missing segment (SnapshotSegment::create, kind kData, payload of
//   up to B bytes per slot, owned by the agent) after checking that two slots per new rank
//   (three when the agent copies them to other nodes: --redundancy replica) plus two slots of
//   P parity bytes, or of the replicas it will hold, fit in the node's free memory. Idempotent: a
//   segment that exists with enough capacity is returned as is (a worker restarted after a crash
//   finds its snapshot). One reserve should name every rank of the node in that epoch
//   (see committed). `node` is the node's index in epoch E's membership. "allocate" false
//   (default true): the new segments' slots are counted but not allocated; the worker
//   allocates its own (SnapshotSegment::allocate_slots) off the agent's thread.
//   {"op":"committed","name":S,"step":s} -> {"ok":true,"step":newest committed step}
//     The worker committed `name` (SnapshotSegment::commit). Once every segment the agent
//     holds for epoch E has a committed slot, it unlinks the node's segments of older
//     epochs: a resize never leaves the node without one complete snapshot. The commit is
//     then handed to the agent's background "on committed" stage (replica push, EC encode).
//   {"op":"idle"} -> {"ok":true,"idle":bool}
//     Whether the agent's "on committed" stage has sent every commit it was told of to its
//     peers (replica push, parity chunks; a failed send counts as done). Workers ask before
//     a snapshot is due and take it only when every node's agent is idle (lockstep
//     snapshots, launch/rank_snapshots.h): a copy on another node is then never more than
//     one snapshot behind its source. Always true without peers.
//   {"op":"list"[,"epoch":E]} -> {"ok":true,"segments":[{"name","epoch","rank","capacity",
//                     "owner_pid","committed":{meta} (absent while nothing was committed)},...]}
//     The node's data segments, then the replicas it holds of other nodes' ranks (kind
//     replica; their meta is the original rank's: epoch, rank, world, step, layout hash),
//     then the snapshots it rebuilt from parity (kind rebuilt; the same meta). With "epoch"
//     (a world of epoch E forms) an agent with parity (--redundancy ec) answers once it has
//     the ring of E and has rebuilt the lost nodes' snapshots it is designated for. It does
//     not check its own snapshots' blocks first: a read does (repair).
//   {"op":"repair","segment":name,"step":S} -> {"ok":true,"repaired":blocks (0: none corrupt)}
//     An agent with parity: checks the committed slot of step S of its own data segment
//     `name` and decodes the chunks of its corrupt blocks in place from parity (the other
//     fragments of their stripes, on the other nodes). A worker whose read of that slot
//     failed its checksums asks, then reads it again. Refused without parity, for another
//     node's segment, or when the blocks cannot be rebuilt (the error says why).
//   {"op":"endpoint"} -> {"ok":true,"endpoint":"host:port"}
//     Where the agent accepts other nodes' agents (--listen, its port as bound); "" when it
//     was started without one. weft run publishes it in the rendezvous store.
//   {"op":"peers","job":J,"epoch":E,"node":i,"nodes":["host:port" by node index]}
//     -> {"ok":true,"successor":"host:port" or null}
//   snapshot.redundancy: replica or ec. The agents of epoch E's nodes (their endpoints); this
//     node is node i. replica: from now on each commit of an epoch-E segment is pushed to node
//     (i+1) % n (Gemini's ring; none with one node), the newest commit of each segment right
//     away. ec: its chunks go to their stripes' parity holders (launch/snapshot_parity.h),
//     and the previous ring's nodes missing from this one are rebuilt; "successor" is null.
//     Refused for an epoch older than the one the agent has, or without --listen.
//   {"op":"finish","job":J[,"scope":"node"]} -> {"ok":true,"removed":[names]}; then the agent
//     exits 0. The job ended well: every segment of J on this machine is unlinked. With
//     scope "node", this node left a job that goes on (its hand-over confirmed): only the
//     segments this agent holds (its ranks', and the replicas, parity and rebuilt snapshots it
//     kept for others) are; another node's agent on the same machine keeps its own.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/snapshot_segment.h"

namespace weft::checkpoint {

// The environment variable that gives a worker its node agent's socket (set by weft run).
inline constexpr const char* kSnapshotSocketVar = "WEFT_SNAPSHOT_SOCKET";
// The longest request or reply line either side accepts (a list of a few thousand segments).
inline constexpr size_t kSnapshotMaxLineBytes = size_t(4) << 20;

// One rank's segment in a reserve: its place in epoch E's world and its payload bytes.
struct RankSlot {
  int rank = -1, world = 0;
  int64_t bytes = 0;
};

struct Reservation {
  std::string job;  // 16 hex digits (checkpoint/job_id.h)
  int node = 0;
  int64_t epoch = 0;
  std::vector<RankSlot> ranks;
  int64_t parity_bytes = 0;  // parity or replicas this node will hold (counted, not created yet)
  // False: the slots' pages are left to the worker (RankSnapshots::attach, in the background
  // at the lowest priority after a live move); the memory check counts them all the same.
  bool allocate = true;
};

// A segment the agent holds, as `list` reports it.
struct SegmentInfo {
  std::string name;
  int64_t epoch = 0;
  int rank = -1;
  int64_t capacity = 0;  // payload bytes per slot
  int owner_pid = 0;
  std::optional<SnapshotMeta> committed;  // the newest committed slot's meta
};

// JSON forms shared by the agent and the client. The *_from_json functions throw
// std::invalid_argument naming the missing or mistyped field.
nlohmann::json to_json(const Reservation& r);
Reservation reservation_from_json(const nlohmann::json& j);
nlohmann::json to_json(const SnapshotMeta& m);  // layout_hash as 16 hex digits
SnapshotMeta meta_from_json(const nlohmann::json& j);
nlohmann::json to_json(const SegmentInfo& s);
SegmentInfo segment_info_from_json(const nlohmann::json& j);

// How long a `list` with an epoch may take (the agent gives up waiting after a minute).
inline constexpr std::chrono::milliseconds kListWaitTimeout{90000};
// How long a `repair` may take: it queues behind a rebuild in progress, and fetches a chunk
// of each stripe from the other nodes.
inline constexpr std::chrono::milliseconds kRepairTimeout{60000};

// The per-call timeout of clients: WEFT_SNAPSHOT_TIMEOUT_MS, default 10000 ms.
std::chrono::milliseconds default_snapshot_call_timeout();

// A worker's (or a test's) synchronous connection to its node's snapshot agent. Every call
// sends one request and waits for its reply at most the call's timeout: a hung, stopped or
// dead agent is an IoError the caller handles (training must not wait on it); the
// connection is then closed and the next call connects again (to a restarted agent).
// One thread at a time; not copyable.
class SnapshotAgentClient {
 public:
  // `timeout` bounds each call (connecting included); `reserve_timeout` bounds segment(),
  // where the agent allocates the segments' memory (about a second per few GB).
  explicit SnapshotAgentClient(
      std::chrono::milliseconds timeout = default_snapshot_call_timeout(),
      std::chrono::milliseconds reserve_timeout = std::chrono::milliseconds(120000));
  ~SnapshotAgentClient();
  SnapshotAgentClient(const SnapshotAgentClient&) = delete;
  SnapshotAgentClient& operator=(const SnapshotAgentClient&) = delete;

  // Connects to the agent at `path`, retrying while nothing listens there yet (an agent
  // starting or being restarted) until the timeout; IoError naming the path after it.
  void connect(const std::string& path);
  const std::string& path() const { return path_; }

  // reserve: the segment names, one per rank of `r` in its order. ConfigError(field, the
  // agent's message) when the agent refuses because the job does not fit (snapshot.every);
  // IoError for any other refusal and for a transport failure or timeout.
  std::vector<std::string> segment(const Reservation& r);
  // committed: returns the segment's newest committed step as the agent read it.
  int64_t committed(const std::string& name, int64_t step);
  // idle: whether every commit told so far has been sent to the peers.
  bool idle();
  // list; with `epoch` (a world of that epoch forms), an agent that keeps parity first
  // rebuilds the lost nodes' snapshots (up to its own limit of a minute), so the call waits
  // up to kListWaitTimeout.
  std::vector<SegmentInfo> list(std::optional<int64_t> epoch = std::nullopt);
  // repair: the blocks of `segment`'s snapshot of `step` the agent repaired from parity (0:
  // none was corrupt). IoError with the agent's reason when it refuses or cannot.
  int64_t repair(const std::string& segment, int64_t step);
  // finish: the names the agent removed; the agent exits after replying. node_only: the
  // "node" scope (the node left a job that goes on).
  std::vector<std::string> finish(const std::string& job, bool node_only = false);
  // endpoint: where the agent accepts its peers ("" when it does not).
  std::string endpoint();
  // peers: the ring of `epoch` (every node's endpoint by index, this node `node`); returns
  // the successor's endpoint ("" when the epoch has one node).
  std::string peers(const std::string& job, int64_t epoch, int node,
                    const std::vector<std::string>& nodes);

  // One raw request: the reply object (ok or not). IoError on transport failure, timeout,
  // or a reply that is not a JSON object.
  nlohmann::json call(const nlohmann::json& request, std::chrono::milliseconds timeout);

 private:
  struct Io;
  std::unique_ptr<Io> io_;
  std::string path_;
  std::chrono::milliseconds timeout_, reserve_timeout_;
  void connect_by(std::chrono::steady_clock::time_point deadline);
  // A refusal as an exception: ConfigError when the reply names a field, else IoError.
  nlohmann::json checked(const nlohmann::json& request, std::chrono::milliseconds timeout);
};

}  // namespace weft::checkpoint
