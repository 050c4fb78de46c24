// `weft calibrate`'s re-measure and refusal (calibration_recheck.h).
#include "launch/calibration_recheck.h"

#include <algorithm>
#include <set>

#include "base/error.h"

namespace weft::launch {

planner::CollectiveTimes least_times(const ProbeRuns& runs) {
  planner::CollectiveTimes t;
  for (const auto& [n, calls] : runs)
    for (const auto& [name, v] : calls)
      if (name.find('@') == std::string::npos && !v.empty())
        t[n][name] = *std::min_element(v.begin(), v.end());
  return t;
}

CollectiveRecheck recheck_collectives(ProbeRuns& runs, int cores, const CollectiveProbe& probe,
                                      int max_remeasures,
                                      const std::function<void(const std::string&)>& progress) {
  CollectiveRecheck r;
  r.found = planner::check_collectives(least_times(runs), cores);
  r.left = r.found;
  while (!r.left.empty()) {
    std::set<int> worlds;
    for (const auto& c : r.left)
      if (r.remeasured[c.world] < max_remeasures) worlds.insert(c.world);
    if (worlds.empty()) break;
    for (int n : worlds) {
      std::map<std::string, double> one = probe(n);
      if (one.empty())
        throw Error("weft calibrate: re-measuring the Gloo probe on " + std::to_string(n) +
                    " processes failed (log named above)");
      for (const auto& [k, v] : one) runs[n][k].push_back(v);
      ++r.remeasured[n];
      if (progress) {
        std::string why;
        for (const auto& c : r.left)
          if (c.world == n) why += "\n  " + c.text;
        progress("gloo, " + std::to_string(n) + " processes: measured again (" +
                 std::to_string(r.remeasured[n]) + " of at most " + std::to_string(max_remeasures) +
                 "), its collectives contradicted themselves:" + why);
      }
    }
    r.left = planner::check_collectives(least_times(runs), cores);
  }
  return r;
}

std::string refusal_message(const CollectiveRecheck& r) {
  std::string probes;
  for (const auto& [n, k] : r.remeasured)
    probes += (probes.empty() ? "" : ", ") + std::to_string(k) + " more probes at " +
              std::to_string(n) + " processes";
  return "the measured collectives still contradict themselves after " + probes +
         ", so this calibration is not written (the planner would choose programs by "
         "them; the machine's previous calibration, if any, stays):\n" +
         planner::describe(r.left) +
         "\nOther processes held the cores while it measured; run `weft calibrate` again when "
         "the machine is quieter (docs/planner.md, \"a calibration checks its collectives\").";
}

}  // namespace weft::launch
