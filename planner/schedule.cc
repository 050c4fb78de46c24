// Pipeline orderings and their unit-level timing.
#include "planner/schedule.h"

#include <algorithm>
#include <map>

#include "base/check.h"

namespace weft::planner {
namespace {

// Megatron's interleaved order: micro-batches in groups of pp, each group through every
// chunk of the stage before the next group (backwards visit the chunks in reverse).
Unit interleaved_unit(int k, int pp, int v, int stage, Dir dir) {
  int in_group = k % (pp * v);
  int vchunk = in_group / pp;
  if (dir == Dir::kBackward) vchunk = v - 1 - vchunk;
  int mb = (k / (pp * v)) * pp + k % pp;
  return Unit{mb, vchunk * pp + stage, dir};
}

}  // namespace

int warmup_forwards(const std::string& schedule, int pp, int v, int m, int stage) {
  int total = m * v;
  int w = schedule == "gpipe" ? total
          : (schedule == "interleaved" && v > 1) ? 2 * (pp - 1 - stage) + (v - 1) * pp
                                                  : pp - 1 - stage;
  return std::min(w, total);
}

std::vector<Unit> stage_schedule(const std::string& schedule, int pp, int v, int m, int stage) {
  WEFT_CHECK(stage >= 0 && stage < pp && v >= 1 && m >= 1, "bad schedule arguments");
  std::vector<Unit> fwd, bwd;
  if (v > 1) {
    WEFT_CHECK(m % pp == 0, "interleaved schedule needs micro-batches divisible by pp");
    for (int k = 0; k < m * v; ++k) {
      fwd.push_back(interleaved_unit(k, pp, v, stage, Dir::kForward));
      bwd.push_back(interleaved_unit(k, pp, v, stage, Dir::kBackward));
    }
  } else {
    for (int j = 0; j < m; ++j) {
      fwd.push_back(Unit{j, stage, Dir::kForward});
      bwd.push_back(Unit{j, stage, Dir::kBackward});
    }
  }
  int warm = warmup_forwards(schedule, pp, v, m, stage);
  std::vector<Unit> units;
  size_t f = 0, b = 0;
  for (; f < size_t(warm); ++f) units.push_back(fwd[f]);
  while (f < fwd.size()) {
    units.push_back(fwd[f++]);
    units.push_back(bwd[b++]);
  }
  while (b < bwd.size()) units.push_back(bwd[b++]);
  return units;
}

int max_in_flight(const std::vector<Unit>& units) {
  std::map<int, int> open;  // micro-batch -> forwards minus backwards (chunks)
  int best = 0;
  for (const Unit& u : units) {
    open[u.mb] += u.dir == Dir::kForward ? 1 : -1;
    if (open[u.mb] == 0) open.erase(u.mb);
    best = std::max(best, int(open.size()));
  }
  return best;
}

ScheduleTiming time_schedule(const std::string& schedule, int pp, int v, int m,
                             const std::vector<double>& fwd, const std::vector<double>& bwd,
                             const std::vector<double>* bwd_final, const Boundaries* boundaries) {
  int chunks = pp * v;
  WEFT_CHECK(int(fwd.size()) == chunks && int(bwd.size()) == chunks, "one time per chunk");
  WEFT_CHECK(!bwd_final || int(bwd_final->size()) == chunks, "one final time per chunk");
  const Boundaries* b = boundaries && boundaries->cost ? boundaries : nullptr;
  WEFT_CHECK(!b || (int(b->fwd_syncs.size()) == chunks && int(b->bwd_syncs.size()) == chunks &&
                    int(b->fwd_var.size()) == chunks && int(b->bwd_var.size()) == chunks),
             "one boundary entry per chunk");
  std::vector<std::vector<Unit>> order(static_cast<size_t>(pp));
  for (int s = 0; s < pp; ++s) order[size_t(s)] = stage_schedule(schedule, pp, v, m, s);
  std::vector<int> final_mb(static_cast<size_t>(chunks), -1);  // chunk -> mb of its last backward
  for (int s = 0; s < pp; ++s)
    for (const Unit& u : order[size_t(s)])
      if (u.dir == Dir::kBackward) final_mb[size_t(u.chunk)] = u.mb;
  // What a unit hands on: when it ends (time < 0 until run), and its stage's burst and drift
  // variance then. done[dir][chunk][mb].
  struct Done {
    double time = -1, burst = 0, var = 0;
  };
  std::vector<std::vector<std::vector<Done>>> done(
      2, std::vector<std::vector<Done>>(size_t(chunks), std::vector<Done>(size_t(m))));
  std::vector<size_t> pc(static_cast<size_t>(pp), 0);
  std::vector<double> clock(static_cast<size_t>(pp), 0), burst(size_t(pp), 0), var(size_t(pp), 0);
  ScheduleTiming t;
  t.busy.assign(size_t(pp), 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < pp; ++s) {
      while (pc[size_t(s)] < order[size_t(s)].size()) {
        const Unit& u = order[size_t(s)][pc[size_t(s)]];
        const bool fwd_dir = u.dir == Dir::kForward;
        const Done* dep = nullptr;  // the unit it waits for, if any
        if (fwd_dir && u.chunk > 0) dep = &done[0][size_t(u.chunk - 1)][size_t(u.mb)];
        if (!fwd_dir)
          dep = u.chunk == chunks - 1 ? &done[0][size_t(u.chunk)][size_t(u.mb)]
                                      : &done[1][size_t(u.chunk + 1)][size_t(u.mb)];
        if (dep && dep->time < 0) break;
        // A message when the unit it waits for ran on another stage.
        const bool receives = dep && pp > 1 && !(!fwd_dir && u.chunk == chunks - 1);
        double ready = dep ? dep->time : 0;
        if (receives && b) {
          const double w = b->cost->message_wait(std::max(dep->burst, burst[size_t(s)]), b->world);
          ready += b->transfer + w;
          var[size_t(s)] = std::max(var[size_t(s)], dep->var) + b->cost->wait_variance(w, 2);
        }
        if (receives) burst[size_t(s)] = 0;
        const size_t c = size_t(u.chunk);
        double cost = fwd_dir ? fwd[c] : bwd[c];
        bool syncs = b && (fwd_dir ? b->fwd_syncs[c] : b->bwd_syncs[c]);
        if (bwd_final && !fwd_dir && u.mb == final_mb[c] && (*bwd_final)[c] > 0)
          cost += (*bwd_final)[c], syncs = true;
        const double start = std::max(clock[size_t(s)], ready);
        clock[size_t(s)] = start + cost;
        t.busy[size_t(s)] += cost;
        if (b) {
          burst[size_t(s)] = syncs ? 0 : burst[size_t(s)] + cost;
          var[size_t(s)] += fwd_dir ? b->fwd_var[c] : b->bwd_var[c];
        }
        done[fwd_dir ? 0 : 1][c][size_t(u.mb)] = {clock[size_t(s)], burst[size_t(s)],
                                                  var[size_t(s)]};
        // The sender's own part of the message it sends on, after the message left.
        const bool sends = pp > 1 && (fwd_dir ? u.chunk < chunks - 1 : u.chunk > 0);
        if (b && sends) clock[size_t(s)] += b->send, t.busy[size_t(s)] += b->send;
        ++pc[size_t(s)];
        progress = true;
      }
    }
  }
  for (int s = 0; s < pp; ++s)
    WEFT_CHECK(pc[size_t(s)] == order[size_t(s)].size(), "schedule deadlocks at stage ", s);
  t.end = clock;
  if (b) t.drift_var = var, t.end_burst = burst;
  t.makespan = *std::max_element(clock.begin(), clock.end());
  for (double x : t.busy) t.bubble.push_back(t.makespan > 0 ? 1.0 - x / t.makespan : 0.0);
  return t;
}

}  // namespace weft::planner
