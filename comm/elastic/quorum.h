// The membership decision as a pure function: given the record and which nodes are alive,
// does a new epoch form, and with whom? No I/O, no clock, so every rule is unit-testable.
//
// Rules (after TorchFT's Lighthouse quorum and torchelastic's rendezvous):
// - Before epoch 1: once at least MIN alive nodes wait, form epoch 1 at once when MAX
//   wait, else after last_call; the first min(n, MAX) in arrival order get ranks 0, 1, ...;
//   the rest stay spares.
// - Fast path: every member of the epoch alive and nobody left -> nothing changes (no new
//   epoch), unless spares wait and the membership is below MAX: then grow (after last_call,
//   or at once when the spares fill it to MAX).
// - Otherwise (a member's heartbeat expired, or a member left): a new epoch needs a strict
//   majority of the epoch's members that did not leave (B) alive, 2*|alive ∩ B| > |B|, and
//   at least MIN nodes (alive members plus alive spares). Survivors keep their ranks;
//   spares fill the free ranks, lowest first, in arrival order, up to MAX. Without the
//   majority the viewer has lost quorum (a member stops itself); with the majority but
//   below MIN it waits for joiners.
//
// - Departed nodes (members that left handing their state over) stay departed in every
//   later epoch until their hand-over is confirmed (Rendezvous::confirm_handover removes
//   them) or they are gone (their alive key, kept until then, expired): a leave during an
//   earlier leave's move must not drop the earlier leaver's shard. One that is gone forms
//   a new epoch without it, as a lost member does.
//
// Why there is never a split brain (two memberships for one epoch, or two live epochs
// whose members are disjoint majorities):
// 1. One history. Every change is compare_set(old bytes -> new bytes) on one key of one
//    linearisable store, and every write carries version+1 and its writer, so the writes
//    form a single chain: each value has exactly one successor. Epoch E+1 is written only
//    as the successor of a value with epoch E, so exactly one membership ever claims E+1.
// 2. Each epoch holds a strict majority of the last. The writer of E+1 keeps every member
//    of E it saw alive and needs 2*|alive ∩ B_E| > |B_E|. Two disjoint subsets of B_E cannot
//    both be strict majorities, so a minority can never found an epoch of its own, and any
//    two consecutive epochs share a node. (A member that leaves gracefully declares it in
//    the record first, so B_E is exact, not a guess from a missing heartbeat.)
// 3. Nobody acts on a stale epoch for long. Every agent re-reads the record on each poll:
//    if it moved past the agent's epoch without it, the agent was removed and stops; if the
//    record still says E but the agent sees no majority of E alive, it is in a minority
//    partition and stops itself (QuorumLostError) instead of waiting for a majority that
//    has moved on. The verdict is taken between two identical reads of the record, so a
//    concurrent graceful leave cannot be mistaken for a failure. Between the write of E+1
//    and a removed member's next poll, that member may still think E is current, but E's
//    other members are a strict majority that has moved to E+1: the stale node is alone with
//    a minority of E and cannot complete any of E's collectives, let alone commit a step.
#pragma once

#include <set>
#include <string>

#include "comm/elastic/membership_record.h"

namespace weft::comm {

enum class Verdict {
  kStable,      // nothing to do: the epoch stands (the fast path)
  kForm,        // write Decision::next, a new epoch
  kLastCall,    // a new epoch could form; waiting for last_call or for MAX nodes
  kTooFew,      // fewer than MIN nodes available (with quorum): wait for joiners
  kQuorumLost,  // fewer than a strict majority of the epoch's members alive
};
const char* to_string(Verdict v);

struct Decision {
  Verdict verdict = Verdict::kStable;
  // For kForm: `current` with epoch+1, the new members, the remaining alive spares and no
  // `left`; version and writer are the caller's to stamp. Otherwise unspecified.
  MembershipRecord next;
  // One line for logs and errors: "2 of 3 members of epoch 1 alive; ...".
  std::string why;
};

// `alive`: node ids whose heartbeat key exists (members, spares and departed; others are
// ignored).
// `last_call_passed`: whether the caller has waited last_call since it first saw kLastCall.
// Requires 1 <= min_nodes <= max_nodes; a closed record yields kStable.
Decision decide(const MembershipRecord& current, const std::set<std::string>& alive, int min_nodes,
                int max_nodes, bool last_call_passed);

}  // namespace weft::comm
