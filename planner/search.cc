// The two-level search: the inner enumeration of splits per stage and the outer dynamic
// programme over stage boundaries, each candidate scored by stage_cost.h.
#include "planner/search.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <optional>
#include <tuple>

#include "base/error.h"
#include "planner/planner.h"
#include "planner/policy.h"

namespace weft::planner {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

std::vector<int64_t> divisors(int64_t n, int64_t limit) {
  std::vector<int64_t> d;
  for (int64_t i = 1; i <= std::min(n, limit); ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

// Outer level: the layers of each of pp stages (one chunk each) that minimise the slowest
// stage's time per micro-batch under the memory cap. With every stage on the same submesh the
// sum of stage times does not depend on the boundaries, so a pipeline's time (sum + (m - 1) x
// the slowest, Alpa's estimate) is least where the slowest stage is least. Per-layer times
// add; a stage's extras (embedding, head, the boundary transfers) depend on its position.
// Memory grows linearly in a stage's layers. Empty when no boundaries fit.
std::vector<int64_t> stage_boundaries(const core::ModelSpec& m, const SplitCosts& sc,
                                      const Layout& l, const CostModel& cost, const Crossing& cross,
                                      const std::vector<int64_t>& in_flight, double cap) {
  const int pp = int(l.deg.pp);
  const int64_t L = int64_t(sc.fwd.size());
  std::vector<double> prefix(size_t(L) + 1, 0);
  for (int64_t i = 0; i < L; ++i) {
    const ChunkTime one = chunk_time(sc, l, cost, cross, 0, i, i + 1);
    const ChunkTime none = chunk_time(sc, l, cost, cross, 0, i, i);
    prefix[size_t(i) + 1] = prefix[size_t(i)] + (one.fwd + one.bwd) - (none.fwd + none.bwd);
  }
  std::vector<double> extra(static_cast<size_t>(pp));
  std::vector<int64_t> most(static_cast<size_t>(pp));  // layers a stage may hold within the cap
  for (int s = 0; s < pp; ++s) {
    const ChunkTime e = chunk_time(sc, l, cost, cross, s, 0, 0);
    extra[size_t(s)] = e.fwd + e.bwd + chunk_messages_s(sc, cost, cross, s, pp);
    const double base = stage_memory(m, l, s, 0, in_flight[size_t(s)]);
    const double per = stage_memory(m, l, s, 1, in_flight[size_t(s)]) - base;
    most[size_t(s)] = base > cap ? 0 : per <= 0 ? L : int64_t(std::floor((cap - base) / per));
  }
  // best[s][e]: the least slowest-stage time of stages 0..s-1 holding layers [0, e).
  std::vector<std::vector<double>> best(size_t(pp) + 1, std::vector<double>(size_t(L) + 1, kInf));
  std::vector<std::vector<int64_t>> from(size_t(pp) + 1, std::vector<int64_t>(size_t(L) + 1, -1));
  best[0][0] = 0;
  for (int s = 0; s < pp; ++s)
    for (int64_t e = s + 1; e <= L - (pp - 1 - s); ++e)
      for (int64_t j = std::max<int64_t>(s, e - most[size_t(s)]); j < e; ++j) {
        if (best[size_t(s)][size_t(j)] == kInf) continue;
        const double t = std::max(best[size_t(s)][size_t(j)],
                                  extra[size_t(s)] + prefix[size_t(e)] - prefix[size_t(j)]);
        if (t < best[size_t(s) + 1][size_t(e)])
          best[size_t(s) + 1][size_t(e)] = t, from[size_t(s) + 1][size_t(e)] = j;
      }
  if (best[size_t(pp)][size_t(L)] == kInf) return {};
  std::vector<int64_t> layers(static_cast<size_t>(pp));
  for (int64_t s = pp, e = L; s > 0; --s) {
    const int64_t j = from[size_t(s)][size_t(e)];
    layers[size_t(s) - 1] = e - j;
    e = j;
  }
  return layers;
}

struct Choice {
  std::string schedule;
  int64_t v = 1;
};

// The (schedule, virtual_stages) pairs to try at pp stages (resolve_parallel refuses the
// ones that do not fit, e.g. virtual stages without a pipeline).
std::vector<Choice> schedule_choices(const core::ParallelSpec& p, int64_t pp, int64_t layers) {
  const std::string& s = p.pipeline.schedule;
  const int64_t v = p.pipeline.virtual_stages;  // 0: auto
  if (v > 1) return {{s == "auto" ? "interleaved" : s, v}};
  std::vector<Choice> interleaved;
  if (v == 0)
    for (int64_t x = 2; x <= 8; ++x)
      if (pp > 1 && layers % (pp * x) == 0) interleaved.push_back({"interleaved", x});
  if (s == "interleaved") return interleaved.empty() ? std::vector<Choice>{{s, 1}} : interleaved;
  if (s != "auto") return {{s, 1}};
  // One stage: the schedules differ only in order; 1F1B keeps the fewest activations.
  if (pp == 1) return {{"1f1b", 1}};
  std::vector<Choice> out = {{"1f1b", 1}, {"gpipe", 1}};
  out.insert(out.end(), interleaved.begin(), interleaved.end());
  return out;
}

}  // namespace

SearchResult search_plan(const core::JobSpec& spec, int world, const SearchOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  const core::ParallelSpec& p = spec.parallel;
  const core::ModelSpec& m = spec.model;
  const CostModel& cost = opt.cost;
  if (world < 1)
    throw ConfigError("--world", "expected a world size >= 1, got " + std::to_string(world));
  SearchResult r;
  r.cap_bytes = search_cap_bytes(spec, cost);
  r.cap_source = spec.memory.limit_gib > 0 ? "memory.limit_gib" : "the device memory";
  const int64_t G = spec.train.global_batch, L = m.layers;
  const int rpn = std::max(1, cost.ranks_per_node);
  const std::vector<Axis> order = parse_order(p.order);
  const core::ModelGraph mg = build_planning_graph(spec);

  // tp beyond a node would put its per-layer all-reduces on the slow links (Alpa and
  // Megatron keep model parallelism inside a host); a fixed tp stays whatever it is.
  const std::vector<int64_t> tps = p.tp ? std::vector<int64_t>{p.tp} : divisors(world, rpn);
  const std::vector<std::string> recomputes =
      p.recompute == "auto" ? std::vector<std::string>{"none", "selective", "full"}
                            : std::vector<std::string>{p.recompute};
  // Sequence parallelism: both where auto and tp > 1 divides the sequence (off costs less
  // time, on less memory); as given otherwise (resolve_parallel refuses it at tp 1).
  // Paired with each schedule choice, so that the loops below keep their depth.
  auto with_sequence = [&](const std::vector<Choice>& schedules, int64_t tp) {
    std::vector<bool> sps = {p.sequence_parallel};
    if (p.sequence_parallel_auto)
      sps =
          tp > 1 && m.seq_len % tp == 0 ? std::vector<bool>{false, true} : std::vector<bool>{false};
    std::vector<std::pair<Choice, bool>> out;
    for (const Choice& c : schedules)
      for (bool sp : sps) out.push_back({c, sp});
    return out;
  };
  std::map<std::tuple<int64_t, int64_t, int64_t, bool, bool, bool, double>, SplitCosts> splits;
  // Per (schedule, pp, v, m): the cost model with the schedule's runnable ranks
  // (schedule_runnable), which only the oversubscribed waits read.
  std::map<std::tuple<std::string, int64_t, int64_t, int64_t>, CostModel> runnable_costs;
  std::map<std::tuple<std::string, int64_t, int64_t, int64_t>, std::vector<int64_t>> flights;
  std::optional<ConfigError> first_error;
  double least_memory = kInf;
  std::string least_what;
  struct Ranked {
    Candidate c;
    int64_t index;
  };
  std::vector<Ranked> fit;

  for (int64_t tp : tps)
    for (int64_t pp :
         p.pp ? std::vector<int64_t>{p.pp} : divisors(world / std::max<int64_t>(1, tp), L))
      for (int64_t ep : p.ep ? std::vector<int64_t>{p.ep}
                        : m.arch == "moe-gpt" && m.moe.experts > 0
                            ? divisors(std::max<int64_t>(1, world / (tp * pp)), m.moe.experts)
                            : std::vector<int64_t>{1}) {
        if (world % (tp * pp * ep) != 0) continue;
        const int64_t dp = world / (tp * pp * ep);
        if (p.dp && p.dp != dp) continue;
        if (ep > 1 && m.moe.experts % ep != 0) continue;
        if (G % (dp * ep) != 0) {
          if (!first_error)
            first_error =
                ConfigError("train.global_batch",
                            "global_batch (" + std::to_string(G) +
                                ") must be a multiple of dp x ep = " + std::to_string(dp * ep) +
                                " (tp " + std::to_string(tp) + ", pp " + std::to_string(pp) +
                                " on " + std::to_string(world) +
                                " ranks); raise it, or leave more of tp and pp to the search");
          continue;
        }
        const Degrees deg{dp, tp, pp, ep};
        const Crossing cross = crossing(deg, order, rpn);
        for (int64_t mb : spec.train.micro_batch ? std::vector<int64_t>{spec.train.micro_batch}
                                                 : divisors(G / (dp * ep), G))
          for (const auto& [sch, sp] : with_sequence(schedule_choices(p, pp, L), tp)) {
            // resolve_parallel is the judge of what the executor can run (divisibility, layout).
            core::JobSpec probe = spec;
            probe.parallel.plan = "manual";
            probe.parallel.sequence_parallel = sp, probe.parallel.sequence_parallel_auto = false;
            probe.parallel.dp = dp, probe.parallel.tp = tp, probe.parallel.pp = pp,
            probe.parallel.ep = ep;
            probe.parallel.zero = 0, probe.parallel.recompute = "none";
            probe.parallel.pipeline.schedule = sch.schedule;
            probe.parallel.pipeline.virtual_stages = sch.v;
            probe.parallel.pipeline.layout_auto = false;
            if (p.pipeline.layout_auto) probe.parallel.pipeline.layout.clear();
            probe.train.micro_batch = mb;
            ParallelConfig pc;
            try {
              pc = resolve_parallel(probe, world);
            } catch (const ConfigError& e) {
              if (!first_error) first_error = e;
              continue;
            }
            const auto flight_key =
                std::make_tuple(pc.schedule, pp, pc.virtual_stages, pc.micro_batches);
            auto rc_it = runnable_costs.find(flight_key);
            if (rc_it == runnable_costs.end()) {
              CostModel c = cost;
              const double runnable = schedule_runnable(cost, world, pc.schedule, int(pp),
                                                        int(pc.virtual_stages), int(pc.micro_batches));
              if (runnable > 0) c.active_ranks = runnable;
              rc_it = runnable_costs.emplace(flight_key, std::move(c)).first;
            }
            const CostModel& rcost = rc_it->second;  // the model below, with its runnable ranks
            const auto split_key =
                std::make_tuple(tp, ep, mb, cross.tp, cross.ep, sp, rcost.active_ranks);
            auto it = splits.find(split_key);
            if (it == splits.end())
              it = splits.emplace(split_key, split_costs(mg.graph, rcost, G, tp, ep, mb, cross, sp))
                       .first;
            const SplitCosts& sc = it->second;
            auto fl = flights.find(flight_key);
            if (fl == flights.end())
              fl = flights
                       .emplace(flight_key,
                                stage_in_flight(pc.schedule, int(pp), int(pc.virtual_stages),
                                                int(pc.micro_batches)))
                       .first;
            const std::vector<int64_t>& in_flight = fl->second;
            std::vector<int64_t> zeros;
            if (p.zero != core::ParallelSpec::kAutoZero)
              zeros = {p.zero};
            else if (dp * ep > 1)
              zeros = {0, 1, 2, 3};
            else
              zeros = {0};
            for (int64_t zero : zeros)
              for (const std::string& rc : recomputes) {
                Layout l;
                l.deg = deg, l.zero = int(zero), l.schedule = pc.schedule, l.recompute = rc;
                l.sequence_parallel = sp;
                l.virtual_stages = pc.virtual_stages, l.micro_batch = mb,
                l.micro_batches = pc.micro_batches;
                l.bucket_bytes = pc.bucket_bytes;
                for (const auto& c : pc.chunks) l.chunk_layers.push_back(int64_t(c.size()));
                const bool boundaries = p.pipeline.layout_auto && pp > 1 && pc.virtual_stages == 1;
                if (boundaries) {
                  std::vector<int64_t> b =
                      stage_boundaries(m, sc, l, rcost, cross, in_flight, r.cap_bytes);
                  if (!b.empty()) l.chunk_layers = b;  // else the even split, to report its memory
                }
                Candidate c;
                c.layout = l;
                c.pred = predict(m, sc, l, rcost, cross, in_flight);
                c.tokens_per_s = double(G * m.seq_len) / c.pred.step_s;
                ++r.evaluated;
                if (c.pred.memory_bytes < least_memory) {
                  least_memory = c.pred.memory_bytes;
                  char what[160];
                  std::snprintf(
                      what, sizeof what,
                      "dp %lld x tp %lld x pp %lld x ep %lld%s, micro_batch %lld, zero %d, "
                      "recompute %s",
                      (long long)dp, (long long)tp, (long long)pp, (long long)ep,
                      sp ? " (sequence parallel)" : "", (long long)mb, l.zero, rc.c_str());
                  least_what = what;
                }
                if (c.pred.memory_bytes > r.cap_bytes) continue;
                fit.push_back({std::move(c), r.evaluated});
              }
          }
      }
  r.fitting = int64_t(fit.size());
  if (r.evaluated == 0) {
    if (first_error) throw *first_error;
    throw ConfigError("parallel", "no layout of " + std::to_string(world) +
                                      " ranks fits the fixed parallel keys; set fewer of them");
  }
  if (fit.empty()) {
    char msg[512];
    std::snprintf(msg, sizeof msg,
                  "no layout fits %.1f GiB per rank (%s); the smallest of %lld candidates needs "
                  "%.1f GiB (%s); raise memory.limit_gib, add ranks, or shrink the model or "
                  "train.global_batch",
                  r.cap_bytes / double(int64_t(1) << 30), r.cap_source.c_str(),
                  (long long)r.evaluated, least_memory / double(int64_t(1) << 30),
                  least_what.c_str());
    throw ConfigError("memory.limit_gib", msg);
  }
  // Fastest first; equal times: less memory, then the enumeration order.
  auto better = [](const Ranked& a, const Ranked& b) {
    if (a.c.pred.step_s != b.c.pred.step_s) return a.c.pred.step_s < b.c.pred.step_s;
    if (a.c.pred.memory_bytes != b.c.pred.memory_bytes)
      return a.c.pred.memory_bytes < b.c.pred.memory_bytes;
    return a.index < b.index;
  };
  const size_t keep = std::min(fit.size(), size_t(std::max(1, opt.top)));
  std::partial_sort(fit.begin(), fit.begin() + long(keep), fit.end(), better);
  for (size_t i = 0; i < keep; ++i) r.top.push_back(std::move(fit[i].c));
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace weft::planner
