// The rules of a hardware description's model (description_check.h).
#include "planner/description_check.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

#include "planner/hardware.h"

namespace weft::planner {
namespace {

// `points` and three sizes between each two neighbours (geometric: the model interpolates
// in log(size)), ascending.
std::vector<double> with_between(std::set<double> points) {
  std::vector<double> out;
  for (auto it = points.begin(); it != points.end(); ++it) {
    out.push_back(*it);
    const auto next = std::next(it);
    if (next == points.end()) break;
    for (double f : {0.25, 0.5, 0.75}) out.push_back(std::floor(*it * std::pow(*next / *it, f)));
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::string num(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3g", x);
  return b;
}

// The collective kinds the model prices by curve, with the rules' prefixes.
struct Kind {
  CollKind kind;
  const char* prefix;
};
constexpr Kind kKinds[] = {{CollKind::kAllReduce, "ar_world"},
                           {CollKind::kAllGather, "ag_world"},
                           {CollKind::kReduceScatter, "rs_world"},
                           {CollKind::kAllToAll, "a2a"},
                           {CollKind::kAllToAllV, "a2av"}};

class Checker {
 public:
  explicit Checker(const Hardware& hw) : hw_(hw), cm_(hw.cost_model("f32")) {}

  std::vector<DescriptionContradiction> run() {
    rates();
    collectives();
    ops("hardware.flops_by_size", hw_.flops_by_size, -1);
    for (int k = 0; k < kRatedOps; ++k)
      ops(std::string("hardware.op_rates_by_size.") + kRatedOpTypes[k],
          hw_.op_rates_by_size[size_t(k)], k);
    return out_;
  }

 private:
  // One contradiction per rule and key: the first found (the smallest world and size); the
  // rest of a bad curve or rate says the same.
  void add(const std::string& rule, const std::string& field, const std::string& text) {
    for (const DescriptionContradiction& c : out_)
      if (c.rule == rule && c.field == field) return;
    out_.push_back({rule, field, text});
  }
  // kPriceRule on one number: a rate finite and > 0, a price finite and >= 0.
  bool price_ok(double x, bool is_rate, const std::string& field, const std::string& what) {
    if (std::isfinite(x) && (is_rate ? x > 0 : x >= 0)) return true;
    add(kPriceRule, field,
        std::string(kPriceRule) + " broken: " + what + " is " + num(x) +
            (is_rate ? " (a rate must be a finite number > 0)" : " s") +
            "; give numbers whose products and quotients stay finite");
    return false;
  }

  void rates() {
    price_ok(cm_.flops, true, "hardware.flops.f32", "the f32 FLOP rate (peak x flops_efficiency)");
    price_ok(hw_.cost_model("bf16").flops, true, "hardware.flops.bf16",
             "the bf16 FLOP rate (peak x flops_efficiency)");
    price_ok(cm_.mem_bw, true, "hardware.memory.bw", "the memory bandwidth (bw x efficiency)");
    price_ok(cm_.bw_intra, true, "hardware.intra_node.bw",
             "the intra-node bandwidth (bw x efficiency)");
    price_ok(cm_.bw_inter, true, "hardware.inter_node.bw",
             "the inter-node bandwidth (bw x efficiency)");
  }

  // The key whose numbers set an intra-node call's price of kind k.
  std::string coll_field(CollKind k) const {
    return hw_.coll_bw_by_size[size_t(k)].empty()
               ? "hardware.intra_node.bw"
               : std::string("hardware.collective_bw_by_size.") + coll_name(k);
  }

  void collectives() {
    const std::vector<double> probe = probe_sizes();  // judged in every description
    std::set<double> points(probe.begin(), probe.end());
    for (const auto& curve : hw_.coll_bw_by_size)
      for (const auto& [bytes, bw] : curve) points.insert(bytes);
    const std::vector<double> sizes = with_between(points);
    std::set<int> worlds = {2};
    if (hw_.ranks_per_node > 2) worlds.insert(hw_.ranks_per_node);
    const double spread = collective_spread();
    for (int n : worlds) {
      SizedCalls calls;
      for (double b : sizes) {
        const auto bytes = int64_t(b);
        for (const Kind& k : kKinds) {
          const double t = cm_.collective(k.kind, n, bytes, false);
          if (price_ok(t, false, coll_field(k.kind),
                       "the " + size_text(b) + " " + coll_name(k.kind) + " at " +
                           std::to_string(n) + " ranks of a node"))
            calls[k.prefix][b] = t;
          price_ok(cm_.collective(k.kind, 2, bytes, true), false, "hardware.inter_node",
                   "the " + size_text(b) + " " + coll_name(k.kind) + " across 2 nodes");
        }
        const double t = cm_.p2p(bytes, false);
        if (price_ok(t, false, "hardware.intra_node", "the " + size_text(b) + " message in a node"))
          calls["p2p"][b] = t;
        price_ok(cm_.p2p(bytes, true), false, "hardware.inter_node",
                 "the " + size_text(b) + " message across nodes");
      }
      for (const CollectiveContradiction& c : judge_calls(n, calls, spread, "is priced at")) {
        const bool decomposition = c.rule == kDecompositionRule;
        CollKind k = CollKind::kAllReduce;
        for (const Kind& x : kKinds)
          if (c.call.rfind(std::string(x.prefix) + "_", 0) == 0) k = x.kind;
        const bool message = c.call.rfind("p2p_", 0) == 0;
        const std::string field = message ? "hardware.intra_node" : coll_field(k);
        add(c.rule, field,
            c.text +
                (decomposition
                     ? "; fix: raise the all-reduce's rate there (a real one can always run as "
                       "the reduce-scatter then the all-gather, so it never costs more)"
                     : "; fix: a rate may grow with the size no faster than the size itself "
                       "(seconds = bytes / rate must not fall)"));
      }
    }
  }

  // A rate curve of ops (`rated`: its kRatedOpTypes index, -1 for flops_by_size): each op
  // size against the fastest larger one, as the bytes rule judges a call.
  void ops(const std::string& field, const std::vector<std::pair<double, double>>& curve,
           int rated) {
    if (curve.empty()) return;
    std::set<double> points;
    for (const auto& [flop, rate] : curve) points.insert(flop);
    std::vector<std::pair<double, double>> priced;  // FLOPs -> seconds
    for (double f : with_between(points)) {
      const double t = rated < 0 ? cm_.compute_alone(f, 0) : cm_.compute_alone(OpWork{f, 0, rated});
      if (price_ok(t, false, field, "an op of " + num(f) + " FLOPs")) priced.push_back({f, t});
    }
    const double spread = collective_spread();
    for (size_t i = 0; i < priced.size(); ++i) {
      size_t least = i;
      for (size_t j = i + 1; j < priced.size(); ++j)
        if (least == i || priced[j].second < priced[least].second) least = j;
      if (least == i || !(priced[i].second > spread * priced[least].second)) continue;
      char b[96];
      std::snprintf(b, sizeof b, "%.2fx (allowed %.2fx)", priced[i].second / priced[least].second,
                    spread);
      add(kBytesRule, field,
          std::string(kBytesRule) + " broken: an op of " + num(priced[i].first) +
              " FLOPs is priced at " + num(priced[i].second * 1e6) + " us, one of " +
              num(priced[least].first) + " FLOPs at " + num(priced[least].second * 1e6) + " us, " +
              b +
              "; fix: a rate may grow with the FLOPs no faster than the FLOPs themselves "
              "(seconds = FLOPs / rate must not fall)");
    }
  }

  const Hardware& hw_;
  const CostModel cm_;
  std::vector<DescriptionContradiction> out_;
};

}  // namespace

std::vector<DescriptionContradiction> check_description(const Hardware& hw) {
  return Checker(hw).run();
}

std::string describe(const std::vector<DescriptionContradiction>& found) {
  if (found.empty()) return "";
  return found.front().field + ": " + found.front().text +
         (found.size() > 1 ? " (and " + std::to_string(found.size() - 1) + " more)" : "");
}

}  // namespace weft::planner
