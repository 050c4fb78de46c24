// Text report and SVG timeline of a plan.
#include "planner/report.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>

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
  os << ", zero " << c.zero << ", recompute " << c.recompute << "\n";
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

std::string timeline_svg(const Plan& p, const std::vector<std::vector<Span>>& tl) {
  double end = 0;
  for (const auto& r : tl)
    for (const Span& s : r) end = std::max(end, s.end);
  const double W = 1400, left = 70, row = tl.size() > 128 ? 6 : 16;
  const double H = 40 + row * double(tl.size());
  std::ostringstream os;
  os << "<svg xmlns='http://www.w3.org/2000/svg' width='" << W + 20 << "' height='" << H + 30
     << "' font-family='monospace' font-size='10'>\n";
  os << "<text x='5' y='14'>weft plan: world " << p.world() << ", step " << ms(end)
     << " ms; blue forward, green backward, light recompute, purple optimizer, orange collective, grey waiting</text>\n";
  auto color = [](const Span& s) -> const char* {
    if (s.kind == InstrKind::kCollective) return "#f0a030";
    if (s.kind == InstrKind::kRecv) return "#d0d0d0";
    if (s.stage == Stage::kStep) return "#9060c0";
    if (s.recompute) return "#a0e0a0";
    return s.stage == Stage::kForward ? "#4080e0" : "#30a050";
  };
  double scale = end > 0 ? (W - left) / end : 0;
  for (size_t r = 0; r < tl.size(); ++r) {
    double y = 24 + row * double(r);
    if (row >= 10) os << "<text x='2' y='" << y + row - 4 << "'>rank " << r << "</text>\n";
    // Merge neighbouring spans of one colour and micro-batch: fewer elements, same picture.
    const std::vector<Span>& spans = tl[r];
    for (size_t i = 0; i < spans.size();) {
      size_t j = i;
      while (j + 1 < spans.size() && color(spans[j + 1]) == color(spans[i]) && spans[j + 1].mb == spans[i].mb &&
             spans[j + 1].start - spans[j].end < 1e-12)
        ++j;
      double x0 = left + spans[i].start * scale, x1 = left + spans[j].end * scale;
      os << "<rect x='" << fmt("%.2f", x0) << "' y='" << y << "' width='" << fmt("%.2f", std::max(0.3, x1 - x0))
         << "' height='" << row - 2 << "' fill='" << color(spans[i]) << "'/>\n";
      if (row >= 10 && x1 - x0 > 14 && spans[i].mb >= 0 && spans[i].kind == InstrKind::kCompute)
        os << "<text x='" << fmt("%.1f", x0 + 2) << "' y='" << y + row - 5 << "' fill='white'>" << spans[i].mb
           << "</text>\n";
      i = j + 1;
    }
  }
  os << "</svg>\n";
  return os.str();
}

}  // namespace weft::planner
