// What `weft calibrate` does when its collectives contradict themselves
// (planner/calibration_check.h): it probes the world that breaks a rule again, a bounded
// number of times, each probe's calls joining the least of the others; a contradiction that
// survives them refuses the whole calibration (calibrate_machine throws, nothing is written,
// the machine's previous cache stays). Refused rather than written with the point replaced
// by the rule's bound: the bound is no measurement (an all-reduce priced at exactly its
// reduce-scatter + all-gather leaves the lowering's choice between them to a tie), and the
// disturbance that held through four probes of one world also sat in the other numbers of
// the same minutes.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "planner/calibration_check.h"

namespace weft::launch {

// One probe of the collectives at `world` processes: call name -> seconds
// (probe_collectives). Empty when the probe failed.
using CollectiveProbe = std::function<std::map<std::string, double>(int world)>;
// Every probe's values: world -> name -> one value per probe.
using ProbeRuns = std::map<int, std::map<std::string, std::vector<double>>>;

// At most this many more probes of a world whose collectives break a rule (about 1-2 s each
// on 2 cores): a disturbance of a few seconds is outlasted; one that holds through them says
// the machine is too busy to calibrate.
constexpr int kMaxRemeasures = 3;

// Each call's least over its probes (the step-like loops' segments, `name@k`, left out: their
// level is another estimate, link_fit.h's load_robust_level).
planner::CollectiveTimes least_times(const ProbeRuns& runs);

struct CollectiveRecheck {
  std::vector<planner::CollectiveContradiction> found;  // at the first check
  std::vector<planner::CollectiveContradiction> left;   // after re-measuring; empty: consistent
  std::map<int, int> remeasured;                        // world -> probes added
};

// Checks the least times of `runs` (planner::check_collectives at `cores`) and, while a world
// breaks a rule and was probed again fewer than `max_remeasures` times, probes it once more
// (`probe`), appending its values to `runs`. `progress` (may be empty) gets a line per probe
// added. Throws Error when a probe fails.
CollectiveRecheck recheck_collectives(ProbeRuns& runs, int cores, const CollectiveProbe& probe,
                                      int max_remeasures = kMaxRemeasures,
                                      const std::function<void(const std::string&)>& progress = {});

// The refusal: the contradictions left, the probes each world took, and what to do.
std::string refusal_message(const CollectiveRecheck& r);

}  // namespace weft::launch
