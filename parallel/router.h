// The state router: moves training state from layout A to layout B. transition() is a pure
// function of (A, B, options), so every rank computes the same transfer plan without
// exchanging it; run_transition() executes one rank's part over a communicator.
//
// Memory model (per rank, budget equal on all ranks). States are processed in waves of at
// most budget/2 bytes of new tensors per rank (unless one state alone is larger: then it is a
// wave of its own). Within a wave a rank allocates each new tensor right before the first
// local copy or round that writes it and releases each old one right after the last that
// reads it (an old tensor that no transfer reads is released before anything is allocated);
// rounds move messages, and in one round a rank sends at most one message and receives at
// most one, each at most budget/4 bytes (so staging, a buffer per direction, stays under
// budget/2). Between waves a rank holds the new tensors of the states moved so far and the
// old ones of the rest; the states go in an order that keeps this within the larger of the
// rank's old and new holding where it can (memory_order in router.cc), so the peak is that
// plus at most one budget: rank_memory() computes it. Past that bound where one state is
// large against the budget: a tensor that a rank keeps in part and re-lays out (a replicated
// embedding becoming its TP half) holds its old and its new form at once, and no schedule of
// whole tensors avoids that; or where ranks pull the order different ways (pp2 -> tp2) so
// that every remaining state raises some rank above its cap: then by about one state. A
// source that a communicator message read is freed once its receiver has acknowledged the
// message (TransitionOptions::acknowledge), held meanwhile within the same bound (so a rank
// may then hold more than rank_memory's peak, never more than the bound or that peak).
//
// Adoption: a B local tensor that one local copy of a whole A local tensor of the same rank
// would fill (same state, dense shape and dtype, box for box identical) is that A tensor: no
// allocation, no copy, and its release does not free it. Survivors of a shrink from dp4 to
// dp2 keep every byte where it is. Same-host messages move through shared memory
// (parallel/shm_channel.h) rather than the communicator when the layouts' hosts say so.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "memory/allocator.h"
#include "parallel/vps.h"

namespace weft::parallel {

// One piece moving from a source box (rank `src` of A) to a destination box (rank `dst`
// of B); `start`/`extent` are global coordinates inside both boxes.
struct Transfer {
  StateId state = -1;
  std::vector<int64_t> start, extent;
  int src = -1, src_box = -1;  // rank in A, index into A.ranks[src].boxes
  int dst = -1, dst_box = -1;  // rank in B, index into B.ranks[dst].boxes
  int64_t bytes = 0;
  bool local() const { return src == dst; }
};

// Transfers from one rank to another, sent as one buffer (packed in `transfers` order).
struct Message {
  int src = -1, dst = -1;
  std::vector<int> transfers;  // indices into TransferPlan::transfers
  int64_t bytes = 0;
};

// Every rank appears at most once as a sender and once as a receiver.
struct Round {
  std::vector<Message> messages;
};

struct Wave {
  std::vector<StateId> states;
  std::vector<int> local_copies;  // transfers with src == dst, done at the wave's start
  std::vector<Round> rounds;
};

struct RouterOptions {
  int64_t budget_bytes = int64_t(256) << 20;  // must be the same on every rank
};

struct TransferPlan {
  std::vector<Transfer> transfers;
  std::vector<Wave> waves;
  int64_t budget_bytes = 0;
  int64_t bytes_remote() const;  // moved between ranks (local copies excluded)
  int rounds() const;
};

// The transfers that fill rank `dst`'s boxes of B from the boxes of A: every destination
// element exactly once, from a local box when one holds it, else a rank on the same host,
// else the least-loaded replica (`load[q]`: bytes already assigned to source q, updated;
// ties: the lower rank). Throws InternalError naming the box when A does not hold it.
std::vector<Transfer> cover_rank(const StateSpace& space, const Layout& a, const Layout& b, int dst,
                                 std::vector<int64_t>& load);

// The whole plan: cover every rank of B (in rank order, so that the load balance is the
// same everywhere), split transfers to fit messages, group states into waves and messages
// into rounds. A and B must have the same world (see remap_ranks). Throws InternalError
// for a budget below 64 bytes or layouts of different worlds.
TransferPlan transition(const StateSpace& space, const Layout& a, const Layout& b,
                        const RouterOptions& opt = {});

// One rank's part, in issue order: what run_transition does and what the symbolic replay
// checks. In a round a rank that both sends and receives posts its receive first when its
// send goes to a lower rank: with blocking semantics the highest rank of any cycle of
// sends then receives first, so no cycle of waits forms.
struct RankOp {
  enum Kind : uint8_t { kAlloc, kCopy, kRecv, kSend, kWait, kRelease } kind;
  int wave = 0, round = -1;
  int peer = -1;  // kSend / kRecv
  int index =
      -1;  // kAlloc: B local; kRelease: A local; kCopy: transfer; kSend/kRecv: message in round
  int64_t bytes = 0;  // kAlloc / kRelease: tensor bytes; kSend / kRecv: message bytes
};
std::vector<RankOp> rank_ops(const TransferPlan& plan, const Layout& a, const Layout& b, int rank);

// What rank `rank` holds while it runs its ops (rank_ops), counted as run_transition holds
// it when its handles on the sources are the only ones: its A local tensors until their
// kRelease, its B local tensors from their kAlloc (an adopted one is its A tensor's storage,
// counted once), and the communicator's staging: a buffer per direction of the rank's largest
// message, from its first kSend (kRecv) to the end. Messages that go through
// shared memory stage in channels instead (TransitionStats::bytes_shm_reserved), so this counts
// more than such a run holds in tensors, never less.
struct RankMemory {
  int64_t before = 0;  // A local tensors
  int64_t after = 0;   // B local tensors
  int64_t peak = 0;    // the most held at once
  // What a transition may hold: the larger of the two layouts' holdings plus the budget.
  int64_t bound(int64_t budget) const { return std::max(before, after) + budget; }
};
RankMemory rank_memory(const TransferPlan& plan, const Layout& a, const Layout& b, int rank);

// For each of rank `rank`'s B local tensors, the index of the A local tensor of the same rank
// that it adopts (see the top of this file), else -1. Every transfer into it must be a local
// copy of an identical box (state, start, extent, local_start) of that one A tensor, the two
// tensors of one dense shape and dtype, the boxes covering every element; each A tensor is
// adopted at most once.
std::vector<int> adopted_locals(const TransferPlan& plan, const Layout& a, const Layout& b,
                                int rank);

// What one rank's run_transition did, in bytes. The minimum a transition must move is
// plan.bytes_remote() (summed over ranks: the sent bytes); local bytes are copied only where
// adoption does not apply.
struct TransitionStats {
  int64_t bytes_adopted = 0;  // B local tensors that are A's own (no allocation, no copy)
  int64_t bytes_copied = 0;   // local copies (src == dst) into newly allocated tensors
  int64_t bytes_sent_shm = 0, bytes_received_shm = 0;    // same host, shared memory
  int64_t bytes_sent_comm = 0, bytes_received_comm = 0;  // through the communicator
  // Of those, the bytes of messages cut into stripes over several connections
  // (TransitionOptions::connections); a message of one stripe is not counted here.
  int64_t bytes_sent_striped = 0, bytes_received_striped = 0;
  // What the transition held in tensors, counted as rank_memory counts it (sources until
  // released, destinations from allocation, an adopted tensor once, the communicator's
  // staging): at the start and at the most. The sources count as freed when the
  // router drops its handles; a caller that keeps other handles on them holds more.
  int64_t bytes_held_start = 0, bytes_held_peak = 0;
  // Destinations allocated (adopted ones excluded) and the communicator's staging, in all: a
  // caller that keeps its sources whole holds those on top of them at the end.
  int64_t bytes_allocated = 0, bytes_staging = 0;
  int64_t bytes_shm_reserved = 0;  // this rank's shared-memory segment, for the whole call
  // Acknowledgements (TransitionOptions::acknowledge) sent for messages received through the
  // communicator and awaited for those sent; and how often an allocation had to wait for one
  // (the sources awaiting acknowledgements would have raised the rank above its peak).
  int64_t acks_sent = 0, acks_awaited = 0, ack_waits = 0;
  // Where the call's time went, for the debug line (WEFT_LOG_SUBSYS=router): its wall time;
  // of it the shared-memory setup (collective: it lasts until the last rank reached the
  // move, so across ranks it shows how far apart they arrived), the local copies, the
  // packing into and unpacking out of shared memory (the bytes' copies, page faults of
  // fresh destinations included), the rest waiting for peers in the rounds; and the minor
  // page faults the calling thread took meanwhile.
  double seconds = 0, seconds_setup = 0, seconds_local_copy = 0, seconds_packing = 0,
         seconds_unpacking = 0;
  int64_t page_faults = 0;
};

struct TransitionOptions {
  // Same-host messages (both layouts' hosts equal for the pair) through POSIX shared memory;
  // with hosts empty every rank is its own host and everything uses the communicator. Must be
  // the same on every rank: the shared-memory setup is collective.
  bool shared_memory = true;
  // Per slot of a channel, and slots per channel (at least 2); the receiver's choice wins.
  // 512 KiB x 4 keeps a channel in the last-level cache: 10-12 GB/s between two ranks on a
  // 2-core EPYC VM (memcpy 14 GB/s), against 5 GB/s with 4 MiB x 2.
  int64_t shm_chunk_bytes = int64_t(512) << 10;
  int shm_slots = 4;
  // More connections to the same ranks as the communicator that run_transition is given (each
  // a communicator of its own over the same members in the same rank order: its own TCP
  // connection per pair and its own event loop, parallel/worker_world's extra connections).
  // A communicator-bound message of at least `stripe_min_bytes` is cut into 1 + size()
  // contiguous stripes of equal size (to within a byte), posted at once, the first on the
  // communicator and the others on these; smaller ones go on the communicator alone. One TCP
  // stream rarely fills a link between hosts (per-flow limits, one core's copies, congestion
  // control); several do, as NCCL's sockets per peer. Must be the same on every rank (both
  // ends cut a message alike). Shared-memory messages are not affected.
  std::vector<comm::Communicator*> connections;
  int64_t stripe_min_bytes = int64_t(256) << 10;
  // Called on the rank's thread after every local copy, message and shared-memory chunk, with
  // the running totals (progress reports; tests stop a rank at a chosen point). May throw:
  // the transition then fails like a transport error.
  std::function<void(const TransitionStats&)> on_progress;
  // Serves the destination tensors (what the call returns; they outlive it); null: the host
  // allocator. A memory::RecyclingAllocator with the destinations' blocks reserved ahead
  // spares the transition the page faults of fresh memory. Must outlive the tensors.
  memory::Allocator* destinations = nullptr;
  // Serves the communicator's staging tensors (one outgoing and one incoming message at a
  // time); null: the host allocator. Tests count the transition's memory through it.
  memory::Allocator* staging = nullptr;
  // A sender frees a source that communicator messages read only once their receivers have
  // acknowledged them whole: a receiver sends 8 bytes back (on the communicator, tags of
  // their own) once it has unpacked the last message of the pair that reads a source the
  // sender frees (one per source and receiver: it unpacks a pair's messages in order). A send
  // completes when its bytes are in the kernel or the peer's socket buffer, so without this a
  // receiver stopped before its receive completed (a newer epoch aborting the move) would
  // lose a piece that its sender had freed; shared memory closes the same window by waiting
  // until the receiver drained its slots. Pipelined: the acknowledgement's receive is posted
  // with the message and awaited only when the source must go, so rounds do not wait for it:
  // a source awaiting one stays held and counts against the rank's budget (an allocation that
  // would raise the rank above RankMemory::bound, or rank_memory's peak where that is higher,
  // first waits for the oldest acknowledgement that frees a source), and is freed once they
  // came, at the latest at the end. When the move stops, those sources are still in `src`,
  // reported as held.
  bool acknowledge = true;
  // Tests only: called on the rank's thread once a round's operations are posted, before it
  // waits for them (and before its shared-memory exchange), with the round's incoming
  // message (null when it receives none in that round). May throw: the transition then fails
  // like a transport error. Tests stall a receiver there while its senders' sends complete
  // (RouterStopped).
  std::function<void(int wave, int round, const Message* incoming)> before_wait;
};

// What a rank holds of layout B when run_transition throws (a reshard that a newer epoch
// aborts reports it: launch/live_resize.h), box by box. A destination filled from several
// sources may have some of its pieces and not the others when the move stops, and the
// sources of those it has may be freed already (a local copy's at once, a remote one's once
// acknowledged): those pieces are then on no other rank, so they are reported as they are.
// This costs nothing during the move (the destination is held anyway; only which transfers
// completed is recorded), keeps the memory bound and the schedule as they are, and the next
// world's planner takes the boxes like any other holder's. (The other way, a sender keeping
// each source until every destination it feeds is whole at its receiver, would hold sources
// past their last use, above rank_memory's peak, and wait on receivers' later rounds, which
// the deadlock argument of router_exec.cc does not cover.)
struct Arrived {
  // In B.ranks[rank].locals order: each B local tensor into which some transfer completed
  // (an adopted one from its start), else an undefined tensor.
  std::vector<core::Tensor> tensors;
  // Per local, the same order: empty for a tensor that is whole (every transfer into it
  // completed) or undefined; else the boxes of it that hold their values: the completed
  // transfers' boxes (disjoint, in plan order) as StateBoxes of that local (`local` its index,
  // `local_start` where the box lies in it; replica fields 0/1).
  std::vector<std::vector<StateBox>> partial;
};

// Executes rank `rank`'s part over `comm` (whose ranks are the layouts' ranks). `src` holds
// this rank's A local tensors (A.ranks[rank].locals order, host memory); each is released
// (reset) after its last use (see the memory model above), except that an adopted one lives on
// as a B tensor; memory is freed only where these are the only handles. Returns
// this rank's B local tensors and fills `stats` when not null (also when it throws). When it
// throws, `arrived` (when not null) gets what had arrived of B (Arrived: whole tensors and
// the completed boxes of partly filled ones); `src` then still holds every source not yet
// released (those whose acknowledgement had not come included:
// TransitionOptions::acknowledge). Together they are what the rank holds of the moved state.
// Collective over the communicator when shared memory is used (two all_gathers at the
// start), else over the ranks that appear in the plan, point-to-point only. Shared-memory
// staging is one channel (slots x chunk bytes, reserved in /dev/shm) per same-host rank
// sending to this one, instead of the communicator's staging tensors. Throws CommError from
// either transport (TimeoutError when nothing moved for comm.timeout(), PeerLostError naming
// a dead peer) and InternalError for a src tensor of the wrong shape or dtype.
std::vector<core::Tensor> run_transition(const TransferPlan& plan, const Layout& a, const Layout& b,
                                         int rank, std::vector<core::Tensor>& src,
                                         comm::Communicator& comm,
                                         const TransitionOptions& opt = {},
                                         TransitionStats* stats = nullptr,
                                         Arrived* arrived = nullptr);

// Copies the box `extent` at `src_start` of a dense row-major `src_shape` tensor into
// `dst_start` of a dense `dst_shape` tensor, `elem` bytes per element.
void copy_box(void* dst, const std::vector<int64_t>& dst_shape,
              const std::vector<int64_t>& dst_start, const void* src,
              const std::vector<int64_t>& src_shape, const std::vector<int64_t>& src_start,
              const std::vector<int64_t>& extent, size_t elem);

// Box arithmetic on plain boxes.
bool box_intersect(const std::vector<int64_t>& as, const std::vector<int64_t>& ae,
                   const std::vector<int64_t>& bs, const std::vector<int64_t>& be,
                   std::vector<int64_t>& start, std::vector<int64_t>& extent);

}  // namespace weft::parallel
