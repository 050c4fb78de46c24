// snapshot.redundancy: ec (issue 15): Reed-Solomon parity of the nodes' snapshots, held by
// other nodes' snapshot agents, and the rebuild of what a lost node held.
//
// Placement is checkpoint/snapshot_stripes.h's (an epoch of m + 1 to k + m - 1 nodes, left by
// a loss, is one group with K = nodes - m: still coded, each node holding more parity, when
// its memory has room: decline()): each rank's committed snapshot is cut into K
// chunks, chunk t goes to the m parity holders of its stripe, and each holder adds it to its
// parity fragment as it arrives (ErasureCode::encode_update: no holder keeps anyone's data),
// committing the stripe's parity of a step once all K chunks of that step arrived. A parity
// slot holds a manifest (each data member's meta, block checksums and chunk length), then
// the parity bytes; its meta is kind kParity, owner_node = the holder, rank = the stripe's
// number.
//
// Rebuild. When a ring of a new epoch arrives, the rebuilder's thread asks each of its
// nodes which node it was in the previous epoch ("node_in"): a node's endpoint is no
// identity, since an agent restarted by weft run listens on a new port and a peer may still
// have its old endpoint in the previous ring (weft run re-tells a ring about once a second,
// and not at all once the next epoch has formed). The previous ring's nodes nobody claims
// are lost, and the survivors' current endpoints replace their old ones in it. An agent that
// knows no previous ring (restarted, then told only the new one) takes it from a peer
// ("ring") when it holds segments of that epoch. Then the first surviving node after each
// lost one in its group rebuilds the lost node's ranks: it asks the stripes' surviving parity
// holders which steps they hold, picks the newest one every chunk has, fetches K surviving
// fragments of each stripe (the other data members' chunks from their agents' shared memory, parity
// from the holders), decodes the lost chunks, checks the result against the manifest's block
// checksums and commits it into a kRebuilt segment, which `list` offers to the new world like a
// replica. A node's own snapshot whose blocks no longer match their checksums is repaired the same
// way, in place, when a worker's read of it finds them (repair(): the agent's `repair` op). Only
// slots that are read are checked: a sweep of every slot at `list` held each recovery for a
// checksum of slots nobody reads.
//
// Traffic runs over the agents' authenticated transport (checkpoint/snapshot_transport.h):
//   chunk:  {"op":"chunk","meta","crc32c","group","stripe","fragment","chunk"} then the
//           chunk's bytes (up to "chunk", the rest zeros), then {"intact":bool}
//           -> {"ok":true} (before the bytes) ... {"ok":bool} (after; false with "error":
//           torn ("torn":true), or the stripe's parity, completed by this chunk, not kept)
//   stripe: {"op":"stripe","epoch","stripe"} -> {"ok":true,"slots":[{"step","manifest"}]}
//   fetch:  {"op":"fetch","segment":name,"step","offset","length"}
//           -> {"ok":true} then length bytes (zeros past the payload) then {"intact":bool}
//   node_in: {"op":"node_in","epoch"} -> {"ok":true,"node":i} (-1: not a node of that epoch
//           here, as far as this agent knows: its ring of it, else the segments it holds)
//   ring:   {"op":"ring","epoch"} -> {"ok":true,"nodes":[...]} or {"ok":false} (not known)
// Pushing runs on the agent's "on committed" stage, receiving on the transport's threads,
// rebuilding and repairing on a thread of its own: none on the thread that answers workers.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/erasure_code.h"
#include "checkpoint/snapshot_protocol.h"
#include "checkpoint/snapshot_segment.h"
#include "checkpoint/snapshot_stripes.h"
#include "checkpoint/snapshot_transport.h"
#include "launch/snapshot_agent.h"
#include "launch/snapshot_replicas.h"

namespace weft::launch {

struct ParityOptions {
  checkpoint::PeerAuth auth;
  int k = 2, m = 1;
  std::chrono::milliseconds timeout{10000};  // per network operation
  int guardian_pid = 0;  // recorded in the parity and rebuilt segments (SnapshotAgentOptions)
};

class SnapshotParity {
 public:
  using Log = std::function<void(const std::string&)>;
  // ConfigError naming snapshot.ec for a code ISA-L cannot make.
  SnapshotParity(ParityOptions o, Log log);
  ~SnapshotParity();  // stop()
  SnapshotParity(const SnapshotParity&) = delete;
  SnapshotParity& operator=(const SnapshotParity&) = delete;

  // A restarted agent takes over the parity and rebuilt segments its predecessor left.
  void adopt();
  // Any thread. The ring of an epoch (every node's agent by index). A ring of a new epoch
  // queues the search for the previous epoch's lost nodes (see Rebuild above) and the
  // rebuilds this node is designated for; the newest ring told again with other endpoints (a
  // peer's agent restarted) retries the rebuilds that could not be done.
  void set_ring(ReplicaRing r);
  // The stage's handler: sends the commit's chunks to their stripes' parity holders.
  void push(const CommittedEvent& e);
  // The transport's handler for chunk, stripe and fetch (false: not one of them).
  bool serve(checkpoint::PeerChannel& ch, const nlohmann::json& header);

  // Queues the repair of the node's own committed snapshot of `step` in data segment
  // `segment` (this node's, of an epoch whose ring is known): its blocks are checked against
  // their checksums and the chunks holding corrupt ones decoded in place from the stripes'
  // other fragments. `done` is called on the rebuilder's thread with {"ok":true,"repaired":
  // blocks repaired (0: none was corrupt)} or {"ok":false,"error":why}. The agent's `repair`
  // op: a worker whose read of the slot failed its checksums asks for it, then reads again.
  using Done = std::function<void(const nlohmann::json&)>;
  void repair(const std::string& segment, int64_t step, Done done);
  // True once the ring of `epoch` (or a newer one) is known and no rebuild or repair is
  // queued or running: a new world's `list` waits for it.
  bool settled(int64_t epoch) const;
  // The agent reserved the node's `locals` ranks of `epoch`, the largest of `capacity` bytes.
  // Once the ring of `epoch` codes them (m + 1 nodes or more, not declined; now, or when it
  // is told):
  // queues, on the rebuilder's thread, the making ahead of
  // the segments this node would rebuild its group's previous node into were that node lost
  // alone (it is then the designated rebuilder): one per own rank, of the largest own rank's
  // payload, named for the rank that node most likely has, their first slot's pages
  // allocated and mapped in. A rebuild then writes at memory speed: allocating those pages
  // when the loss was known was 477 of a 721 ms rebuild of 403 MiB (node-loss bench, with
  // the survivors faulting in their next layout on the same two cores), the longest wait of
  // an ec recovery. Costs one own payload of shared memory per node while the epoch lasts;
  // skipped, and logged, when that does not fit the node's memory (a rebuild then allocates
  // as it writes, as before). Idempotent; a newer epoch's ring drops an older epoch's.
  void prepare(int64_t epoch, int locals, int64_t capacity);
  // The shared memory prepare() takes for `locals` ranks of up to `capacity` bytes in a
  // group of `group_size` nodes and `data_fragments` data fragments per stripe: one slot of
  // a rebuilt segment per rank and the decode's kDecodeSets sets of pieces (one per fragment).
  static double ahead_bytes(int locals, int64_t capacity, int group_size, int data_fragments);
  // What prepare() of `epoch` takes on this node, for the reserve's memory check: in the
  // node's own group of the epoch's ring where this agent knows it, else in the largest group
  // a ring can have (checkpoint::group_bound: the last group holds the remainder, up to
  // 2(k + m) - 1 nodes; counting k + m fell short there by the extra nodes' decode pieces).
  // A ring of m nodes or fewer makes nothing ahead (prepare skips it): 0.
  double ahead_bytes_of(int64_t epoch, int locals, int64_t capacity) const;
  // The data fragments K of this node's group in the ring of `epoch`, for the reserve's
  // count of the parity it will hold (m/K of its own bytes): k while that ring is not known
  // here, 0 when it has too few nodes to code (m or fewer).
  int data_fragments_of(int64_t epoch) const;
  // Whether the ring of `epoch` is known and reduced (m + 1 to k + m - 1 nodes: one group,
  // K < k, more parity per node than the job's start counted).
  bool reduced(int64_t epoch) const;
  // The reserve of a reduced `epoch` found that the parity this node would hold does not fit
  // its memory (`why` names the bytes): this node holds no parity in that epoch, refusing
  // chunks with `why` (their senders log that those snapshots are not protected), and makes
  // no rebuild target ahead. Logged once.
  void decline(int64_t epoch, const std::string& why);
  // Whether prepare() of `epoch` was asked for already (queued or run): the reserve that
  // asked for it counted its bytes, and a later one of that epoch does not again.
  bool prepare_asked(int64_t epoch) const;

  // The rebuilt segments this agent holds, as `list` reports them (not those made ahead).
  std::vector<checkpoint::SegmentInfo> list() const;
  // Unlinks the parity and rebuilt segments of epochs older than `epoch`.
  std::vector<std::string> retire_older_than(int64_t epoch);
  void stop();   // stops pushing, receiving and rebuilding; idempotent
  void clear();  // forgets every segment (finish removed them)

 private:
  struct Accumulator;  // one stripe's parity of one step, while its chunks arrive
  struct Task {
    enum Kind { kRebuild, kRepair, kNewRing, kPrepare } kind = kRepair;
    int64_t epoch = 0;    // kRebuild: the ring the snapshots were taken in; kNewRing: the new one
    int lost = -1;        // kRebuild: the node, in that ring
    std::set<int> gone;   // every node of that ring that is lost
    std::string segment;  // kRepair: the data segment, the step, and who waits for it
    int64_t step = -1;
    Done done;
  };
  // kNewRing (snapshot_parity_ring.cc): the previous epoch's ring with its survivors'
  // current endpoints, its lost nodes, and their rebuilds.
  void new_ring(int64_t epoch);
  // This agent's node index in `epoch`: its ring of it, else the data or parity segments
  // of that epoch this process owns; -1 when neither says.
  int node_in(int64_t epoch) const;
  // The newest epoch below `epoch` of a data or parity segment this process owns; -1: none.
  int64_t newest_held_epoch_below(int64_t epoch) const;
  void serve_node_in(checkpoint::PeerChannel& ch, const nlohmann::json& h);
  void serve_ring(checkpoint::PeerChannel& ch, const nlohmann::json& h);
  struct StripeSlot {
    int holder = -1;  // the node holding this parity fragment
    int64_t step = 0;
    nlohmann::json manifest;
    int64_t parity_offset = 0;
  };
  std::vector<StripeSlot> stripe_slots_here(int64_t epoch, int number) const;

  void serve_chunk(checkpoint::PeerChannel& ch, const nlohmann::json& h);
  void serve_stripe(checkpoint::PeerChannel& ch, const nlohmann::json& h);
  void serve_fetch(checkpoint::PeerChannel& ch, const nlohmann::json& h);
  std::string commit_parity(int64_t epoch, int me, int number, int64_t step, Accumulator& a);

  void work();  // the rebuilder's thread
  void prepare_ahead(int64_t epoch);  // kPrepare (prepare())
  // A segment made ahead for rank `rank` of node `lost` of `epoch` with room for `payload`,
  // renamed to `name` when it was made under another; null when none was made (or fits).
  std::shared_ptr<checkpoint::SnapshotSegment> take_ahead(int64_t epoch, int lost,
                                                         int64_t payload,
                                                         const std::string& name);
  // True when nothing of it is left to retry: rebuilt, or not this node's to rebuild.
  bool rebuild(const Task& t);
  nlohmann::json repair_slot(const Task& t);  // kRepair's reply
  // Decodes the first `out_len` bytes (at most the stripe's fragment length) of fragment
  // `lost` of stripe `s` at the step of `at_step` (the surviving holders' parity slots of
  // that step) from K surviving fragments into `out`; `gone` are the ring's lost nodes
  // (never asked). Fetches kDecodePieceBytes at a time over several connections per source
  // and decodes each piece once its sources arrived, in any order (FetchWindow).
  // `before_write(o, n)`, when given, is called before bytes [o, o + n) of `out` are written,
  // while the next piece is fetched (a rebuild allocates the segment's pages there), and
  // `after_write(o, n)` once they are (a rebuild checks their block checksums there, a
  // throw ends the decode). This node's own fragments held through this agent's mappings
  // are decoded from in place, not copied.
  void decode_fragment(const ReplicaRing& ring, const checkpoint::StripeLayout& l,
                       const checkpoint::StripeId& s, int lost,
                       const std::vector<StripeSlot>& at_step, const std::set<int>& gone,
                       uint8_t* out, int64_t out_len,
                       const std::function<void(int64_t, int64_t)>& before_write = {},
                       const std::function<void(int64_t, int64_t)>& after_write = {});
  static constexpr int64_t kDecodePieceBytes = int64_t(8) << 20;
  // Pieces in flight or decoding at once (a set of buffers each, one per fragment: the same
  // memory as two sets of 16 MiB pieces), and the connections per source that fetch them.
  static constexpr int kDecodeSets = 4;
  static constexpr int kFetchLanes = 3;
  // prepare_ahead allocates a target this much at a time, looking for a newer ring between.
  static constexpr int64_t kPreparePieceBytes = int64_t(64) << 20;
  // The parity slots of stripe `s` held by its surviving holders, newest step first.
  std::vector<StripeSlot> stripe_slots(const ReplicaRing& ring, const checkpoint::StripeLayout& l,
                                       const checkpoint::StripeId& s, const std::set<int>& gone);
  // A fetch from node `node` of `ring` (this node: read here), into out[0, length), over
  // connection `lane` to it (lanes fetch at once: each has its own).
  void fetch(const ReplicaRing& ring, int node, const std::string& segment, int64_t step,
             int64_t offset, int64_t length, uint8_t* out, int lane = 0);
  nlohmann::json ask(const ReplicaRing& ring, int node, const nlohmann::json& request);
  // ask() of node `node` of the ring of `epoch`, a member of that epoch: one whose agent does
  // not answer is most likely restarting (its weft run, alive since it is a member, starts a
  // dead agent again at its next tick and publishes the new endpoint, which reaches this
  // agent as the epoch's ring told again; a killed agent under load can take a second to be
  // gone, its endpoint published meanwhile). So it is asked again, at the endpoint the ring
  // names now, until kMemberWait: a rebuild that gave up at once would find no fragments
  // there and leave the lost node to the disk checkpoint. *at: the endpoint asked last.
  // Throws the last failure (and at once when the agent stops or a newer epoch's ring came).
  nlohmann::json ask_member(int64_t epoch, int node, const nlohmann::json& request,
                            std::string* at);
  static constexpr std::chrono::milliseconds kMemberWait{10000};
  using Links = std::map<std::string, std::shared_ptr<checkpoint::PeerChannel>>;
  std::shared_ptr<checkpoint::PeerChannel> channel(const ReplicaRing& ring, int node, Links& cache,
                                                   bool* reused = nullptr, int lane = 0);
  // The key of connection `lane` to `endpoint` in a Links cache (lane 0: the endpoint).
  static std::string link_key(const std::string& endpoint, int lane);
  // Sends `request` to node `node` of `ring` on a channel of `cache` and returns the first
  // reply, the channel in *used. A cached channel that fails here is replaced by a new one,
  // once: the peer's listener closes a connection idle for its timeout (10 s by default,
  // checkpoint/snapshot_transport.h), and commits or rebuilds further apart than that would
  // otherwise fail every other time. Throws what the new channel's call throws.
  nlohmann::json call(const ReplicaRing& ring, int node, Links& cache,
                      const nlohmann::json& request, std::shared_ptr<checkpoint::PeerChannel>* used,
                      int lane = 0);
  void drop(Links& cache, const std::string& key);
  const checkpoint::ErasureCode& code(int k) const;
  std::optional<ReplicaRing> ring_of(int64_t epoch) const;
  // The stripes of `ring` (StripeLayout, reduced below k + m nodes); nullopt when it has too
  // few nodes to code.
  std::optional<checkpoint::StripeLayout> layout_of(const ReplicaRing& ring) const;
  // This agent's mapping of segment `name` (a parity or rebuilt segment it holds, a data
  // segment it pushed), whose written pages are mapped in already; null when it has none.
  std::shared_ptr<const checkpoint::SnapshotSegment> mapped(const std::string& name) const;

  const ParityOptions o_;
  const Log log_;
  mutable std::mutex mu_;  // everything below but the threads' own caches
  std::map<int64_t, ReplicaRing> rings_;
  std::map<std::string, std::shared_ptr<Accumulator>> accumulating_;
  std::map<std::string, std::shared_ptr<checkpoint::SnapshotSegment>> parity_, rebuilt_;
  // The rebuilt_ segments made ahead (prepare) and not written yet: their first slot's pages
  // are allocated and mapped in, so a rebuild into one skips populate_writing.
  std::set<std::string> ahead_;
  // The node's data segments as the agent's stage pushed them (CommittedEvent::segment).
  std::map<std::string, std::shared_ptr<const checkpoint::SnapshotSegment>> data_;
  std::set<std::string> served_;  // segments fetches were served of (logged once each)
  std::set<int64_t> prepared_;  // epochs whose prepare ran (made, or found not to fit)
  std::map<int64_t, std::pair<int, int64_t>> to_prepare_;  // prepare()'s, until it ran
  mutable std::mutex codes_mu_;
  mutable std::map<int, std::unique_ptr<checkpoint::ErasureCode>> codes_;  // by K
  std::mutex writing_;  // one parity commit at a time
  std::set<std::string> room_refused_;  // under writing_: parity segments refused for memory, logged
  std::deque<Task> tasks_;
  bool working_ = false, stopped_ = false;
  bool preparing_ = false;  // the task working_ is a kPrepare
  int64_t retired_below_ = 0;
  std::condition_variable cv_;
  // The stage's thread: open channels to the parity holders, what was pushed last.
  Links push_links_;  // under mu_ when changed: stop() aborts them
  std::map<std::string, int64_t> pushed_;  // data segment -> sequence
  std::set<std::string> failing_;          // peers whose failure was logged
  std::map<int64_t, std::string> declined_;  // epochs whose parity does not fit here: why
  // serve_chunk: until when a chunk of an epoch whose ring is not here yet waits for it
  // (kRingWait after the first such chunk).
  std::map<int64_t, std::chrono::steady_clock::time_point> ring_wait_until_;
  static constexpr std::chrono::milliseconds kRingWait{3000};
  // The rebuilder's thread: its channels, and the lost nodes (epoch, node) done with.
  Links fetch_links_;
  std::set<std::pair<int64_t, int>> losses_done_;
  std::map<int64_t, std::set<int>> gone_;      // by epoch: its nodes found lost (new_ring)
  std::vector<std::vector<uint8_t>> scratch_;  // decode_fragment's kDecodeSets sets of pieces
  struct Spent {  // seconds of the rebuild of one rank, for its log line
    double segment = 0, populate = 0, fetch_wait = 0, decode = 0, check = 0;
    double scratch = 0;  // the decode's pieces allocated (none when made ahead)
    bool ahead = false;  // into a segment made ahead (prepare): nothing to populate
    // Pieces read here, through a held mapping, and of those decoded from in place.
    int local_reads = 0, local_mapped = 0, local_in_place = 0;
  } spent_;
  std::thread worker_;  // last: starts once the members above exist
};

}  // namespace weft::launch
