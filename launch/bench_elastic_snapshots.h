// `weft bench elastic --mode reshard|both`: the live side's in-memory snapshots. A user who
// shards state (ZeRO, tp, pp, ep) and wants a job to survive a failure runs with snapshots,
// so the bench does too wherever its failure row would otherwise lose state: whether it would
// is read from the plan's VPS layout of the failure's world (a state box that one rank holds
// alone dies with that rank's node), never from the layout's names.
#pragma once

#include <cstdint>
#include <string>

#include "core/config/job_spec.h"
#include "launch/bench_elastic_parts.h"

namespace weft::launch::bench {

// The world the failure row kills a node of (4 -> 3), one rank per node.
inline constexpr int kFailureWorld = 4;

// What of `spec`'s state over `world` ranks (one per node) exists on one rank only.
struct LosableState {
  int world = 0;
  int64_t alone_bytes = 0;  // of the boxes that one rank holds alone
  int64_t state_bytes = 0;  // of the whole state, each element once
  int64_t payload = 0;      // the largest rank's snapshot payload
  std::string example;      // a state tensor with a box held alone
  int min_holders = 0;      // the fewest ranks holding any one box
};
LosableState losable_state(const core::JobSpec& spec, int world);

// Decides the live side's snapshots (sets o.live_sets, reloads o.spec with them, sets
// o.snapshot_header): snapshot.every auto and snapshot.redundancy replica, before the user's
// --set, when the failure's world holds state on one rank only; none otherwise (the user's
// snapshot.* settings pass through either way). ConfigError naming the key when the choice
// cannot survive the failure row (snapshots off, redundancy none, ec wider than the world).
void choose_snapshots(Options& o);

}  // namespace weft::launch::bench
