// The collective terms of the cost model fitted by least squares over message sizes (what
// `weft calibrate` does with its Gloo probes). Each probe is a sample of the model's form
//   seconds = launches * launch + steps * latency + bytes / bw
// (planner/cost.cc: a ring all-reduce of n ranks is 1 launch, 2(n-1) steps and 2(n-1)/n of
// its bytes on the wire; a one-way message is 0 launches, 1 step and its bytes), so the
// three terms come from one linear fit over every size and world measured, not from two
// points each. The fit is on relative error: a 4 B call's 30 us counts as much as a 4 MiB
// call's milliseconds.
//
// Robust to load: a sample taken while other processes held the cores waits a time slice
// (milliseconds) on top of its tens of microseconds, and one such sample fitted a 4 B call's
// launch at milliseconds. Each sample is compared with the fit of the others, and one that
// took more than kLoadOutlier times what they predict is left out (LinkFit::rejected).
#pragma once

#include <map>
#include <string>
#include <vector>

namespace weft::launch {

struct LinkSample {
  double launches = 0, steps = 0, bytes = 0;  // the model's coefficients for this call
  double seconds = 0;                         // measured
  std::string name;                           // for the report
};

// How many times the others' prediction a sample must take to be a load outlier: the
// model's own misfit (Gloo switching algorithm with the size) stays within 2x on an idle
// machine, a time slice on a call under 1 ms is several times it.
constexpr double kLoadOutlier = 3.0;

// The one rule every estimate of `weft calibrate` rejects a measurement by: it took more than
// kLoadOutlier times what it is expected to take (the fit of the other samples, the least of
// its repeats, the fit's idle call).
inline bool is_load_outlier(double measured, double expected) {
  return expected > 0 && measured > kLoadOutlier * expected;
}

// The level of a quantity measured many times on a shared machine: the step-like loops'
// segments (sync_*), over probes interleaved in time. Each sample comes with how long its
// threads waited for a core (their run delay: another process held it). The level is the
// mean of the least-delayed quarter of the samples (the machine at its quietest over the
// calibration, as each call's least of three probes is), less any of those more than
// kLoadOutlier times their median (is_load_outlier: a wait the run delay did not see, the
// peer's). The mean, not the least: a step pays every call, the slow ones of an idle
// machine included (a scheduler tick now and then); and the samples as measured, not less
// their delay: a step on this machine pays some, as the loops do at their quietest. Where
// no sample has a delay (none recorded), every one is kept, less the outliers.
struct LoadSample {
  double value = 0;
  double delay = 0;  // of it, the measuring threads' wait for a core (seconds, >= 0)
};
struct LoadRobustLevel {
  double value = 0;
  double raw = 0;  // the mean of every sample, for the record
  int kept = 0, rejected = 0;
};
// Throws Error when `samples` holds no positive value.
LoadRobustLevel load_robust_level(const std::vector<LoadSample>& samples);

// One step-like loop's samples for load_robust_level: every segment `loop@k` of `probe`
// (name -> one value per probe repeat), each with its `loop@k_delay` of the same repeat (0
// where none was recorded). The same at every world: over the cores too since the
// communication threads' short slice (docs/planner.md, "after the short slice").
std::vector<LoadSample> loop_segments(const std::map<std::string, std::vector<double>>& probe,
                                      const std::string& loop);

// A wait curve's plausibility check and refit: the wait of a collective by the compute
// before it (sync_wait_by_burst and the curves over the cores) cannot fall as that compute
// grows (the skew a burst lets the ranks gather only grows with it), so a point above a
// later one is load the run delay did not take out. Where the curve falls, the closest
// non-decreasing curve in least squares replaces it (adjacent points pooled to their mean);
// returns how many points moved (0: the curve was plausible and is unchanged).
int refit_non_decreasing(std::vector<std::pair<double, double>>& curve);

struct LinkFit {
  double launch = 0, latency = 0, bw = 0;  // seconds, seconds, bytes per second
  double rms_relative_error = 0;           // of the fitted model over the samples
  double worst_relative_error = 0;
  std::string worst;                       // the sample furthest from the model
  std::vector<std::string> rejected;       // samples left out as load outliers
};

// The least-squares terms (each clamped at 0: a term the samples cannot see is 0, and the
// bandwidth is then taken as the largest sample's bytes over its time) over the samples
// left after the load outliers (at most a quarter of them; the errors are over those left).
// Throws Error naming what is missing when the samples cannot determine the bandwidth (no
// two sizes).
LinkFit fit_link(const std::vector<LinkSample>& samples);

// The launch of a collective whose peer computes (CostModel::launch): what `busy_ar2`, a
// 4 B all-reduce of 2 processes timed between bursts of compute, takes beyond its 2 steps
// at `latency`. The busy call is a sample like the fit's: where it took more than
// kLoadOutlier times the fit's idle call (launch + 2 latency), another process held a core
// through every repeat, and the launch is the fit's (load_outlier set). On an idle machine
// the busy call is 1.2-1.5x the idle one (its peer computing) and is kept.
struct BusyLaunch {
  double launch = 0;
  bool load_outlier = false;
  double idle_call = 0;  // the fit's 4 B all-reduce of 2
};
BusyLaunch busy_launch(const LinkFit& f, double busy_ar2, double latency);

}  // namespace weft::launch
