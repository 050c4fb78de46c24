// A calibration cache for tests of the job's cost model: a CPU host's description (figures
// of a 2-core VM, rounded), named after this machine so that planner::read_machine_cache
// takes it. Its plans differ from CostModel's defaults (another gradient bucket split, other
// layout conversions), which is what the tests need: ranks planning under the two would run
// different programs.
#pragma once

#include <string>

#include "planner/hardware.h"

namespace weft::test {

inline planner::Hardware cpu_host_calibration() {
  planner::Hardware hw;
  hw.name = "calibrated";
  hw.flops_f32 = hw.flops_bf16 = 1e11;
  hw.memory_bw = 1.8e10;
  hw.memory_gib = 24;
  hw.ranks_per_node = 1 << 20;
  hw.intra = hw.inter = planner::Link{2.4e9, 1e-4, 1};
  hw.cores = 2;
  hw.op_overhead = 5e-6;
  hw.launch_oversub = 9e-5;
  // Small all-reduces far slower per byte than all-gathers: the curves of a calibration
  // measured while the machine was disturbed (a real all-reduce never costs more than its
  // reduce-scatter + all-gather). `weft calibrate` now refuses such measurements and the
  // loader skips a cache that records them (planner/calibration_check.h); this description
  // records no measurements, so it is taken as one written by hand, which is what lets the
  // tests plan under curves that differ from the defaults'.
  hw.coll_bw_by_size[0] = {{65536, 1.7e7}, {262144, 6.6e7}, {1048576, 2.4e8}, {4194304, 9.6e8}};
  hw.coll_bw_by_size[1] = {{65536, 4.6e8}, {262144, 6.4e8}, {1048576, 8.4e8}, {4194304, 8.3e8}};
  hw.coll_bw_by_size[2] = {{65536, 1.1e8}, {262144, 2.4e8}, {1048576, 1.1e8}, {4194304, 4.2e8}};
  hw.machine = planner::this_machine();
  hw.calibrated_at = "2026-12-05T21:00:00Z";
  return hw;
}

// The same machine's cache, measured as a datacenter node would be: plans like the defaults'.
inline planner::Hardware h200_calibration() {
  planner::Hardware hw = planner::load_hardware("h200");
  hw.machine = planner::this_machine();
  hw.calibrated_at = "2026-12-05T21:00:00Z";
  return hw;
}

}  // namespace weft::test
