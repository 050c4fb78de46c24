// snapshot.redundancy: replica (issue 15; Gemini's placement, a ring): the snapshot agent of
// node i pushes every committed snapshot of its workers to the agent of node (i+1) % n of the
// same membership epoch, which keeps it in a kReplica segment (owner node i, that epoch, the
// rank) with the data segment's capacity and commit protocol. A node lost whole then leaves
// each of its ranks' newest snapshots on the next node, which lists them to its workers like
// its own (`list`), so a new world restores them through the router.
//
// Pushing runs on the agent's "on committed" stage (snapshot_agent.h), one connection per
// peer kept open, the newest commit of a segment winning over ones not yet sent; receiving
// runs on the threads of the agent's transport listener (checkpoint/snapshot_transport.h),
// which hands this class the pushes (serve). Neither ever runs on the thread that answers
// the workers.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/snapshot_protocol.h"
#include "checkpoint/snapshot_segment.h"
#include "checkpoint/snapshot_transport.h"
#include "launch/snapshot_agent.h"

namespace weft::launch {

struct ReplicaOptions {
  checkpoint::PeerAuth auth;  // job, token
  std::chrono::milliseconds timeout{10000};  // per network operation
  int guardian_pid = 0;  // recorded in the replica segments (SnapshotAgentOptions)
};

// The ring of one membership epoch, as weft run tells it (`peers`).
struct ReplicaRing {
  int64_t epoch = -1;
  int node = -1;                   // this node's index in the epoch
  std::vector<std::string> nodes;  // every node's agent, "host:port", by node index
  // Where this node's snapshots go: node (i+1) % n; nullopt with fewer than 2 nodes.
  std::optional<int> successor() const;
};

class SnapshotReplicas {
 public:
  using Log = std::function<void(const std::string&)>;
  SnapshotReplicas(ReplicaOptions o, Log log);
  ~SnapshotReplicas();  // stop()
  SnapshotReplicas(const SnapshotReplicas&) = delete;
  SnapshotReplicas& operator=(const SnapshotReplicas&) = delete;

  // A restarted agent takes over the replica segments of its job whose owner is gone.
  void adopt();

  // Any thread. The ring of `r.epoch`; the pushes of commits of that epoch go to its
  // successor from now on (those of other epochs are not pushed).
  void set_ring(ReplicaRing r);
  std::optional<ReplicaRing> ring() const;

  // The stage's handler: pushes the segment's newest committed slot (not necessarily the
  // event's: a newer one may have committed since) to the ring's successor, unless it is
  // there already. Failures are logged (the first of a run of them) and the connection
  // dropped; the next commit tries again.
  void push(const CommittedEvent& e);
  // The transport's handler for a push (false: another op). Throws IoError for a header a
  // trusted peer would not send (the connection is then closed).
  bool serve(checkpoint::PeerChannel& ch, const nlohmann::json& header);

  // Any thread. The replica segments this agent holds, as `list` reports them.
  std::vector<checkpoint::SegmentInfo> list() const;
  // Payload bytes per slot of the replicas held of `epoch` (for reserve's memory check).
  int64_t capacity_of_epoch(int64_t epoch) const;
  // Unlinks the replicas of epochs older than `epoch` and refuses later pushes of them.
  std::vector<std::string> retire_older_than(int64_t epoch);
  // Stops receiving and pushing (finish calls it before unlinking: no push lands after).
  void stop();
  // Forgets (without unlinking) every replica: finish has removed them.
  void clear();

 private:
  struct Held {
    std::shared_ptr<checkpoint::SnapshotSegment> segment;
    int64_t epoch = 0;
    int rank = -1;
    std::shared_ptr<std::mutex> writing;  // one push into a segment at a time
  };
  void receive_one(checkpoint::PeerChannel& ch, const nlohmann::json& header);
  // The replica segment for a push (created, or recreated when too small); nullopt with
  // *why when the push is refused.
  std::optional<Held> replica_for(const checkpoint::SnapshotMeta& m, int64_t capacity,
                                  std::string* why);
  void note_failure(const std::string& peer, const std::string& what);

  const ReplicaOptions o_;
  const Log log_;
  mutable std::mutex mu_;  // ring_, held_, retired_below_, stopped_
  std::optional<ReplicaRing> ring_;
  std::map<std::string, Held> held_;
  int64_t retired_below_ = 0;
  bool stopped_ = false;

  // The pushing side (the stage's thread only).
  std::shared_ptr<checkpoint::PeerChannel> link_;  // under mu_: stop() aborts it
  std::string link_peer_;
  std::chrono::steady_clock::time_point retry_at_{};
  std::map<std::string, int64_t> pushed_;  // data segment -> sequence pushed last
  bool failing_ = false;
  // Throughput, logged every kReportSeconds: bytes and seconds spent pushing.
  int64_t pushes_ = 0, bytes_ = 0, torn_ = 0;
  double push_s_ = 0;
  std::chrono::steady_clock::time_point report_at_{};
  bool first_push_logged_ = false;
};

}  // namespace weft::launch
