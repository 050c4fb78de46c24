// `weft bench snapshot --parts overhead`: what in-memory snapshots add to a training step.
// The same job (binary, ranks, threads, OMP_NUM_THREADS, OPENBLAS_*) runs with
// snapshot.every 0 (the baseline) and 1, in alternating rounds (--rounds: other load on a
// shared machine drifts over minutes and would otherwise fall on one side), then every 2,
// then, when it is larger, the interval recommended as the default (chosen from the
// measurement unless --every names it). Per-step times are metrics step_ms (the trainer's
// step, which includes the wait for an unfinished copy before the first optimizer update);
// the workers' CPU time is sampled as each step's line arrives.
//
// Counted steps: from step 3 on (the first pays for first-touch and connections), without
// the first two snapshots' steps (each writes a slot whose pages this worker touches for
// the first time). At every K a step either overlaps a copy (step s with s % K == 0: the
// snapshot after step s - 1 is copied during it) or not; the time per step at every K is
// ((K - 1) x the median of the others + the median of the copy steps) / K, which needs only
// a few copies for any K. At K > 1 each copy step is also compared with its two neighbours
// in the same run, which overlap no copy: what one snapshot adds, free of the drift between
// runs, by wall clock and in the workers' CPU time. Every 1 pays that once per step; the
// default interval and the 1.2x target are read from the CPU figure of the every-2 run
// (other load on a shared machine moves wall-clock steps by tens of percent, not the work
// they do), the wall-clock figures and the comparison of whole runs are printed beside.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>

#include "base/check.h"
#include "base/error.h"
#include "core/io/metrics.h"
#include "launch/bench_elastic_parts.h"
#include "launch/bench_snapshot_parts.h"

namespace weft::launch::snapbench {
namespace {

constexpr int kWarm = 3;              // steps 0..2 are not counted
constexpr double kStepTarget = 0.01;  // the issue: <= 1% more step time at the default
constexpr double kCopyTarget = 1.2;   // ... and <= 1.2x the copy's cost at every 1
constexpr int kMostInterval = 1000;   // a recommendation beyond it: noise, not a copy
constexpr double kProgressEvery = 5;  // seconds between progress lines of a run

bool copy_step(long long m, int every) { return every > 0 && m % every == 0; }
bool counted(long long m, int every) {
  return m >= kWarm && !(copy_step(m, every) && m < 3LL * every);
}

// CPU times are averaged: where a worker's CPU clock cannot be read they come in clock ticks
// of 10 ms, and a median of multiples of a tick is one.
double mean(std::vector<double> v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? std::nan("") : s / double(v.size());
}

// A variant's counted steps over its runs.
struct Measured {
  int every = 0, runs = 0;
  std::vector<double> copy, other;          // step_ms of copy steps and of the others
  std::vector<double> cpu_copy, cpu_other;  // the workers' CPU ms, the same steps
  std::vector<double> paired;      // K > 1: a copy step less the mean of its two neighbours
  std::vector<double> paired_cpu;  // the same in the workers' CPU ms
  int steps() const { return int(copy.size() + other.size()); }
  // Medians of wall-clock times; means of CPU times (see mean()).
  static double per_step(int every, const std::vector<double>& c, const std::vector<double>& nc,
                         double (*avg)(std::vector<double>)) {
    if (every == 0) return avg(nc);
    if (every == 1) return avg(c);
    return ((every - 1) * avg(nc) + avg(c)) / every;
  }
  double step_ms() const { return per_step(every, copy, other, median); }
  double cpu_ms() const { return per_step(every, cpu_copy, cpu_other, mean); }
};

// Steps a run takes: kWarm + `counted` counted; at every K > 1 also (2 + o.copies)
// snapshots (the first two are not counted).
int run_steps(const Options& o, int every, int counted) {
  int n = kWarm + counted;
  if (every > 1) n = std::max(n, (2 + o.copies) * every + 1);
  return n;
}

// One run of `j` at `every` with `counted` counted steps, added to `m`.
void measure(const Options& o, const JobShape& j, int counted_steps, Measured& m) {
  const int every = m.every;
  const int steps = run_steps(o, every, counted_steps);
  const std::string label = str("overhead ", j.name, " every=", every, " run ", m.runs + 1);
  progress(str(label, ": ", steps, " steps"));
  JobRun run(o, j, label,
             {"train.steps=" + std::to_string(steps), "snapshot.every=" + std::to_string(every)},
             0);
  std::map<long long, double> cpu_at;  // the workers' CPU seconds as step s's line arrived
  std::vector<double> so_far;
  double said = run.now(), prev_t = -1;
  run.watch(
      [&](const StampedLine& l) {
        const long long s = step_line(l.text);
        if (s < 0) return;
        cpu_at[s] = run.workers_cpu_s();
        if (prev_t >= 0 && s >= kWarm) so_far.push_back(1e3 * (l.t - prev_t));
        prev_t = l.t;
        if (l.t - said >= kProgressEvery || s + 1 == steps) {
          said = l.t;
          progress(str(label, ": step ", s + 1, " of ", steps,
                       so_far.empty() ? std::string()
                                      : str(", ", std::lround(median(so_far)),
                                            " ms a step so far (arrivals)")));
        }
      },
      [] { return false; });
  if (run.running() || run.exit_code() != 0)
    throw IoError(str(label, ": ",
                      run.running() ? str("not done within --timeout ", o.timeout, " s")
                                    : str("weft run exited with code ", run.exit_code()),
                      "\n", run.tail()));
  std::map<long long, double> ms;
  for (const core::io::MetricsRow& r : core::io::read_metrics(run.metrics().string()))
    if (!r.is_validation() && r.has("step_ms")) ms[(long long)r.at("step")] = r.at("step_ms");
  if ((long long)ms.size() < steps)
    throw IoError(str(label, ": ", ms.size(), " of ", steps, " steps in ", run.metrics().string()));
  m.runs++;
  std::map<long long, double> cpu;  // CPU ms of step s: between the lines of s - 1 and s
  for (const auto& [s, c] : cpu_at)
    if (auto p = cpu_at.find(s - 1); p != cpu_at.end()) cpu[s] = 1e3 * (c - p->second);
  for (const auto& [s, x] : ms) {
    if (!counted(s, every)) continue;
    const bool c = copy_step(s, every);
    (c ? m.copy : m.other).push_back(x);
    if (cpu.count(s)) (c ? m.cpu_copy : m.cpu_other).push_back(cpu.at(s));
    if (c && every > 1 && ms.count(s - 1) && ms.count(s + 1))
      m.paired.push_back(x - 0.5 * (ms.at(s - 1) + ms.at(s + 1)));
    if (c && every > 1 && cpu.count(s) && cpu.count(s - 1) && cpu.count(s + 1))
      m.paired_cpu.push_back(cpu.at(s) - 0.5 * (cpu.at(s - 1) + cpu.at(s + 1)));
  }
}

// The spread of a baseline's counted steps: (q3 - q1) / median.
double spread(std::vector<double> x) {
  if (x.size() < 4) return std::nan("");
  std::sort(x.begin(), x.end());
  return (x[x.size() * 3 / 4] - x[x.size() / 4]) / median(x);
}

std::string pct(double r) {
  char b[32];
  std::snprintf(b, sizeof b, "%+.1f%%", r * 100);
  return b;
}

struct Config {
  JobShape shape;
  double copy_ms = 0;  // its snapshot's bytes / memcpy
  Measured base{0}, one{1}, two{2};
  std::optional<Measured> k;  // the default interval when it is neither 1 nor 2
  // What one snapshot adds: every 1 against the baseline runs, and within the every-2 run (a
  // copy step against its two neighbours: free of drift between runs).
  double across_ms() const { return one.step_ms() - base.step_ms(); }
  double within_ms() const { return median(two.paired); }
  // The same in the CPU time of the job's workers, per rank (each copies its own snapshot on
  // its own thread): what other load on the machine moves far less than the wall clock (a
  // step's work is the same however long it waits for a core).
  double within_cpu_ms() const { return mean(two.paired_cpu) / shape.ranks; }
  // What a snapshot adds as a share of the step, by wall clock and by CPU time.
  double share(const Measured& m, bool by_cpu) const {
    return by_cpu ? mean(m.paired_cpu) / mean(m.cpu_other) : median(m.paired) / median(m.other);
  }
  const Measured* at(int every) const {
    return every == 1 ? &one : every == 2 ? &two : k ? &*k : nullptr;
  }
};

std::string fixed(double x, int decimals, bool sign = false) {
  char b[48];
  std::snprintf(b, sizeof b, sign ? "%+.*f" : "%.*f", decimals, x);
  return b;
}

void print_row(const Config& c, const Measured& m) {
  const bool b = m.every == 0;
  const double base = c.base.step_ms();
  const double per_snapshot = (m.step_ms() - base) * m.every;  // what one adds
  std::printf("%-6s | %5d | %4d | %5d | %9.1f | %7.3f | %9s | %8s | %7s | %8.1f | %7.3f\n",
              c.shape.name.c_str(), m.every, m.runs, m.steps(), m.step_ms(), m.step_ms() / base,
              b ? "-" : fixed(per_snapshot, 1, true).c_str(), b ? "-" : fixed(c.copy_ms, 2).c_str(),
              b ? "-" : fixed(per_snapshot / c.copy_ms, 2).c_str(), m.cpu_ms(),
              m.cpu_ms() / c.base.cpu_ms());
}

}  // namespace

void run_overhead(const Options& o) {
  std::vector<Config> cs;
  for (const std::string& name : o.configs) cs.push_back({make_shape(name, o, false)});
  int64_t most = 0;
  for (const Config& c : cs) most = std::max(most, c.shape.payload);
  // Out of the caches (64 MiB at least) unless --mib is smaller: past them the rate is the
  // same for any size.
  const CopyRates rates = measure_copy_rates(
      std::min<int64_t>(o.mib << 20, std::max<int64_t>(most, int64_t(64) << 20)));
  for (Config& c : cs) c.copy_ms = 1e3 * double(c.shape.payload) / rates.memcpy_bps;
  const std::string load_before = load_average();

  // Alternating rounds: baseline, every 1, baseline, every 1, ... per config; then every 2.
  const int per_run = (o.steps + o.rounds - 1) / o.rounds;
  for (int r = 0; r < o.rounds; ++r)
    for (Config& c : cs) {
      measure(o, c.shape, per_run, c.base);
      measure(o, c.shape, per_run, c.one);
    }
  for (Config& c : cs) measure(o, c.shape, o.steps, c.two);
  // The default interval: the smallest K at which what one snapshot adds within a run, in
  // the workers' CPU time, spread over K steps, is under 1% of the step's on every config
  // measured. CPU time: on a shared machine other load moves the wall clock of whole steps
  // by tens of percent and not the work they do; on a quiet one with every core training,
  // the CPU a copy takes from training is what it adds to the step.
  auto interval = [&](bool by_cpu) {
    int most = 1;
    for (const Config& c : cs) {
      const double share = c.share(c.two, by_cpu);
      if (share > 0)
        most = std::max(
            most, int(std::min<double>(kMostInterval, std::ceil(share / kStepTarget - 1e-9))));
    }
    return most;
  };
  const int k_wall = interval(false);
  int k = o.every > 0 ? o.every : interval(true);
  if (k > 2)
    for (Config& c : cs) {
      c.k.emplace(Measured{k});
      measure(o, c.shape, o.steps, *c.k);
    }

  std::printf("== overhead: per-step time with snapshot.every 0 (baseline), 1, 2%s, side by side\n",
              k > 2 ? str(" and ", k).c_str() : "");
  for (const Config& c : cs) std::printf("  %s\n", c.shape.describe().c_str());
  const char* blas = std::getenv("OPENBLAS_CORETYPE");
  std::printf(
      "  every run: weft run --standalone, OMP_NUM_THREADS = train.threads, "
      "WEFT_PLAN_EXECUTOR=1 (one rank too), OPENBLAS_CORETYPE=%s; every 0 and 1 alternate in %d "
      "round%s; %s before, %s after\n",
      blas ? blas : "(unset)", o.rounds, o.rounds == 1 ? "" : "s", load_before.c_str(),
      load_average().c_str());
  std::printf(
      "  one thread in this process, %lld MiB per copy, best of 7: memcpy into touched memory "
      "%.2f GB/s; the snapshot writer (memcpy + crc32c per MiB into a shared-memory "
      "slot) %.2f GB/s = %.2f x memcpy; verifying a slot (crc32c) %.2f GB/s\n",
      (long long)(rates.bytes >> 20), rates.memcpy_bps / 1e9, rates.writer_bps / 1e9,
      rates.writer_bps / rates.memcpy_bps, rates.verify_bps / 1e9);
  std::printf(
      "  step ms: median of metrics step_ms over the counted steps of every run (from "
      "step %d, not the first two snapshots' steps; at every > 1 the copy steps and the "
      "others weighted 1 : K - 1); cpu ms: the workers' CPU time per step, the same way\n",
      kWarm);
  std::printf("%-6s | %5s | %4s | %5s | %9s | %7s | %9s | %8s | %7s | %8s | %7s\n", "config",
              "every", "runs", "steps", "step ms", "x base", "+ms/snap", "copy ms", "x copy",
              "cpu ms", "x base");
  for (const Config& c : cs) {
    print_row(c, c.base);
    print_row(c, c.one);
    print_row(c, c.two);
    if (c.k) print_row(c, *c.k);
  }
  std::printf(
      "  +ms/snap: (step ms - the baseline's) x every, what one snapshot adds; copy ms: the "
      "snapshot's bytes / memcpy above, its own cost; x copy: their ratio\n");
  std::printf(
      "  within a run (no drift between runs in it; at every 1 each step pays one such copy): "
      "a copy step less the mean of its two neighbours, by wall clock (median) and in the "
      "workers' CPU time (mean, per rank); share: of the step without a copy\n");
  std::printf("%-6s | %5s | %6s | %9s | %7s | %7s | %9s | %7s | %7s\n", "config", "every", "copies",
              "+ms/snap", "x copy", "share", "+cpu ms", "x copy", "share");
  for (const Config& c : cs)
    for (const Measured* m : {c.at(2), c.k ? &*c.k : nullptr}) {
      if (!m) continue;
      const double add = median(m->paired), cpu = mean(m->paired_cpu) / c.shape.ranks;
      std::printf("%-6s | %5d | %6zu | %9s | %7s | %7s | %9s | %7s | %7s\n", c.shape.name.c_str(),
                  m->every, m->paired.size(), fixed(add, 1, true).c_str(),
                  fixed(add / c.copy_ms, 2).c_str(), pct(c.share(*m, false)).c_str(),
                  fixed(cpu, 1, true).c_str(), fixed(cpu / c.copy_ms, 2).c_str(),
                  pct(c.share(*m, true)).c_str());
    }
  std::string one_line, k_line;
  bool one_met = true, k_met = true;
  for (const Config& c : cs) {
    // The CPU figure within a run decides (see the interval above); the others are beside.
    const double x = c.within_cpu_ms() / c.copy_ms;
    one_met = one_met && x <= kCopyTarget;
    one_line +=
        str(one_line.empty() ? "" : "; ", c.shape.name, " ", fixed(x, 2), "x (",
            fixed(c.within_cpu_ms(), 1, true), " CPU ms on ", fixed(c.copy_ms, 1),
            " ms; wall clock within the run ", fixed(c.within_ms() / c.copy_ms, 2),
            "x, every 1 against the baseline runs ", fixed(c.across_ms() / c.copy_ms, 2), "x)");
    const Measured& mk = *c.at(k);
    const double by_cpu = c.share(k == 1 ? c.two : mk, true) / k;
    const double by_wall = c.share(k == 1 ? c.two : mk, false) / k;
    const double across = mk.step_ms() / c.base.step_ms() - 1;
    k_met = k_met && by_cpu <= kStepTarget;
    k_line += str(k_line.empty() ? "" : "; ", c.shape.name, " ", pct(by_cpu), " (wall clock ",
                  pct(by_wall), " within the run, ", pct(across), " against the baseline runs)");
  }
  std::printf("target: at every 1, what a snapshot adds <= %.1f x the copy's own cost: %s: %s\n",
              kCopyTarget, one_met ? "met" : "NOT met", one_line.c_str());
  std::printf("target: <= 1%% more step time at the default interval (%d): %s: %s\n", k,
              k_met ? "met" : "NOT met", k_line.c_str());
  if (o.every > 0) {
    std::printf("interval: %d, as --every named it\n", k);
  } else {
    std::string why;
    for (const Config& c : cs)
      why += str(why.empty() ? "" : ", ", c.shape.name, " ", pct(c.share(c.two, true)),
                 " a snapshot, ", pct(std::max(0.0, c.share(c.two, true)) / k), " at every ", k);
    std::printf(
        "recommended default: snapshot.every %d: the smallest interval at which what one "
        "snapshot adds within a run, in CPU time, spread over the interval, is under 1%% of "
        "the step on every config measured (%s); by wall clock within the run it would be %d; "
        "a failure then redoes at most %d step%s\n",
        k, why.c_str(), k_wall, k, k == 1 ? "" : "s");
  }
  std::string noise;
  for (const Config& c : cs)
    noise += str(noise.empty() ? "" : ", ", c.shape.name, " ", fixed(100 * spread(c.base.other), 1),
                 "%");
  std::printf(
      "  noise: the baselines' counted steps spread by (q3 - q1) / median = %s; a "
      "difference between runs well inside that is not resolved (other load on this "
      "machine moves whole runs); the CPU columns and the within-run figure are less "
      "sensitive to it\n\n",
      noise.c_str());
  std::fflush(stdout);
}

}  // namespace weft::launch::snapbench
