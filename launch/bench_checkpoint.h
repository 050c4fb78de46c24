// `weft bench checkpoint`: checkpoint save/load throughput beside this disk's raw sequential
// write/read, the step-time cost of async against sync saves, and in-memory resharding.
#pragma once

#include <string>
#include <vector>

namespace weft::launch {

// argv excludes "checkpoint": [--quick] [--dir DIR] [--threads N] [--steps N]
// [--parts reshard,disk,steps]. Returns the exit code; throws ConfigError for bad
// arguments, IoError when the scratch folder fails.
int run_checkpoint_bench(const std::vector<std::string>& argv);

}  // namespace weft::launch
