// `weft calibrate`: measures this machine for the cost model and writes its hardware
// description to the machine's cache file, which `weft plan` and `weft bench scaling` then
// use (planner/hardware.h has the format, the cache's name and when it is used).
#include <chrono>
#include <cstdio>

#include "base/error.h"
#include "launch/args.h"
#include "launch/calibration.h"
#include "launch/commands.h"
#include "planner/hardware.h"

namespace weft::launch {
namespace {

constexpr const char* kHelp = R"(usage: weft calibrate [--out FILE] [--print]

Measures this machine for the planner's cost model, in about 30-50 s: single-thread GEMM
rates at six shapes (the FLOP rate by op size), memcpy and an element-wise kernel, Gloo
collectives and sends between 2 and 4 processes under `weft run` (latency, bandwidth, the
cost of more processes than cores; a step-like loop at 8 processes), and the executor's cost per instruction from a small
model's steps. The collectives must not contradict themselves (an all-reduce no slower than
its reduce-scatter + all-gather, no call faster than a smaller one of its kind, within 1.5x):
a world that does is probed again, up to 3 times, and a calibration that still does is not
written (the error names the call and the numbers; the previous cache stays). Writes a
hardware description (docs/planner.md) to this machine's cache:
  $WEFT_COST_CACHE, else $XDG_CACHE_HOME/weft/cost-<host>-<cpu hash>-<OPENBLAS_CORETYPE>.yaml,
  else ~/.cache/weft/cost-<...>.yaml
`weft plan` (without --hardware) and `weft bench scaling` use it when it names this machine.

  --out FILE   write there instead of the machine's cache
  --print      also print the description
)";

}  // namespace

int cmd_calibrate(const std::vector<std::string>& argv) {
  Args a(argv, {"--out", "--probe"}, {"--print", "--help", "--waits-only"});
  if (a.flag("--help")) {
    std::fputs(kHelp, stdout);
    return 0;
  }
  if (a.has("--probe"))  // one rank of the Gloo probe
    return probe_worker(a.get("--probe"), a.flag("--waits-only"));
  const std::string path = a.get_or("--out", planner::machine_cache_path());
  const auto t0 = std::chrono::steady_clock::now();
  CalibrationOptions opt;
  opt.progress = [&](const std::string& line) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("[%5.1f s] %s\n", s, line.c_str());
    std::fflush(stdout);
  };
  std::printf("weft calibrate: machine %s\n", planner::machine_id(planner::this_machine()).c_str());
  std::fflush(stdout);
  planner::Hardware hw = calibrate_machine(opt);
  planner::write_machine_cache(hw, path);
  if (a.flag("--print")) std::fputs(planner::hardware_to_yaml(hw).c_str(), stdout);
  std::printf("wrote %s (%.1f s)\n", path.c_str(),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return 0;
}

}  // namespace weft::launch
