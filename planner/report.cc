// Text report and SVG timeline of a plan.
#include "planner/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>

#include "base/error.h"

namespace weft::planner {
namespace {

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}
std::string gib(int64_t b) { return fmt("%.2f", double(b) / double(int64_t(1) << 30)); }
std::string ms(double s) { return fmt("%.3f", s * 1e3); }
std::string bytes_h(int64_t b) {
  if (b >= (int64_t(1) << 30)) return fmt("%.2fG", double(b) / double(int64_t(1) << 30));
  if (b >= (int64_t(1) << 20)) return fmt("%.1fM", double(b) / double(int64_t(1) << 20));
  if (b >= 1024) return fmt("%.1fK", double(b) / 1024.0);
  return std::to_string(b);
}

std::string layer_range(const std::vector<int64_t>& ls) {
  if (ls.empty()) return "no layers";
  if (ls.size() == 1) return "layer " + std::to_string(ls[0]);
  return "layers " + std::to_string(ls.front()) + "-" + std::to_string(ls.back());
}

std::string rank_list(const std::vector<int>& r) {
  std::ostringstream os;
  if (r.size() <= 8) {
    for (size_t i = 0; i < r.size(); ++i) os << (i ? "," : "") << r[i];
  } else {
    os << r[0] << "," << r[1] << "," << r[2] << ",...," << r.back() << " (" << r.size() << " ranks)";
  }
  return os.str();
}

std::vector<int> role_ranks(const Plan& p, const Role& r) {
  std::vector<int> out;
  for (int d = 0; d < int(p.mesh.degrees().dp); ++d) out.push_back(p.mesh.rank_of(r.stage, r.lane, d));
  std::sort(out.begin(), out.end());
  return out;
}

// What a role holds: parameter elements (resident), how each parameter tensor is cut
// (whole, or the fraction this rank keeps), experts, optimizer state.
std::string holdings(const core::Graph& g, const Role& r) {
  int64_t params = 0, optim = 0;
  std::map<int64_t, int> cut;  // kept fraction 1/n -> tensors
  int64_t e_lo = -1, e_hi = -1, e_all = 0;
  std::vector<std::string> uneven;
  for (const TensorDesc& t : r.tensors) {
    if (!t.persistent || t.alias_of >= 0 || t.value < 0) continue;
    const core::Value& v = g.value(t.value);
    if (v.role == core::Role::kOptimizerState) optim += t.bytes;
    if (v.role != core::Role::kParameter) continue;
    params += t.piece.numel();
    const int64_t whole = core::shape_numel(v.shape), kept = std::max<int64_t>(1, t.piece.numel());
    if (whole % kept && !t.piece.box.empty()) {
      // An uneven cut (the vocabulary over tp: 86, 85, 85 rows of 256): name its rows.
      const DimSlice& rows = t.piece.box[0];
      uneven.push_back(v.name + " rows " + std::to_string(rows.start) + "-" +
                       std::to_string(rows.start + rows.size - 1) + " of " +
                       std::to_string(v.shape[0]));
      continue;
    }
    ++cut[whole / kept];
    if (v.name.find(".experts.") != std::string::npos && !t.piece.box.empty()) {
      e_all = v.shape[0];
      e_lo = t.piece.box[0].start;
      e_hi = t.piece.box[0].start + t.piece.box[0].size - 1;
    }
  }
  std::ostringstream os;
  os << fmt("%.1fM", double(params) / 1e6) << " parameter elements (tensors:";
  bool first = true;
  for (auto [n, count] : cut) {
    os << (first ? " " : ", ") << count << (n == 1 ? " whole" : " at 1/" + std::to_string(n));
    first = false;
  }
  for (const std::string& u : uneven) os << (first ? " " : ", ") << u, first = false;
  os << ")";
  if (e_all > 0) os << "; experts " << e_lo << "-" << e_hi << " of " << e_all;
  os << "; optimizer state " << bytes_h(optim) << "B";
  return os.str();
}

}  // namespace

std::string layout_lines(const Plan& p) {
  std::ostringstream os;
  const ParallelConfig& c = p.config;
  for (int s = 0; s < int(c.deg.pp); ++s) {
    os << "  stage " << s << ":";
    bool first = true;
    for (int k = s; k < c.chunk_count(); k += int(c.deg.pp)) {
      os << (first ? " " : " | ");
      first = false;
      if (c.virtual_stages > 1) os << "chunk " << k << ": ";
      if (k == 0) os << "embedding, ";
      os << layer_range(c.chunks[size_t(k)]);
      if (k == c.chunk_count() - 1) os << ", final norm + head";
    }
    os << "\n";
  }
  return os.str();
}

std::string plan_report(const Plan& p, const core::Graph& g, const ReportOptions& opt) {
  std::ostringstream os;
  const ParallelConfig& c = p.config;
  const Degrees& d = c.deg;
  os << "world " << p.world() << " = dp " << d.dp << " x tp " << d.tp << " x pp " << d.pp << " x ep " << d.ep
     << "   (rank order " << p.mesh.order_string() << ", first axis fastest)\n";
  os << "batch: global " << c.global_batch << " = micro_batch " << c.micro_batch << " x " << c.micro_batches
     << " micro-batches x dp " << d.dp << " x ep " << d.ep << "\n";
  os << "schedule " << c.schedule;
  if (c.virtual_stages > 1) os << " (" << c.virtual_stages << " virtual stages)";
  os << ", zero " << c.zero << ", recompute " << c.recompute;
  if (c.sequence_parallel) os << ", sequence parallel (norms and residuals split over tp)";
  os << "\n";
  os << "pipeline layout (" << (c.layout_given ? "from parallel.pipeline.layout" : "even split") << "):\n"
     << layout_lines(p);

  std::map<std::string, int> splits;
  for (const OpDecision& dec : p.decisions)
    for (const AxisSplit& s : dec.splits)
      if (s.axis != Axis::kDp)
        ++splits[g.op(dec.op).type + " by " + s.symbol + (s.groups > 1 ? " (" + std::to_string(s.groups) + " strided groups)" : "") +
                 " over " + axis_name(s.axis)];
  if (!splits.empty()) {
    os << "op splits:";
    for (auto& [k, n] : splits) os << " " << k << " x" << n << ";";
    os << "\n";
  }

  os << "roles (one program per stage x lane, shared by its data-parallel ranks):\n";
  for (const Role& r : p.roles) {
    os << "  stage " << r.stage << " tp " << p.mesh.lane_tp(r.lane) << " ep " << p.mesh.lane_ep(r.lane)
       << ": ranks " << rank_list(role_ranks(p, r)) << "\n      " << holdings(g, r) << "; "
       << r.program.size() << " instructions\n";
  }

  const CostAnnotations& k = p.costs;
  if (!k.ranks.empty()) {
    bool per_rank = opt.per_rank || p.world() <= 64;
    os << (per_rank ? "per rank" : "per role, the slowest of its ranks")
       << ": times in ms, memory and volumes in bytes (volumes: sent per step)\n";
    os << "  rank(s)            step  compute     comm     wait bubble   peak persist all_reduce all_gather"
          "  red_scat  a2a(v)    p2p\n";
    auto line = [&](const std::string& who, const std::vector<int>& ranks) {
      RankCost lo = k.ranks[size_t(ranks[0])], hi = lo;
      for (int q : ranks) {
        const RankCost& x = k.ranks[size_t(q)];
        lo.step_s = std::min(lo.step_s, x.step_s), hi.step_s = std::max(hi.step_s, x.step_s);
        hi.peak_bytes = std::max(hi.peak_bytes, x.peak_bytes);
      }
      const RankCost& x = k.ranks[size_t(ranks[0])];
      char buf[320];
      std::snprintf(buf, sizeof buf, "  %-16s %8s %8s %8s %8s %6.3f %6s %7s %10s %10s %9s %7s %6s\n", who.c_str(),
                    ms(hi.step_s).c_str(), ms(x.compute_s).c_str(), ms(x.comm_s).c_str(), ms(x.wait_s).c_str(), x.bubble,
                    bytes_h(hi.peak_bytes).c_str(), bytes_h(x.persistent_bytes).c_str(), bytes_h(x.comm_bytes[0]).c_str(),
                    bytes_h(x.comm_bytes[1]).c_str(), bytes_h(x.comm_bytes[2]).c_str(),
                    bytes_h(x.comm_bytes[3] + x.comm_bytes[4]).c_str(), bytes_h(x.p2p_bytes).c_str());
      os << buf;
    };
    if (per_rank) {
      for (int q = 0; q < p.world(); ++q) line(std::to_string(q), {q});
    } else {
      for (const Role& r : p.roles)
        line("s" + std::to_string(r.stage) + " l" + std::to_string(r.lane) + " x" + std::to_string(d.dp),
             role_ranks(p, r));
    }
    if (k.stage_s.size() > 1) {
      os << "stage time per micro-batch (forward + backward):";
      for (size_t st = 0; st < k.stage_s.size(); ++st) os << " s" << st << " " << ms(k.stage_s[st]) << " ms";
      os << "\n";
    }
    int64_t peak = 0;
    for (const RankCost& x : k.ranks) peak = std::max(peak, x.peak_bytes);
    os << "predicted step " << ms(k.step_s) << " ms (pipeline estimate: sum of stages + (m-1) x slowest = "
       << ms(k.pipeline_estimate_s) << " ms), bubble " << fmt("%.3f", k.bubble);
    if (d.pp > 1) {
      // Uniform stages: (pp-1)/(m+pp-1); interleaving v chunks shrinks the warm-up v-fold.
      double v = double(c.virtual_stages), m = double(c.micro_batches), pp = double(d.pp);
      os << " (uniform-stage ideal " << (c.virtual_stages > 1 ? "(pp-1)/(v*m+pp-1)" : "(pp-1)/(m+pp-1)") << " = "
         << fmt("%.3f", (pp - 1) / (v * m + pp - 1)) << ")";
    }
    os << "\npeak memory " << gib(peak) << " GiB of " << gib(k.model.device_memory) << " GiB per device"
       << (peak > k.model.device_memory ? "  -- DOES NOT FIT" : "") << "\n";
  }
  return os.str();
}

namespace {

const char* span_color(const Span& s) {
  if (s.kind == InstrKind::kCollective) return "#f0a030";
  if (s.kind == InstrKind::kRecv) return "#d0d0d0";
  if (s.stage == Stage::kStep) return "#9060c0";
  if (s.recompute) return "#a0e0a0";
  return s.stage == Stage::kForward ? "#4080e0" : "#30a050";
}

// One drawn rectangle: [start, end) seconds, a colour, the spans it stands for.
struct Bar {
  double start = 0, end = 0;
  const char* color = nullptr;
  int mb = -1;    // the micro-batch of every span in it (a compute bar), else -1
  int count = 1;  // spans merged into it
};

// A rank's spans inside [t0, t1), clipped, neighbours of one colour and micro-batch merged
// (fewer elements, same picture).
std::vector<Bar> exact_bars(const std::vector<Span>& spans, double t0, double t1) {
  std::vector<Bar> out;
  for (const Span& s : spans) {
    if (s.end <= t0 || s.start >= t1) continue;
    Bar b{std::max(s.start, t0), std::min(s.end, t1), span_color(s),
          s.kind == InstrKind::kCompute ? s.mb : -1, 1};
    if (!out.empty() && out.back().color == b.color && out.back().mb == b.mb && b.start - out.back().end < 1e-12) {
      out.back().end = b.end;
      ++out.back().count;
    } else {
      out.push_back(b);
    }
  }
  return out;
}

// At most `bins` bars: each bin of the window takes the colour with most time in it; runs of
// bins of one colour become one bar counting the spans that start in them.
std::vector<Bar> aggregate(const std::vector<Bar>& bars, double t0, double t1, int bins) {
  const double w = (t1 - t0) / bins;
  std::vector<std::map<const char*, double>> time(static_cast<size_t>(bins));
  std::vector<int> starts(size_t(bins), 0);
  for (const Bar& b : bars) {
    int i0 = std::clamp(int((b.start - t0) / w), 0, bins - 1), i1 = std::clamp(int((b.end - t0) / w), 0, bins - 1);
    starts[size_t(i0)] += b.count;
    for (int i = i0; i <= i1; ++i) {
      const double lo = std::max(b.start, t0 + i * w), hi = std::min(b.end, t0 + (i + 1) * w);
      if (hi > lo) time[size_t(i)][b.color] += hi - lo;
    }
  }
  std::vector<Bar> out;
  for (int i = 0; i < bins; ++i) {
    const char* best = nullptr;
    double most = 0;
    for (const auto& [c, t] : time[size_t(i)])
      if (t > most) most = t, best = c;
    if (!best) continue;
    if (!out.empty() && out.back().color == best && out.back().end >= t0 + i * w - 1e-15) {
      out.back().end = t0 + (i + 1) * w;
      out.back().count += starts[size_t(i)];
    } else {
      out.push_back({t0 + i * w, t0 + (i + 1) * w, best, -1, starts[size_t(i)]});
    }
  }
  return out;
}

// A round tick step (1, 2 or 5 x 10^k seconds) giving 5-12 ticks over `span` seconds.
double tick_step(double span) {
  double step = std::pow(10.0, std::floor(std::log10(span / 10)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (span / (step * m) <= 12) return step * m;
  return step * 10;
}

std::string time_label(double t, double unit, const char* name) {
  char b[32];
  std::snprintf(b, sizeof b, "%.6g %s", t / unit + 0.0, name);  // + 0.0: never "-0"
  return b;
}

std::vector<int> default_ranks(const Plan& p, size_t rows, std::string& note) {
  std::vector<int> out;
  if (rows <= 32) {
    for (size_t r = 0; r < rows; ++r) out.push_back(int(r));
    return out;
  }
  for (const Role& r : p.roles) out.push_back(p.mesh.rank_of(r.stage, r.lane, 0));
  std::sort(out.begin(), out.end());
  const size_t replica = out.size();
  if (out.size() > 64) out.resize(64);
  note = "; ranks of data-parallel replica 0 (" + std::to_string(out.size()) +
         (out.size() < replica ? " of its " + std::to_string(replica) : std::string()) + " of " +
         std::to_string(rows) + "; the other replicas run the same programs; --timeline-ranks to choose)";
  return out;
}

}  // namespace

std::string timeline_svg(const Plan& p, const std::vector<std::vector<Span>>& tl, const TimelineOptions& opt) {
  double end = 0;
  for (const auto& r : tl)
    for (const Span& s : r) end = std::max(end, s.end);
  const bool zoom = opt.zoom_end_s > opt.zoom_start_s;
  const double t0 = zoom ? opt.zoom_start_s : 0, t1 = zoom ? opt.zoom_end_s : std::max(end, 1e-9);
  std::string note;
  std::vector<int> ranks = opt.ranks.empty() ? default_ranks(p, tl.size(), note) : opt.ranks;
  for (int r : ranks)
    if (r < 0 || size_t(r) >= tl.size())
      throw ConfigError("--timeline-ranks", "rank " + std::to_string(r) + " is not in the world of " +
                                                std::to_string(tl.size()));
  if (!opt.ranks.empty()) note = "; " + std::to_string(ranks.size()) + " of " + std::to_string(tl.size()) + " ranks";

  const double W = 1400, left = 70, top = 36, row = ranks.size() > 128 ? 6 : 16;
  const double H = top + row * double(ranks.size());
  const double scale = (W - left) / (t1 - t0);
  // Ticks: seconds from 10 s up, ms from 1 ms, us below.
  const double step = tick_step(t1 - t0);
  const double unit = t1 - t0 >= 10 ? 1 : t1 - t0 >= 1e-3 ? 1e-3 : 1e-6;
  const char* unit_name = unit == 1 ? "s" : unit == 1e-3 ? "ms" : "us";
  std::ostringstream os;
  os << "<svg xmlns='http://www.w3.org/2000/svg' width='" << W + 20 << "' height='" << H + 40
     << "' font-family='monospace' font-size='10'>\n";
  os << "<text x='5' y='14'>weft plan: world " << p.world() << ", step " << ms(end) << " ms";
  if (zoom) os << ", window " << ms(t0) << "-" << ms(t1) << " ms";
  os << note << "</text>\n";
  os << "<text x='5' y='27'>blue forward, green backward, light recompute, purple optimizer, orange collective, "
        "grey waiting; a bar labelled xN merges N spans (--timeline-zoom START:END ms for detail)</text>\n";
  for (double t = std::ceil(t0 / step - 1e-9) * step; t <= t1 + 1e-12 * (t1 - t0); t += step) {
    const double x = left + (t - t0) * scale;
    os << "<line x1='" << fmt("%.2f", x) << "' y1='" << top - 2 << "' x2='" << fmt("%.2f", x) << "' y2='" << H + 4
       << "' stroke='#e8e8e8'/>\n";
    os << "<text class='tick' x='" << fmt("%.2f", x) << "' y='" << H + 16 << "' text-anchor='middle'>"
       << time_label(t, unit, unit_name) << "</text>\n";
  }
  os << "<line x1='" << left << "' y1='" << H + 4 << "' x2='" << W << "' y2='" << H + 4 << "' stroke='black'/>\n";
  os << "<text x='" << W / 2 << "' y='" << H + 30 << "' text-anchor='middle'>time (" << unit_name
     << ") from the step's start</text>\n";
  for (size_t k = 0; k < ranks.size(); ++k) {
    const double y = top + row * double(k);
    if (row >= 10) os << "<text x='2' y='" << y + row - 4 << "'>rank " << ranks[k] << "</text>\n";
    std::vector<Bar> bars = exact_bars(tl[size_t(ranks[k])], t0, t1);
    const bool merged = int(bars.size()) > opt.max_bars;
    if (merged) bars = aggregate(bars, t0, t1, std::max(1, opt.max_bars));
    for (const Bar& b : bars) {
      const double x0 = left + (b.start - t0) * scale, x1 = left + (b.end - t0) * scale;
      os << "<rect x='" << fmt("%.2f", x0) << "' y='" << y << "' width='" << fmt("%.2f", std::max(0.3, x1 - x0))
         << "' height='" << row - 2 << "' fill='" << b.color << "'/>\n";
      if (row < 10) continue;
      // Exact bars name their micro-batch; aggregated ones how many spans they merge.
      const std::string label = merged ? (b.count > 1 ? "x" + std::to_string(b.count) : "")
                                       : b.mb >= 0 ? std::to_string(b.mb) : "";
      if (!label.empty() && x1 - x0 > 6.5 * double(label.size()) + 4)
        os << "<text x='" << fmt("%.1f", x0 + 2) << "' y='" << y + row - 5 << "' fill='white'>" << label << "</text>\n";
    }
  }
  os << "</svg>\n";
  return os.str();
}

}  // namespace weft::planner
