// Tests only: a snapshot slot rewritten while a live move reads it in place (issue 15). The
// move's sources are views of the agent's slots (checkpoint/snapshot_views.h); a slot written
// again before the move has ended may send other bytes than the verified ones, to this rank
// and to others, and every rank of the move must then refuse the moved state
// (checkpoint::agree_slots_unchanged). This hook makes that happen in a real job.
#pragma once

#include <cstdint>
#include <functional>

#include "checkpoint/snapshot_offers.h"
#include "parallel/router.h"

namespace weft::launch {

// WEFT_TEST_REWRITE_SNAPSHOT=<epoch>:<rank>:<how>: in the entry of membership epoch <epoch>
// (its first attempt, round 0, as WEFT_TEST_STALL_MOVE), rank <rank>, right after its move's
// first message (bytes sent or received), rewrites the first snapshot slot it read for the
// move (`offers`' first read slot), as the node's agent would write that segment:
//  - a writer takes only a slot that is not the segment's newest committed one, so until the
//    read slot is not, the read snapshot is committed again into the segment, unchanged (its
//    step and bytes: a later recovery may still choose that step from it);
//  - then a writer takes the read slot and overwrites its payload; <how> `torn`: the writer
//    stays in it (uncommitted, as a writer killed midway); `committed`: it commits a newer
//    snapshot there (the step after, other bytes).
// The rank says what it did on stdout, naming the segment, the slot and the step. Returns no
// hook when the variable is unset (every real run) or names another epoch, round or rank;
// ConfigError naming the variable when it does not parse.
std::function<void(const parallel::TransitionStats&)> snapshot_rewrite_for_tests(
    int64_t epoch, bool first_round, int rank, const checkpoint::SnapshotOffers& offers);

}  // namespace weft::launch
