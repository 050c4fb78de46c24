// Around the search: when it runs, what it writes back into the job, the Megatron-style
// baseline it is compared with, and the table of candidates.
#include <algorithm>
#include <cstdio>

#include "base/error.h"
#include "planner/policy.h"
#include "planner/search.h"

namespace weft::planner {

bool needs_search(const core::JobSpec& s) {
  const core::ParallelSpec& p = s.parallel;
  return p.plan == "search" || p.tp == 0 || p.pp == 0 || p.ep == 0 ||
         p.zero == core::ParallelSpec::kAutoZero || p.recompute == "auto" ||
         p.pipeline.schedule == "auto" || p.pipeline.virtual_stages == 0 ||
         p.pipeline.layout_auto || p.sequence_parallel_auto || s.train.micro_batch == 0;
}

double search_cap_bytes(const core::JobSpec& spec, const CostModel& cost) {
  return spec.memory.limit_gib > 0 ? spec.memory.limit_gib * double(int64_t(1) << 30)
                                   : double(cost.device_memory);
}

core::JobSpec apply_layout(const core::JobSpec& spec, const Layout& l) {
  core::JobSpec s = spec;
  core::ParallelSpec& p = s.parallel;
  p.plan = "manual";
  p.dp = l.deg.dp, p.tp = l.deg.tp, p.pp = l.deg.pp, p.ep = l.deg.ep;
  p.zero = l.zero;
  p.recompute = l.recompute;
  p.sequence_parallel = l.sequence_parallel, p.sequence_parallel_auto = false;
  p.pipeline.schedule = l.schedule;
  p.pipeline.virtual_stages = l.virtual_stages;
  s.train.micro_batch = l.micro_batch;
  if (p.pipeline.layout_auto) {
    p.pipeline.layout_auto = false;
    p.pipeline.layout.clear();
    int64_t layer = 0;
    if (l.deg.pp > 1)
      for (int64_t n : l.chunk_layers) {
        std::vector<int64_t> chunk;
        for (int64_t i = 0; i < n; ++i) chunk.push_back(layer++);
        p.pipeline.layout.push_back(chunk);
      }
  }
  return s;
}

core::JobSpec searched_spec(const core::JobSpec& spec, int world, const SearchOptions& opt) {
  SearchOptions one = opt;
  one.top = 1;
  return apply_layout(spec, search_plan(spec, world, one).top.at(0).layout);
}

Candidate megatron_baseline(const core::JobSpec& spec, int world, const SearchOptions& opt) {
  const core::ModelSpec& m = spec.model;
  const int rpn = std::max(1, opt.cost.ranks_per_node);
  int64_t tp = 1;
  for (int64_t t = 1; t <= rpn; ++t)
    if (world % t == 0 && m.heads % t == 0 && m.kv() % t == 0 && m.dim % t == 0 &&
        m.mlp_width() % t == 0)
      tp = t;
  std::string last_error;
  for (const char* recompute : {"selective", "full"})
    for (int64_t pp = 1; pp <= m.layers && tp * pp <= world; ++pp) {
      if ((world / tp) % pp != 0) continue;
      core::JobSpec s = spec;
      core::ParallelSpec& p = s.parallel;
      p.plan = "manual";
      p.dp = 0, p.tp = tp, p.pp = pp, p.ep = 1;
      p.zero = 1;
      p.recompute = recompute;
      // Sequence parallelism with tp > 1, as Megatron-LM is run at scale
      // (--sequence-parallel): the baseline gets its activation memory back too.
      p.sequence_parallel = tp > 1, p.sequence_parallel_auto = false;
      p.pipeline = core::PipelineSpec{};
      s.train.micro_batch = 1;
      SearchOptions one = opt;
      one.top = 1;
      try {
        return search_plan(s, world, one).top.at(0);
      } catch (const ConfigError& e) {
        last_error = e.what();
      }
    }
  throw ConfigError("parallel", "no Megatron-style layout (tp " + std::to_string(tp) +
                                    ", 1F1B, micro_batch 1) fits: " + last_error);
}

std::string candidate_header() {
  return "  dp x tp x pp x ep   schedule        mb  zero recompute  layers/chunk       step       "
         "tokens/s   GiB/rank  bubble";
}

std::string candidate_row(const Candidate& c) {
  const Layout& l = c.layout;
  std::string sched = l.schedule;
  if (l.virtual_stages > 1) {
    sched += " v";
    sched += std::to_string(l.virtual_stages);
  }
  // Layers per stage, compressed: "12" when even, "11,12x6,11" otherwise.
  std::string layers;
  for (size_t i = 0; i < l.chunk_layers.size();) {
    size_t j = i;
    while (j < l.chunk_layers.size() && l.chunk_layers[j] == l.chunk_layers[i]) ++j;
    if (!layers.empty()) layers += ",";
    layers += std::to_string(l.chunk_layers[i]);
    if (j - i > 1 && !(i == 0 && j == l.chunk_layers.size())) {
      layers += 'x';
      layers += std::to_string(j - i);
    }
    i = j;
  }
  char degrees[64], row[256];
  std::snprintf(degrees, sizeof degrees, "%lld x %lld x %lld x %lld%s", (long long)l.deg.dp,
                (long long)l.deg.tp, (long long)l.deg.pp, (long long)l.deg.ep,
                l.sequence_parallel ? " sp" : "");
  const double ms = c.pred.step_s * 1e3;
  std::snprintf(row, sizeof row,
                "  %-18s %-15s %3lld  %4d %-10s %-14s %8.*f ms %10.4g %10.3g  %5.1f%%", degrees,
                sched.c_str(), (long long)l.micro_batch, l.zero, l.recompute.c_str(),
                layers.c_str(), ms < 10 ? 3 : 1, ms, c.tokens_per_s,
                c.pred.memory_bytes / double(int64_t(1) << 30), 100 * c.pred.bubble);
  return row;
}

std::string search_table(const SearchResult& r, int world) {
  char head[256];
  std::snprintf(head, sizeof head,
                "plan search: world %d, %lld candidates costed, %lld under the cap of %.1f GiB per "
                "rank (%s), %.2f s\n",
                world, (long long)r.evaluated, (long long)r.fitting,
                r.cap_bytes / double(int64_t(1) << 30), r.cap_source.c_str(), r.seconds);
  std::string out = head + candidate_header() + "\n";
  for (size_t i = 0; i < r.top.size(); ++i)
    out += candidate_row(r.top[i]) + (i == 0 ? "   <- chosen\n" : "\n");
  return out;
}

std::string compare_table(const Candidate& searched, const Candidate& baseline) {
  char ratio[160];
  std::snprintf(
      ratio, sizeof ratio,
      "predicted tokens/s, searched / Megatron-style: %.3fx (same cost model; a prediction, "
      "not a measurement)\n",
      searched.tokens_per_s / baseline.tokens_per_s);
  return "            " + candidate_header().substr(2) + "\nsearched    " +
         candidate_row(searched).substr(2) + "\nMegatron    " + candidate_row(baseline).substr(2) +
         "\n" + ratio;
}

}  // namespace weft::planner
