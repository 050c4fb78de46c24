// Alpha-beta collectives and per-op FLOP counts.
#include "planner/cost.h"

#include <algorithm>
#include <cmath>

namespace weft::planner {

double shape_elements(const core::Shape& s) {
  double n = 1;
  for (int64_t d : s) n *= double(d);
  return n;
}

namespace {

double numel(const core::Shape& s) { return shape_elements(s); }
double last(const core::Shape& s) { return s.empty() ? 1.0 : double(s.back()); }
double total(const std::vector<core::Shape>& v) {
  double n = 0;
  for (const auto& s : v) n += numel(s);
  return n;
}

}  // namespace

const char* const kRatedOpTypes[kRatedOps] = {
    "attention",     "attention.bwd",     "gqa_attention", "gqa_attention.bwd",
    "layernorm",     "layernorm.bwd",     "rmsnorm",       "rmsnorm.bwd",
    "gelu",          "gelu.bwd",          "swiglu",        "swiglu.bwd",
    "rope",          "rope.bwd",          "add",           "add.bwd",
    "cross_entropy", "cross_entropy.bwd", "embedding",     "embedding.bwd",
    "adamw",         "global_norm",       "moe",           "moe.bwd"};

int rated_op(const std::string& type) {
  for (int i = 0; i < kRatedOps; ++i)
    if (type == kRatedOpTypes[i]) return i;
  return -1;
}

const char* coll_name(CollKind k) {
  switch (k) {
    case CollKind::kAllReduce: return "all_reduce";
    case CollKind::kAllGather: return "all_gather";
    case CollKind::kReduceScatter: return "reduce_scatter";
    case CollKind::kAllToAll: return "all_to_all";
    case CollKind::kAllToAllV: return "all_to_all_v";
  }
  return "?";
}

double CostModel::sharing(int world) const {
  if (cores <= 0 || world <= 0) return 1;
  const double on_node = ranks_on_node(world);
  const double busy = active_ranks > 0 ? std::min(active_ranks, on_node) : on_node;
  return std::max(1.0, busy / double(cores));
}

double CostModel::oversub_weight(int world) const {
  return cores > 0 && world > 0 && ranks_on_node(world) > cores ? 1.0 : 0.0;
}

double CostModel::collective(CollKind k, int n, int64_t bytes, bool cross_node, int world) const {
  if (n <= 1) return 0;
  double a = cross_node ? alpha_inter : alpha_intra, bw = cross_node ? bw_inter : coll_bw(k, bytes);
  double steps = k == CollKind::kAllReduce ? 2.0 * (n - 1) : double(n - 1);
  // The reductions and copies of the bytes are the rank's own work: time-shared too.
  return launch + oversub_launch(world) + steps * a +
         double(wire_bytes(k, n, bytes)) / bw * sharing(world);
}

double CostModel::p2p(int64_t bytes, bool cross_node, int world) const {
  // No launch_oversub: the executor posts receives ahead, so a message leaves at send time
  // from the sender's own thread instead of waiting for its transport thread's time slice.
  const double a = cross_node ? alpha_inter : alpha_intra;
  return a + double(bytes) / (cross_node ? bw_inter : bw_intra) * sharing(world);
}

namespace {

// A measured curve at x: linear in log(x) between its points, clamped at its ends.
double interpolate_log(const std::vector<std::pair<double, double>>& c, double x) {
  if (x <= c.front().first) return c.front().second;
  if (x >= c.back().first) return c.back().second;
  size_t i = 1;
  while (c[i].first < x) ++i;
  const double t = std::log(x / c[i - 1].first) / std::log(c[i].first / c[i - 1].first);
  return c[i - 1].second + t * (c[i].second - c[i - 1].second);
}

}  // namespace

double CostModel::flop_rate(double flop) const {
  return flops_by_size.empty() ? flops : interpolate_log(flops_by_size, flop);
}

double CostModel::coll_bw(CollKind k, int64_t bytes) const {
  const auto& c = coll_bw_by_size[size_t(k)];
  return c.empty() ? bw_intra : interpolate_log(c, double(std::max<int64_t>(1, bytes)));
}

double CostModel::runnable_weight(int world) const {
  if (oversub_weight(world) <= 0) return 0;
  const double on_node = ranks_on_node(world);
  const double runnable = active_ranks > 0 ? std::min(active_ranks, on_node) : on_node;
  const double measured =
      sync_wait_oversub_ranks > cores ? std::min(double(sync_wait_oversub_ranks), on_node) : on_node;
  return std::clamp((runnable - double(cores)) / (measured - double(cores)), 0.0, 1.0);
}

double CostModel::sync_wait(double burst, int n, int world) const {
  if (n <= 1) return 0;
  const double x = std::max(burst, 1e-9);
  const double within = sync_wait_by_burst.empty() ? 0 : interpolate_log(sync_wait_by_burst, x);
  if (oversub_weight(world) <= 0) return within;
  if (sync_wait_oversub_by_burst.empty()) return 0;  // launch_oversub's regime
  const double over = interpolate_log(sync_wait_oversub_by_burst, x);
  const double w = runnable_weight(world);
  // w == 1 exactly where every rank is runnable: the curve as measured, not a rounding of it.
  if (w < 1) return within + w * (over - within);
  if (sync_wait_oversub_more_by_burst.empty() || sync_wait_oversub_ranks <= cores ||
      sync_wait_oversub_more_ranks <= sync_wait_oversub_ranks)
    return over;
  // Past the first curve's ranks: towards the curve measured at more.
  const double on_node = ranks_on_node(world);
  const double runnable = active_ranks > 0 ? std::min(active_ranks, on_node) : on_node;
  const double w2 = std::clamp((runnable - double(sync_wait_oversub_ranks)) /
                                   double(sync_wait_oversub_more_ranks - sync_wait_oversub_ranks),
                               0.0, 1.0);
  if (w2 <= 0) return over;
  const double more = interpolate_log(sync_wait_oversub_more_by_burst, x);
  return w2 >= 1 ? more : over + w2 * (more - over);
}

double CostModel::expected_max(int n) {
  if (n <= 1) return 0;
  // Exact for n = 2..8; above, Blom's approximation (the normal quantile at (n - 0.375) /
  // (n + 0.25), within 0.7% from 9 up), the quantile found by bisection on erfc.
  static constexpr double kExact[] = {0, 0, 0.5642, 0.8463, 1.0294, 1.1630, 1.2672, 1.3522, 1.4236};
  if (n <= 8) return kExact[n];
  const double p = (double(n) - 0.375) / (double(n) + 0.25);
  double lo = 0, hi = 10, e = 0;
  for (int i = 0; i < 60; ++i) {
    e = 0.5 * (lo + hi);
    (0.5 * std::erfc(-e / std::sqrt(2.0)) < p ? lo : hi) = e;
  }
  return e;
}

double CostModel::max_variance(int n) {
  if (n <= 1) return 1;
  // Exact for n = 2..8; above, as the extreme-value limit falls (1 / ln n), from 8's.
  static constexpr double kExact[] = {1, 1, 0.6817, 0.5595, 0.4917, 0.4475, 0.4159, 0.3919, 0.3729};
  if (n <= 8) return kExact[n];
  return kExact[8] * std::log(8.0) / std::log(double(n));
}

double CostModel::wait_variance(double wait, int n) const {
  if (n <= 1 || !(wait > 0)) return 0;
  const double sigma = wait / expected_max(n);
  return wait_spread * wait_spread * max_variance(n) * sigma * sigma;
}

double CostModel::replica_drift(double var, int replicas) const {
  if (replicas <= 1 || !(var > 0)) return 0;
  return expected_max(replicas) * std::sqrt(var);
}

double CostModel::compute_alone(double flop, double bytes) const {
  return op_overhead + std::max(flop / flop_rate(flop), bytes / mem_bw);
}

double CostModel::op_rate(int rated, double flop) const {
  if (rated < 0 || rated >= kRatedOps) return 0;
  const auto& curve = op_rates_by_size[size_t(rated)];
  return curve.empty() ? op_rates[size_t(rated)] : interpolate_log(curve, std::max(flop, 1.0));
}

double CostModel::compute_alone(const OpWork& w) const {
  const double rate = op_rate(w.rated, w.flop);
  return rate > 0 ? op_overhead + w.flop / rate : compute_alone(w.flop, w.bytes);
}

int64_t wire_bytes(CollKind k, int n, int64_t bytes) {
  if (n <= 1) return 0;
  int64_t share = bytes / n * (n - 1);
  return k == CollKind::kAllReduce ? 2 * share : share;
}

OpWork op_work(const core::Op& op, const std::string& part, const std::vector<core::Shape>& ins,
               const std::vector<core::Shape>& outs, size_t elem_bytes) {
  const std::string& t = op.type;
  OpWork w;
  w.bytes = (total(ins) + total(outs)) * double(elem_bytes);
  auto in = [&](size_t i) { return i < ins.size() ? ins[i] : core::Shape{}; };
  auto out = [&](size_t i) { return i < outs.size() ? outs[i] : core::Shape{}; };
  if (t == "linear" || t == "matmul") {
    w.flop = 2 * numel(out(0)) * last(in(0));
  } else if (t == "linear.bwd" || t == "matmul.bwd") {
    w.flop = 4 * numel(in(0)) * last(in(1));
  } else if (t == "attention" || t == "attention.bwd" || t == "gqa_attention" ||
             t == "gqa_attention.bwd") {
    // probs (B, h, T, T); head size d from the (h d) output or gradient. Grouped-query
    // attention does the same work per query head (K and V are read, not repeated).
    const bool fwd = t == "attention" || t == "gqa_attention";
    const core::Shape probs = fwd ? out(1) : in(t == "attention.bwd" ? 2 : 4);
    const core::Shape y = fwd ? out(0) : in(0);
    double h = probs.size() > 1 ? double(probs[1]) : 1, d = h > 0 ? last(y) / h : 1;
    w.flop = 4 * numel(probs) * d + 5 * numel(probs);
    if (!fwd) w.flop *= 2;
  } else if (t == "layernorm" || t == "layernorm.bwd") {
    w.flop = (t == "layernorm" ? 8 : 16) * numel(in(0));
  } else if (t == "rmsnorm" || t == "rmsnorm.bwd") {
    w.flop = (t == "rmsnorm" ? 5 : 10) * numel(in(0));
  } else if (t == "rope" || t == "rope.bwd") {
    w.flop = 3 * numel(in(0));
  } else if (t == "swiglu" || t == "swiglu.bwd") {
    w.flop = (t == "swiglu" ? 8 : 14) * numel(in(0));
  } else if (t == "gelu" || t == "gelu.bwd") {
    w.flop = 10 * numel(in(0));
  } else if (t == "add" || t == "add.bwd") {
    w.flop = numel(in(0));
  } else if (t == "cross_entropy" || t == "cross_entropy.bwd") {
    w.flop = (t == "cross_entropy" ? 6 : 3) * numel(in(0));
  } else if (t == "moe" || t == "moe.bwd") {
    // y (B,T,C) or dout; fc weight (E,F,C); assignments A = N*top_k of this slice.
    bool bwd = t == "moe.bwd";
    core::Shape y = in(0), fc = in(bwd ? 3 : 2), router = in(bwd ? 2 : 1);
    double C = last(y), N = numel(y) / std::max(1.0, C);
    double F = fc.size() > 1 ? double(fc[1]) : 0, E = router.empty() ? 1 : double(router[0]);
    double A = N * double(op.attrs.i_or("top_k", 1));
    double route = 2 * N * C * E, experts = 4 * A * C * F, combine = 2 * A * C;
    if (part == "moe.route") w.flop = route;
    else if (part == "moe.experts") w.flop = experts;
    else if (part == "moe.combine") w.flop = combine;
    else w.flop = route + experts + combine;
    if (bwd) w.flop *= 2;
  } else if (t == "global_norm") {
    w.flop = 2 * total(ins);
  } else if (t == "adamw") {
    w.flop = 15 * numel(in(0));
    w.bytes = 7 * numel(in(0)) * double(elem_bytes);
  } else {
    w.flop = total(ins);
  }
  // A custom rule's stage (ce.max, norm.sumsq, ...) is not the kernel that was timed. The
  // MoE layer's are: the fused op chains the same stage kernels (core/cpu/moe.h) that its
  // expert-parallel stages run apart, so each stage's FLOPs at the layer's rate, and the
  // stages of one layer sum to the whole layer's price.
  if (part.empty() || t == "moe" || t == "moe.bwd") w.rated = rated_op(t);
  return w;
}

}  // namespace weft::planner
