// `weft bench scaling`: config S tokens/s at world 1 and dp2 (scaling efficiency), and for every
// layout of the parallelism issue the measured step time of the real multi-process trainer
// beside the planner's simulated step time under this machine's calibration (weft calibrate),
// and the median error.
#pragma once

#include <string>
#include <vector>

namespace weft::launch {

// argv[0] is "scaling". Options: --quick (world 1 and dp2 of config S only, 2 steps), --steps N,
// --recalibrate.
int run_scaling(const std::vector<std::string>& argv);

}  // namespace weft::launch
