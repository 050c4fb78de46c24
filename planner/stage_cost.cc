// The search's stage-level costs: per-layer work at local shapes (partition.h's sub-ops,
// cost.h's op_work and collectives), pipeline timing (schedule.h's time_schedule) and
// per-stage memory (memory_estimate.h).
#include "planner/stage_cost.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "planner/buckets.h"
#include "planner/memory_estimate.h"
#include "planner/partition.h"
#include "planner/policy.h"
#include "planner/schedule.h"
#include "planner/step_end.h"

namespace weft::planner {
namespace {

double numel(const core::Shape& s) { return shape_elements(s); }

std::vector<core::Shape> shapes(const std::vector<SubTensor>& ts) {
  std::vector<core::Shape> out;
  out.reserve(ts.size());
  for (const SubTensor& t : ts) out.push_back(box_shape(t.piece.box));
  return out;
}

// `count` collectives of about total/count bytes each (one per parameter, or per bucket).
double collectives(const CostModel& cost, CollKind k, int64_t n, double total, int64_t count,
                   bool cross, int world) {
  if (n <= 1 || count <= 0 || total <= 0) return 0;
  return double(count) *
         collective_at(cost, k, int(n), int64_t(total / double(count)), cross, world);
}

// A chunk's parameters by block (lower_step.cc's gather_block: the embedding's on the first
// chunk, each layer's, the head's on the last), each in the order the forward first reads
// them. A tied tensor is once in the embedding's block where one chunk holds both ends;
// across chunks in each end's block with `tied_in_both`, else in neither (the step reduces
// its gradient apart).
std::vector<std::vector<double>> chunk_blocks(const SplitCosts& sc, int chunk, int chunks,
                                              int64_t begin, int64_t end, bool tied_in_both) {
  std::vector<std::vector<double>> out;
  const bool one = chunks == 1;
  if (chunk == 0) {
    out.emplace_back();
    for (size_t i = 0; i < sc.embed_param_sizes.size(); ++i)
      if (!sc.embed_param_tied[i] || one || tied_in_both)
        out.back().push_back(sc.embed_param_sizes[i]);
  }
  for (int64_t i = begin; i < end; ++i) out.push_back(sc.param_sizes[size_t(i)]);
  if (chunk == chunks - 1) {
    out.emplace_back();
    for (size_t i = 0; i < sc.head_param_sizes.size(); ++i)
      if (!sc.head_param_tied[i] || (!one && tied_in_both))
        out.back().push_back(sc.head_param_sizes[i]);
  }
  return out;
}

// CostModel::sync_wait of `count` collectives in a row on a group of n: the first after
// `burst` seconds of the rank's compute, the others back to back.
double sync_waits(const CostModel& cost, int64_t count, double burst, int64_t n, int world) {
  if (count <= 0 || n <= 1) return 0;
  return cost.sync_wait(burst, int(n), world) +
         double(count - 1) * cost.sync_wait(0, int(n), world);
}

// The pipeline's stage-boundary messages for time_schedule: the residual stream's
// activation or gradient, one per micro-batch and boundary, across the pp links.
Boundaries boundaries(const SplitCosts& sc, const CostModel& cost, const Crossing& cross,
                      std::vector<char> fwd_syncs, std::vector<char> bwd_syncs,
                      std::vector<double> fwd_var, std::vector<double> bwd_var) {
  Boundaries b;
  b.cost = &cost;
  b.world = cross.world;
  b.transfer = cost.p2p(int64_t(sc.boundary_bytes), cross.pp);
  b.send = cost.send_s(int64_t(sc.boundary_bytes), cross.pp, cross.world);
  b.fwd_syncs = std::move(fwd_syncs), b.bwd_syncs = std::move(bwd_syncs);
  b.fwd_var = std::move(fwd_var), b.bwd_var = std::move(bwd_var);
  return b;
}

}  // namespace

double chunk_messages_s(const SplitCosts& sc, const CostModel& cost, const Crossing& cross,
                        int chunk, int chunks) {
  const Boundaries b = boundaries(sc, cost, cross, {}, {}, {}, {});
  const int receives = (chunk > 0) + (chunk < chunks - 1);  // a forward's and a backward's
  return receives * (b.transfer + cost.message_wait(0, cross.world) + b.send);
}

double collective_at(const CostModel& cost, CollKind k, int n, int64_t bytes, bool cross_node, int world) {
  if (n <= 1) return 0;
  return cost.collective(k, n, bytes, cross_node) + cost.oversub_launch(world);
}

Crossing crossing(const Degrees& deg, const std::vector<Axis>& order, int ranks_per_node) {
  const Mesh mesh(deg, order);
  const int rpn = std::max(1, ranks_per_node);
  auto spans = [&](const std::vector<int>& ranks) {
    for (int r : ranks)
      if (r / rpn != ranks[0] / rpn) return true;
    return false;
  };
  std::vector<int> tp, ep, dp, pp;
  for (int t = 0; t < int(deg.tp); ++t) tp.push_back(mesh.rank_of(0, t, 0));
  for (int e = 0; e < int(deg.ep); ++e) ep.push_back(mesh.rank_of(0, int(deg.tp) * e, 0));
  for (int d = 0; d < int(deg.dp); ++d) dp.push_back(mesh.rank_of(0, 0, d));
  for (int s = 0; s < int(deg.pp); ++s) pp.push_back(mesh.rank_of(s, 0, 0));
  return Crossing{spans(tp), spans(ep), spans(dp), spans(pp), int(deg.dp * deg.tp * deg.pp * deg.ep)};
}

double schedule_runnable(const CostModel& cost, int world, const std::string& schedule, int pp,
                         int v, int m) {
  const int on_node = cost.ranks_on_node(world);
  if (cost.cores <= 0 || on_node <= cost.cores || pp <= 1 || m <= 0) return 0;
  const int chunks = pp * std::max(1, v);
  const ScheduleTiming t = time_schedule(schedule, pp, std::max(1, v), m,
                                         std::vector<double>(size_t(chunks), 1.0),
                                         std::vector<double>(size_t(chunks), 2.0));
  double busy = 0;
  for (double b : t.busy) busy += t.makespan > 0 ? b / t.makespan : 1;
  return double(on_node) * busy / double(pp);
}

SplitCosts split_costs(const core::Graph& g, const CostModel& cost, int64_t global_batch,
                       int64_t tp, int64_t ep, int64_t micro_batch, const Crossing& cross,
                       bool sequence_parallel) {
  ParallelConfig pc;
  pc.deg.tp = tp, pc.deg.ep = ep, pc.deg.dp = 1;
  pc.sequence_parallel = sequence_parallel && tp > 1;
  pc.global_batch = global_batch, pc.micro_batch = micro_batch;
  pc.micro_batches = global_batch / (micro_batch * ep);
  const std::vector<OpDecision> dec = decide_partitions(g, pc);
  std::map<int, const OpDecision*> by_op;
  for (const OpDecision& d : dec) by_op[d.op] = &d;

  int layers = 0;
  for (const core::Op& op : g.ops()) layers = std::max(layers, op.layer + 1);
  SplitCosts sc;
  sc.fwd.assign(size_t(layers), 0);
  sc.bwd.assign(size_t(layers), 0);
  sc.fwd_var.assign(size_t(layers), 0);
  sc.bwd_var.assign(size_t(layers), 0);
  sc.attn_fwd.assign(size_t(layers), 0);
  sc.param_bytes.assign(size_t(layers), 0);
  sc.param_sizes.assign(size_t(layers), {});
  std::map<std::pair<int, int>, bool> seen_param;  // (layer or -1/-2, value)
  std::map<int, size_t> embed_at;                  // value -> its index in embed_param_sizes
  // Values already counted as reduced over tp: several ops accumulate partial sums into one
  // gradient (q, k and v's into their input's), which is reduced once, where it is read.
  std::vector<char> reduced(g.values().size(), 0);
  // Per layer (then the embedding, then the head) and direction: the compute and the
  // tensor/expert-parallel collectives, for each collective's CostModel::sync_wait below.
  std::vector<double> burst_s(size_t(2 * (layers + 2)), 0);
  std::vector<int64_t> calls(burst_s.size(), 0);

  for (const core::Op& op : g.ops()) {
    if (op.phase != core::Phase::kForward && op.phase != core::Phase::kBackward) continue;
    const bool fwd = op.phase == core::Phase::kForward;
    const core::Op& f = fwd ? op : g.op(op.mirror);
    SubOp s = whole_op(g, op.id);
    std::vector<int32_t> parts_before_tp;
    if (auto it = by_op.find(f.id); it != by_op.end())
      for (const AxisSplit& sp : it->second->splits) {
        if (sp.axis == Axis::kTp)
          for (const SubTensor& o : s.outs) parts_before_tp.push_back(o.piece.parts);
        s = partition_one(g, s, sp.symbol, sp.n, 0, sp.groups);
      }
    const size_t elem =
        core::dtype_size(g.value(op.outputs.empty() ? op.inputs[0] : op.outputs[0]).dtype);
    const OpWork w = op_work(op, "", shapes(s.ins), shapes(s.outs), elem);
    const double compute = cost.compute(w);
    double t = compute;
    int64_t n_calls = 0;
    // Tensor parallelism leaves an activation (or its gradient) as partial sums: an
    // all-reduce over the tp lanes (Megatron's two per layer each way).
    for (size_t k = 0; k < parts_before_tp.size() && k < s.outs.size(); ++k) {
      const core::Value& v = g.value(op.outputs[k]);
      const bool activation =
          v.role == core::Role::kActivation ||
          (v.role == core::Role::kGradient &&
           !(v.grad_of >= 0 && g.value(v.grad_of).role == core::Role::kParameter));
      if (activation && s.outs[k].piece.parts > parts_before_tp[k] &&
          !reduced[size_t(op.outputs[k])]++) {
        const int64_t bytes = int64_t(s.outs[k].piece.numel()) * int64_t(elem);
        if (pc.sequence_parallel)
          t +=
              collective_at(cost, CollKind::kReduceScatter, int(tp), bytes, cross.tp, cross.world) +
              collective_at(cost, CollKind::kAllGather, int(tp), bytes, cross.tp, cross.world),
              n_calls += 2;
        else
          t += collective_at(cost, CollKind::kAllReduce, int(tp), bytes, cross.tp, cross.world),
              ++n_calls;
      }
    }
    // Sequence parallelism: the backward gathers each norm's output again for the weight
    // gradients of the column-parallel matmuls that read it.
    if (!fwd && pc.sequence_parallel && (f.type == "layernorm" || f.type == "rmsnorm")) {
      const int64_t whole = int64_t(numel(g.value(f.outputs[0]).shape)) * micro_batch /
                            std::max<int64_t>(1, g.value(f.outputs[0]).shape[0]);
      t += collective_at(cost, CollKind::kAllGather, int(tp), whole * int64_t(elem), cross.tp, cross.world);
      ++n_calls;
    }
    // Vocabulary-parallel cross-entropy: the row max and the sum of exponentials.
    if (fwd && op.type == "cross_entropy" && tp > 1 && !s.ins.empty()) {
      const core::Shape x = box_shape(s.ins[0].piece.box);
      const double rows = x.empty() ? 1 : numel(x) / double(x.back());
      t += 2 * collective_at(cost, CollKind::kAllReduce, int(tp), int64_t(rows * 4), cross.tp, cross.world);
      n_calls += 2;
    }
    // Expert parallelism: tokens dispatched to their experts and combined back.
    if (op.type == "moe" || op.type == "moe.bwd") {
      if (ep > 1 && !s.ins.empty()) {
        const double tokens = numel(box_shape(s.ins[0].piece.box));  // (B, T, C) of this rank
        const double k = double(f.attrs.i_or("top_k", 1));
        t += 2 * collective_at(cost, CollKind::kAllToAllV, int(ep), int64_t(tokens * k * double(elem)),
                               cross.ep, cross.world);
        n_calls += 2;
        // The dispatch learns its row counts first: one more call, on the dispatch's wait.
        if (fwd && f.inputs.size() > 1)
          t += collective_at(cost, CollKind::kAllGather, int(ep),
                             moe_count_bytes(g.value(f.inputs[1]).shape.at(0), int(ep)), cross.ep,
                             cross.world);
      }
    }
    const int layer = f.layer;
    const bool embed = layer < 0 && f.scope.rfind("embed", 0) == 0;
    {
      const size_t at = 2 * size_t(layer >= 0 ? layer
                                   : embed    ? layers
                                              : layers + 1) +
                        (fwd ? 0 : 1);
      burst_s[at] += compute;
      calls[at] += n_calls;
    }
    if (layer >= 0) {
      (fwd ? sc.fwd : sc.bwd)[size_t(layer)] += t;
      if (fwd && (op.type == "attention" || op.type == "gqa_attention"))
        sc.attn_fwd[size_t(layer)] += t;
    } else if (embed) {
      (fwd ? sc.embed_fwd : sc.embed_bwd) += t;
    } else {
      (fwd ? sc.head_fwd : sc.head_bwd) += t;
    }
    if (!fwd) continue;
    for (size_t i = 0; i < op.inputs.size(); ++i) {
      const core::Value& v = g.value(op.inputs[i]);
      if (v.role != core::Role::kParameter) continue;
      const int where = layer >= 0 ? layer : embed ? -1 : -2;
      if (seen_param[{where, op.inputs[i]}]) continue;
      seen_param[{where, op.inputs[i]}] = true;
      const double bytes = double(s.ins[i].piece.numel()) * double(core::dtype_size(v.dtype));
      sc.grad_elem = double(core::dtype_size(v.dtype));
      const bool tied = where == -2 && seen_param[{-1, op.inputs[i]}];
      if (layer >= 0) {
        sc.param_bytes[size_t(layer)] += bytes;
        sc.param_sizes[size_t(layer)].push_back(bytes);
      } else if (embed) {
        sc.embed_param_bytes += bytes;
        embed_at[op.inputs[i]] = sc.embed_param_sizes.size();
        sc.embed_param_sizes.push_back(bytes);
        sc.embed_param_tied.push_back(false);
      } else {
        sc.head_param_bytes += bytes;
        sc.head_param_sizes.push_back(bytes);
        sc.head_param_tied.push_back(tied);
      }
      if (tied) {
        sc.tied_param_bytes += bytes;
        sc.embed_param_tied[embed_at.at(op.inputs[i])] = true;
      }
    }
    // The residual stream between layers crosses a stage boundary (B, T, C) whole on every lane.
    if (layer == 0 && sc.boundary_bytes == 0 && !s.ins.empty())
      sc.boundary_bytes = numel(box_shape(s.ins[0].piece.box)) * double(elem);
  }
  // Each tensor/expert-parallel collective waits for the slower member's burst: a layer's
  // compute split evenly between its calls (their ops alternate with the collectives).
  const int group = int(std::max(tp, ep));
  for (size_t at = 0; at < calls.size(); ++at) {
    if (calls[at] == 0) continue;
    const double one = cost.sync_wait(burst_s[at] / double(calls[at]), group, cross.world);
    const double wait = double(calls[at]) * one;
    const double var = double(calls[at]) * cost.wait_variance(one, group);
    const size_t where = at / 2;
    const bool fwd = at % 2 == 0;
    if (where < size_t(layers)) {
      (fwd ? sc.fwd : sc.bwd)[where] += wait;
      (fwd ? sc.fwd_var : sc.bwd_var)[where] += var;
    } else if (where == size_t(layers)) {
      (fwd ? sc.embed_fwd : sc.embed_bwd) += wait;
      (fwd ? sc.embed_fwd_var : sc.embed_bwd_var) += var;
    } else {
      (fwd ? sc.head_fwd : sc.head_bwd) += wait;
      (fwd ? sc.head_fwd_var : sc.head_bwd_var) += var;
    }
    sc.layer_calls += calls[at];
  }
  return sc;
}

std::vector<int64_t> stage_in_flight(const std::string& schedule, int pp, int v, int m) {
  std::vector<int64_t> out;
  for (int s = 0; s < pp; ++s) {
    // Open (micro-batch, chunk) units, in whole stages' worth of layers (v chunks each).
    int open = 0, peak = 0;
    for (const Unit& u : stage_schedule(schedule, pp, v, m, s)) {
      open += u.dir == Dir::kForward ? 1 : -1;
      peak = std::max(peak, open);
    }
    out.push_back((peak + v - 1) / v);
  }
  return out;
}

int64_t chunk_grad_buckets(const SplitCosts& sc, const Layout& l, int chunk, int64_t begin,
                           int64_t end) {
  const int chunks = int(l.deg.pp * l.virtual_stages);
  std::vector<double> sizes;  // backward order: the blocks last to first, each reversed
  const auto blocks = chunk_blocks(sc, chunk, chunks, begin, end, false);
  for (auto b = blocks.rbegin(); b != blocks.rend(); ++b)
    sizes.insert(sizes.end(), b->rbegin(), b->rend());
  return bucket_count(sizes, l.bucket_bytes);
}

ChunkTime chunk_time(const SplitCosts& sc, const Layout& l, const CostModel& cost,
                     const Crossing& cross, int chunk, int64_t begin, int64_t end) {
  const int chunks = int(l.deg.pp * l.virtual_stages);
  const int64_t shards = l.deg.dp * l.deg.ep;
  ChunkTime c;
  double params = 0;
  for (int64_t i = begin; i < end; ++i) {
    c.fwd += sc.fwd[size_t(i)];
    c.bwd += sc.bwd[size_t(i)];
    c.fwd_var += sc.fwd_var[size_t(i)];
    c.bwd_var += sc.bwd_var[size_t(i)];
    if (l.recompute == "selective") c.bwd += sc.attn_fwd[size_t(i)];
    if (l.recompute == "full") c.bwd += sc.fwd[size_t(i)], c.bwd_var += sc.fwd_var[size_t(i)];
    params += sc.param_bytes[size_t(i)];
  }
  if (chunk == 0) {
    c.fwd += sc.embed_fwd, c.bwd += sc.embed_bwd;
    c.fwd_var += sc.embed_fwd_var, c.bwd_var += sc.embed_bwd_var;
    params += sc.embed_param_bytes;
  }
  if (chunk == chunks - 1) {
    c.fwd += sc.head_fwd, c.bwd += sc.head_bwd;
    c.fwd_var += sc.head_fwd_var, c.bwd_var += sc.head_bwd_var;
    params += sc.head_param_bytes;
    if (chunk == 0) params -= sc.tied_param_bytes;
  }
  // A collective inside a unit synchronises its stage (its burst restarts: time_schedule).
  c.fwd_syncs = sc.layer_calls > 0 || (l.zero >= 3 && shards > 1);
  c.bwd_syncs = sc.layer_calls > 0 || (l.zero >= 2 && shards > 1);
  // ZeRO-3 gathers every parameter in each unit that reads it, a block at a time (a layer,
  // the embedding, the head: lower_step.cc's gather_block), one call per block or per bucket
  // when a block outgrows one; ZeRO-2/3 reduce-scatter each micro-batch's gradients.
  if (l.zero >= 3) {
    int64_t calls = 0;
    for (const std::vector<double>& block : chunk_blocks(sc, chunk, chunks, begin, end, true))
      calls += bucket_count(block, l.bucket_bytes);
    const double gather = collectives(cost, CollKind::kAllGather, shards, params, calls, cross.dp, cross.world);
    // Each block's gather follows the previous block's compute.
    const double fwd_wait =
        double(calls) * cost.sync_wait(c.fwd / double(calls), int(shards), cross.world);
    const double bwd_wait =
        double(calls) * cost.sync_wait(c.bwd / double(calls), int(shards), cross.world);
    c.fwd += gather + fwd_wait, c.bwd += gather + bwd_wait;
  }
  if (l.zero >= 2) {
    const int64_t grads = chunk_grad_buckets(sc, l, chunk, begin, end);
    c.bwd +=
        collectives(cost, CollKind::kReduceScatter, shards, params, grads, cross.dp, cross.world) +
        sync_waits(cost, grads, c.bwd, shards, cross.world);
  }
  return c;
}

double stage_memory(const core::ModelSpec& m, const Layout& l, int s, int64_t layers,
                    int64_t in_flight) {
  const int chunks = int(l.deg.pp * l.virtual_stages);
  StageShape st;
  st.layers = layers;
  st.first = s == 0;
  st.last = s == (chunks - 1) % int(l.deg.pp);
  st.in_flight = in_flight;
  return estimate_stage_memory(m, l.deg, l.zero, l.micro_batch, l.recompute, st,
                               l.sequence_parallel)
      .total();
}

Prediction predict(const core::ModelSpec& m, const SplitCosts& sc, const Layout& l,
                   const CostModel& cost, const Crossing& cross,
                   const std::vector<int64_t>& in_flight) {
  const int pp = int(l.deg.pp), v = int(l.virtual_stages), chunks = pp * v;
  const int64_t shards = l.deg.dp * l.deg.ep;
  std::vector<double> fwd, bwd, fwd_var, bwd_var, final, stage_params(size_t(pp), 0);
  std::vector<char> fwd_syncs, bwd_syncs;
  std::vector<int64_t> stage_layers(size_t(pp), 0);
  std::vector<std::vector<double>> stage_sizes(
      static_cast<size_t>(pp));  // forward order: the step's gathers
  int64_t begin = 0;
  for (int c = 0; c < chunks; ++c) {
    const int64_t end = begin + l.chunk_layers[size_t(c)];
    const ChunkTime t = chunk_time(sc, l, cost, cross, c, begin, end);
    fwd.push_back(t.fwd);
    bwd.push_back(t.bwd);
    fwd_var.push_back(t.fwd_var);
    bwd_var.push_back(t.bwd_var);
    fwd_syncs.push_back(t.fwd_syncs);
    bwd_syncs.push_back(t.bwd_syncs);
    double p = 0;
    for (int64_t i = begin; i < end; ++i) p += sc.param_bytes[size_t(i)];
    if (c == 0) p += sc.embed_param_bytes;
    if (c == chunks - 1) p += sc.head_param_bytes;
    if (chunks == 1) p -= sc.tied_param_bytes;  // one tensor, its gradient synced once
    // ZeRO-0/1 reduce a chunk's gradients once they are complete, blocking, inside its last
    // backward unit (lower_step.cc's sync_grad): before the gradient goes on to the previous
    // stage, so the reductions of successive stages add up along the pipeline's tail.
    double sync = 0;
    const int64_t grads = chunk_grad_buckets(sc, l, c, begin, end);
    if (l.zero == 0)
      sync = collectives(cost, CollKind::kAllReduce, shards, p, grads, cross.dp, cross.world);
    if (l.zero == 1)
      sync = collectives(cost, CollKind::kReduceScatter, shards, p, grads, cross.dp, cross.world);
    // The first bucket waits for the slower replica's burst: every micro-batch's compute of
    // this chunk when nothing synchronised the ranks within the units (no tp or ep
    // collective, no ZeRO-2/3 call), else one unit's.
    if (l.zero <= 1) {
      const bool units_sync = sc.layer_calls > 0 || l.zero >= 2;
      const double burst = units_sync ? t.bwd : double(l.micro_batches) * (t.fwd + t.bwd);
      sync += sync_waits(cost, grads, burst, shards, cross.world);
    }
    final.push_back(sync);
    stage_params[size_t(c % pp)] += p;
    stage_layers[size_t(c % pp)] += end - begin;
    for (const std::vector<double>& block : chunk_blocks(sc, c, chunks, begin, end, true))
      stage_sizes[size_t(c % pp)].insert(stage_sizes[size_t(c % pp)].end(), block.begin(),
                                         block.end());
    begin = end;
  }
  const Boundaries messages =
      boundaries(sc, cost, cross, std::move(fwd_syncs), std::move(bwd_syncs), std::move(fwd_var),
                 std::move(bwd_var));
  const ScheduleTiming timing =
      time_schedule(l.schedule, pp, v, int(l.micro_batches), fwd, bwd, &final, &messages);
  // The replicas' drift (CostModel::replica_drift), as the engine charges it: the variances
  // add along a stage's units and meet by the larger at each message (time_schedule), and
  // each stage's first gradient collective across the replicas pays the drift it ended its
  // units with. Those collectives are buckets flushed after the stage's last backward
  // (lower_step.cc's step_phase at these sizes), so the payment delays the stage's own end,
  // never a gradient it sent down the pipeline.
  double drift_tail = 0;
  if (l.deg.dp > 1)
    for (int s = 0; s < pp; ++s)
      drift_tail =
          std::max(drift_tail, timing.end[size_t(s)] - timing.makespan +
                                   cost.replica_drift(timing.drift_var[size_t(s)], int(l.deg.dp)));

  // After the pipeline: the tied embedding's sum over its two stages, the gradient norm,
  // AdamW on this rank's share, ZeRO-1/2's parameter gather.
  const bool tied = !m.is_llama() || m.tie_embeddings;
  const double elem = sc.grad_elem;
  std::vector<double> end_s(size_t(pp), 0);
  double optimizer_s = 0;  // the largest stage's AdamW
  // The first collective each stage takes part in after the pipeline waits at the longest
  // of its members' bursts then (time_schedule's end_burst), as in the engine: the tied
  // embedding's sum (the first and the last stage), else the norm over the replica. The
  // ones after follow one another with little compute between them: each waits as a call
  // right after another (CostModel::sync_wait at no burst).
  std::vector<double> burst = timing.end_burst;
  const bool tied_sum = tied && pp > 1;
  const size_t last = size_t((chunks - 1) % pp);
  const double tied_burst = tied_sum ? std::max(burst[0], burst[last]) : 0;
  if (tied_sum) burst[0] = burst[last] = 0;
  const double norm_burst = *std::max_element(burst.begin(), burst.end());
  for (int s = 0; s < pp; ++s) {
    const double bytes = stage_params[size_t(s)];
    double t = 0;
    if (l.zero == 1 || l.zero == 2) {
      const int64_t gathers = bucket_count(stage_sizes[size_t(s)], l.bucket_bytes);
      t += collectives(cost, CollKind::kAllGather, shards, bytes, gathers, cross.dp, cross.world) +
           sync_waits(cost, gathers, 0, shards, cross.world);
    }
    if (tied_sum && (s == 0 || size_t(s) == last))
      t += collective_at(cost, CollKind::kAllReduce, 2, int64_t(sc.embed_param_bytes), cross.pp,
                         cross.world) +
           sync_waits(cost, 1, tied_burst, 2, cross.world);
    const int64_t replica = l.deg.tp * l.deg.ep * l.deg.pp;
    const bool replica_cross = cross.pp || cross.tp || cross.ep;
    t += collective_at(cost, CollKind::kAllReduce, int(replica), 8, replica_cross, cross.world) +
         sync_waits(cost, 1, norm_burst, replica, cross.world);
    if (l.zero >= 1)
      t += collective_at(cost, CollKind::kAllReduce, int(replica * l.deg.dp), 8,
                         replica_cross || cross.dp, cross.world) +
           sync_waits(cost, 1, 0, replica * l.deg.dp, cross.world);
    const double n = bytes / elem / double(l.zero >= 1 ? shards : 1);
    OpWork adamw{15 * n, 7 * n * elem, rated_op("adamw")};  // op_work's count for adamw
    optimizer_s = std::max(optimizer_s, cost.compute(adamw));
    t += cost.compute(adamw);
    end_s[size_t(s)] = t;
  }
  // The trainer's statistics exchange before the optimizer (step_end.h), as simulate_plan
  // charges it: after the slowest stage's optimizer compute.
  const int64_t world = l.deg.dp * l.deg.tp * l.deg.pp * l.deg.ep;
  const double exchange = trainer_exchange_s(cost, int(world), optimizer_s,
                                             cross.dp || cross.tp || cross.pp || cross.ep);
  Prediction p;
  p.pipeline_s = timing.makespan;
  p.exchange_s = exchange;
  p.step_s =
      timing.makespan + drift_tail + *std::max_element(end_s.begin(), end_s.end()) + exchange;
  double idle = 0;
  for (int s = 0; s < pp; ++s)
    idle += p.step_s > 0 ? 1.0 - (timing.busy[size_t(s)] + end_s[size_t(s)]) / p.step_s : 0;
  p.bubble = idle / double(pp);
  for (int s = 0; s < pp; ++s) {
    p.stage_bytes.push_back(stage_memory(m, l, s, stage_layers[size_t(s)], in_flight[size_t(s)]));
    p.memory_bytes = std::max(p.memory_bytes, p.stage_bytes.back());
  }
  return p;
}

}  // namespace weft::planner
