// Real plans run in one process: every rank's compute instructions through
// core::run_compute, and its loads, chunks, sends and collectives by a reference interpreter
// that moves data in global coordinates (each tensor is a piece of a global value). One
// training step in f64 must give the single-device executor's loss and parameter update.
// AdamW runs with a large eps, so its update is nearly proportional to the (clipped)
// gradient and a wrong gradient shows, and with clipping on, so the global norm shows too.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <numeric>
#include <random>

#include "core/exec/executor.h"
#include "core/graph/op_parts.h"
#include "core/models/gpt.h"
#include "tests/planner/util.h"

namespace weft::planner {
namespace {

using core::Tensor;

// ---- data in global coordinates ----------------------------------------------------------

// Local index of global index x in a dim slice; -1 when outside.
int64_t local_of(const DimSlice& s, int64_t x) {
  int64_t rel = x - s.start;
  if (rel < 0) return -1;
  int64_t c = s.count > 1 ? rel / s.stride : 0, o = s.count > 1 ? rel % s.stride : rel;
  return c < s.count && o < s.size ? c * s.size + o : -1;
}
int64_t global_of(const DimSlice& s, int64_t i) { return s.start + (i / s.size) * s.stride + i % s.size; }

void set(Tensor& t, int64_t i, double v) {
  if (t.dtype() == core::DType::kF64) t.data<double>()[i] = v;
  else if (t.dtype() == core::DType::kF32) t.data<float>()[i] = float(v);
  else t.data<int32_t>()[i] = int32_t(v);
}

// dst[elements of dst_box that src_box holds] (+)= src. Both tensors contiguous.
void transfer(const Tensor& src, const Box& sb, Tensor& dst, const Box& db, bool add = false) {
  const size_t nd = db.size();
  std::vector<int64_t> idx(nd, 0);
  for (int64_t i = 0; i < dst.numel(); ++i) {
    int64_t rem = i, off = 0;
    for (size_t d = nd; d-- > 0;) idx[d] = rem % db[d].numel(), rem /= db[d].numel();
    bool inside = true;
    for (size_t d = 0; d < nd && inside; ++d) {
      int64_t l = local_of(sb[d], global_of(db[d], idx[d]));
      inside = l >= 0;
      off = off * sb[d].numel() + l;
    }
    if (!inside) continue;
    set(dst, i, src.item_at(off) + (add ? dst.item_at(i) : 0.0));
  }
}

core::PieceBox piece_box(const Box& b) {
  core::PieceBox out;
  for (const DimSlice& d : b) out.push_back({d.start, d.size, d.count, d.stride});
  return out;
}

// ---- the interpreter -----------------------------------------------------------------------

struct Interpreter {
  const Plan& plan;
  const core::Graph& g;
  std::vector<RankProgram> progs;
  std::vector<std::map<int, Tensor>> mem;  // per rank: root tensor id -> storage
  std::vector<size_t> pc;
  std::map<std::tuple<int, int, int64_t>, Tensor> mail;  // (from, to, tag)
  std::vector<std::map<std::pair<int, int>, int>> route_of;  // (op, mb) -> route tensor
  std::vector<std::map<std::pair<int, int>, std::vector<int64_t>>> expert_rows;
  core::StepScalars scalars;

  Interpreter(const Plan& p, const core::Graph& graph) : plan(p), g(graph) {
    for (int r = 0; r < p.world(); ++r) progs.push_back(p.program(r));
    mem.resize(progs.size()), pc.assign(progs.size(), 0);
    route_of.resize(progs.size()), expert_rows.resize(progs.size());
  }
  const TensorDesc& desc(int r, int t) const { return progs[size_t(r)].tensors.at(size_t(t)); }
  int root(int r, int t) const {
    while (desc(r, t).alias_of >= 0) t = desc(r, t).alias_of;
    return t;
  }
  Tensor fresh(const TensorDesc& d) const { return Tensor::zeros(box_shape(d.piece.box), d.dtype); }
  // The tensor's local values (a copy for a view).
  Tensor read(int r, int t) {
    int rt = root(r, t);
    Tensor& s = mem[size_t(r)].at(rt);
    if (rt == t) return s;
    Tensor out = fresh(desc(r, t));
    transfer(s, desc(r, rt).piece.box, out, desc(r, t).piece.box);
    return out;
  }
  void write(int r, int t, const Tensor& v, bool add = false) {
    int rt = root(r, t);
    Tensor& s = mem[size_t(r)][rt];
    if (!s.defined()) s = fresh(desc(r, rt));
    transfer(v, desc(r, t).piece.box, s, desc(r, rt).piece.box, add);
  }
  core::LocalOperand operand(int r, const Operand& o) {
    const TensorDesc& d = desc(r, o.tensor);
    core::LocalOperand lo;
    lo.slot = o.slot, lo.name = d.name, lo.accumulate = o.accumulate, lo.dtype = d.dtype;
    lo.box = piece_box(d.piece.box);
    lo.global_shape = d.value >= 0 ? g.value(d.value).shape : box_shape(d.piece.box);
    lo.split_index = d.piece.part, lo.split_count = d.piece.parts;
    int rt = root(r, o.tensor);
    lo.tensor = &mem[size_t(r)][rt];
    if (rt != o.tensor && !(desc(r, rt).piece.box == d.piece.box)) {
      // A view: its box inside the root's local layout.
      const Box& rb = desc(r, rt).piece.box;
      for (size_t k = 0; k < rb.size(); ++k) {
        const DimSlice& v = d.piece.box[k];
        int64_t l0 = local_of(rb[k], v.start), l1 = v.count > 1 ? local_of(rb[k], v.start + v.stride) : 0;
        lo.within.push_back({l0, v.size, v.count, v.count > 1 ? l1 - l0 : 0});
      }
    }
    return lo;
  }

  void compute(int r, const Instr& in) {
    const core::Op& op = g.op(in.op);
    core::StepScalars s = scalars;
    s.micro_batch = in.mb;
    core::PartContext ctx{op, in.part, {}, {}, s};
    for (const Operand& o : in.in) ctx.in.push_back(operand(r, o));
    for (const Operand& o : in.out) ctx.out.push_back(operand(r, o));
    if (in.part == "moe.experts") ctx.expert_rows = expert_rows[size_t(r)].at({in.op, in.mb});
    core::run_compute(ctx);
    if (op.type == "moe" && (in.part == "moe.route" || in.part.empty()))
      for (const Operand& o : in.out)
        if (o.slot == 3) route_of[size_t(r)][{in.op, in.mb}] = o.tensor;
    if (op.type == "moe.bwd")
      for (const Operand& o : in.in)
        if (o.slot == 8) route_of[size_t(r)][{in.op, in.mb}] = o.tensor;
  }

  // MoE dispatch (token side -> expert side) or return, grouped by the experts' members.
  void all_to_all_v(const Instr& first, const std::vector<int>& ranks) {
    const core::Op& op = g.op(first.op);
    const int64_t E = g.value(op.inputs[op.type == "moe" ? 1 : 2]).shape[0], G = int64_t(ranks.size()), El = E / G;
    std::vector<std::vector<int64_t>> off(ranks.size());
    for (size_t s = 0; s < ranks.size(); ++s) {
      int rt = route_of[size_t(ranks[s])].at({first.op, first.mb});
      std::vector<int64_t> c = core::moe_expert_counts(read(ranks[s], rt), E);
      off[s].assign(size_t(G) + 1, 0);
      for (int64_t j = 0; j < G; ++j)
        off[s][size_t(j) + 1] = off[s][size_t(j)] + std::accumulate(c.begin() + j * El, c.begin() + (j + 1) * El, int64_t(0));
      for (int64_t j = 0; j < G; ++j) {
        auto& er = expert_rows[size_t(ranks[size_t(j)])][{first.op, first.mb}];
        if (s == 0) er.clear();
        er.insert(er.end(), c.begin() + j * El, c.begin() + (j + 1) * El);
      }
    }
    std::vector<Tensor> in;
    for (size_t m = 0; m < ranks.size(); ++m) in.push_back(read(ranks[m], progs[size_t(ranks[m])].program[pc[size_t(ranks[m])]].in[0].tensor));
    const bool dispatch = first.part == "moe.dispatch";
    for (size_t m = 0; m < ranks.size(); ++m) {
      const int r = ranks[m], t = progs[size_t(r)].program[pc[size_t(r)]].out[0].tensor;
      const int64_t C = in[0].size(1);
      int64_t rows = 0;
      for (size_t s = 0; s < ranks.size(); ++s) rows += off[s][m + 1] - off[s][m];
      Tensor out = Tensor::zeros({dispatch ? rows : desc(r, t).piece.box[0].numel(), C}, in[0].dtype());
      for (size_t q = 0, at = 0; q < ranks.size(); ++q) {
        // dispatch: rows of source q for member m; return: rows member q computed for m.
        int64_t n = dispatch ? off[q][m + 1] - off[q][m] : off[m][q + 1] - off[m][q];
        int64_t src = dispatch ? off[q][m] : 0;
        if (!dispatch)
          for (size_t s = 0; s < m; ++s) src += off[s][q + 1] - off[s][q];
        int64_t dst = dispatch ? int64_t(at) : off[m][q];
        if (n) out.slice(0, dst, n).copy_from(in[q].slice(0, src, n));
        at += size_t(n);
      }
      mem[size_t(r)][t] = out;  // expert-side sizes are data-dependent: exactly what arrived
    }
  }

  void collective(const std::vector<int>& ranks) {
    const Instr& first = progs[size_t(ranks[0])].program[pc[size_t(ranks[0])]];
    if (first.coll == CollKind::kAllToAllV) return all_to_all_v(first, ranks);
    for (size_t k = 0; k < first.in.size(); ++k) {
      std::vector<Tensor> in;
      std::vector<Box> boxes;
      for (int r : ranks) {
        const Instr& c = progs[size_t(r)].program[pc[size_t(r)]];
        in.push_back(read(r, c.in[k].tensor).clone());
        boxes.push_back(desc(r, c.in[k].tensor).piece.box);
      }
      for (int r : ranks) {
        const Instr& c = progs[size_t(r)].program[pc[size_t(r)]];
        const TensorDesc& od = desc(r, c.out[k].tensor);
        Tensor out = fresh(od);
        if (first.coll == CollKind::kAllReduce && first.reduce == ReduceOp::kMax) {
          out = in[0].clone();
          for (size_t m = 1; m < in.size(); ++m)
            for (int64_t i = 0; i < out.numel(); ++i) set(out, i, std::max(out.item_at(i), in[m].item_at(i)));
        } else if (first.coll == CollKind::kAllReduce || first.coll == CollKind::kReduceScatter) {
          for (size_t m = 0; m < in.size(); ++m) transfer(in[m], boxes[m], out, od.piece.box, true);
        } else {  // all_gather, all_to_all: every element from the member that holds it
          for (size_t m = 0; m < in.size(); ++m) transfer(in[m], boxes[m], out, od.piece.box);
        }
        write(r, c.out[k].tensor, out, c.out[k].accumulate);
      }
    }
  }

  // Runs every program to its end; false on a deadlock.
  bool run() {
    for (bool progress = true; progress;) {
      progress = false;
      for (int r = 0; r < int(progs.size()); ++r) {
        auto& p = progs[size_t(r)].program;
        while (pc[size_t(r)] < p.size()) {
          const Instr& in = p[pc[size_t(r)]];
          if (in.kind == InstrKind::kCollective) {
            const std::vector<int>& ranks = plan.groups.at(size_t(in.group)).ranks;
            bool all = true;
            for (int q : ranks) {
              const auto& qp = progs[size_t(q)].program;
              all = all && pc[size_t(q)] < qp.size() && qp[pc[size_t(q)]].kind == InstrKind::kCollective &&
                    qp[pc[size_t(q)]].group == in.group;
            }
            if (!all) break;
            collective(ranks);
            for (int q : ranks) ++pc[size_t(q)];
            progress = true;
            continue;
          }
          if (in.kind == InstrKind::kRecv) {
            auto it = mail.find({in.peer, r, in.tag});
            if (it == mail.end()) break;
            mem[size_t(r)][in.out[0].tensor] = it->second;
            mail.erase(it);
          } else if (in.kind == InstrKind::kSend) {
            mail[{r, in.peer, in.tag}] = read(r, in.in[0].tensor).clone();
          } else if (in.kind == InstrKind::kCompute) {
            compute(r, in);
          } else if (in.kind == InstrKind::kLocal) {
            Tensor out = fresh(desc(r, in.out[0].tensor));
            transfer(read(r, in.in[0].tensor), desc(r, in.in[0].tensor).piece.box, out, desc(r, in.out[0].tensor).piece.box);
            write(r, in.out[0].tensor, out, in.out[0].accumulate);
          } else if (in.kind == InstrKind::kLoad) {
            load(r, in.out[0].tensor);
          } else if (in.kind == InstrKind::kFree) {
            for (const Operand& o : in.in)
              if (!desc(r, o.tensor).persistent) mem[size_t(r)].erase(o.tensor);
          }
          ++pc[size_t(r)];
          progress = true;
        }
      }
    }
    for (size_t r = 0; r < progs.size(); ++r)
      if (pc[r] < progs[r].program.size()) return false;
    return true;
  }

  std::function<void(int, int)> load;
};

// ---- the comparison ------------------------------------------------------------------------

struct Case {
  std::string name;
  bool moe;
  int world;
  int64_t tp, pp, ep, dp;
  int zero;
  std::string recompute = "none", schedule = "1f1b";
  int64_t vocab = 32, heads = 4, dim = 16;  // GPT only
};

void check_plan_step(const Case& c) {
  SCOPED_TRACE(c.name);
  core::JobSpec s =
      c.moe ? test_util::moe_spec(4, 2) : test_util::gpt_spec(2, c.dim, c.heads, c.vocab, 8);
  if (c.moe) s.model.dim = 16, s.model.vocab = 32, s.model.seq_len = 8, s.model.moe.aux_coef = 0.3;
  s.train.global_batch = 8, s.train.micro_batch = 2;
  s.train.lr = 1.0, s.train.eps = 10.0, s.train.grad_clip = 0.05, s.train.weight_decay = 0.1;
  s.parallel.tp = c.tp, s.parallel.pp = c.pp, s.parallel.ep = c.ep, s.parallel.dp = c.dp, s.parallel.zero = c.zero;
  s.parallel.recompute = c.recompute, s.parallel.pipeline.schedule = c.schedule;
  const int64_t B = s.train.global_batch, T = s.model.seq_len, mb = s.train.micro_batch, accum = B / mb;

  // Single device, f64, micro-batches of mb rows.
  core::ModelGraph ref = core::build_model(s.model, mb, core::DType::kF64);
  core::add_training_ops(ref, s.train);
  core::GraphExecutor ex(ref.graph);
  core::init_parameters(ref, ex, 11);
  std::map<int, Tensor> init;
  for (int p : ref.graph.parameters()) init[p] = ex.tensor(p).clone();
  std::mt19937_64 rng(5);
  Tensor tokens = Tensor::empty({B, T}, core::DType::kI32), targets = Tensor::empty({B, T}, core::DType::kI32);
  for (int64_t i = 0; i < B * T; ++i)
    tokens.data<int32_t>()[i] = int32_t(rng() % uint64_t(s.model.vocab)), targets.data<int32_t>()[i] = int32_t(rng() % uint64_t(s.model.vocab));
  core::StepScalars sc;
  sc.loss_scale = 1.0 / double(accum), sc.lr = s.train.lr, sc.step = 0;
  double ref_loss = 0;
  ex.zero_grads();
  for (int64_t i = 0; i < accum; ++i) {
    ex.set_input(ref.tokens, tokens.slice(0, i * mb, mb).contiguous());
    ex.set_input(ref.targets, targets.slice(0, i * mb, mb).contiguous());
    ex.run_forward_backward(sc);
    ref_loss += ex.tensor(ref.loss).item() / double(accum);
  }
  ex.run_optimizer(sc);

  // The plan over the global batch, in f64 too.
  core::ModelGraph pg = core::build_model(s.model, B, core::DType::kF64);
  core::add_training_ops(pg, s.train);
  Plan plan = make_plan(s, pg.graph, c.world);
  ASSERT_EQ(plan.world(), c.world);
  Interpreter it(plan, pg.graph);
  const int64_t K = plan.config.data_shards() * plan.config.micro_batches;
  it.scalars = sc;
  it.scalars.loss_scale = 1.0 / double(K);
  it.load = [&](int r, int t) {
    const TensorDesc& d = it.desc(r, t);
    Tensor out = it.fresh(d);
    transfer(d.value == pg.tokens ? tokens : targets, full_box({B, T}), out, d.piece.box);
    it.mem[size_t(r)][t] = out;
  };
  for (int r = 0; r < c.world; ++r)
    for (size_t t = 0; t < it.progs[size_t(r)].tensors.size(); ++t) {
      const TensorDesc& d = it.progs[size_t(r)].tensors[t];
      if (!d.persistent || d.alias_of >= 0) continue;
      Tensor v = it.fresh(d);
      if (d.value >= 0 && pg.graph.value(d.value).role == core::Role::kParameter)
        transfer(init.at(d.value), full_box(pg.graph.value(d.value).shape), v, d.piece.box);
      it.mem[size_t(r)][int(t)] = v;
    }
  ASSERT_TRUE(it.run()) << "the interpreter deadlocked";

  // The loss: one addend per batch part (tp lanes hold copies), each a part's mean.
  std::map<int, double> parts;
  for (int r = 0; r < c.world; ++r)
    for (auto& [t, v] : it.mem[size_t(r)]) {
      const TensorDesc& d = it.desc(r, t);
      if (d.value == pg.loss && d.alias_of < 0) parts[d.piece.part] = v.item();
    }
  double loss = 0;
  for (auto& [p, v] : parts) loss += v / double(K);
  EXPECT_EQ(int64_t(parts.size()), K);
  EXPECT_NEAR(loss, ref_loss, 1e-10 * std::abs(ref_loss));
  // Every parameter piece moved as on one device.
  int checked = 0;
  for (int r = 0; r < c.world; ++r)
    for (auto& [t, v] : it.mem[size_t(r)]) {
      const TensorDesc& d = it.desc(r, t);
      if (d.value < 0 || pg.graph.value(d.value).role != core::Role::kParameter || d.alias_of >= 0) continue;
      const core::Shape& gs = pg.graph.value(d.value).shape;
      Tensor want = it.fresh(d), before = it.fresh(d);
      transfer(ex.tensor(d.value), full_box(gs), want, d.piece.box);
      transfer(init.at(d.value), full_box(gs), before, d.piece.box);
      double diff = 0, scale = 0;
      for (int64_t i = 0; i < v.numel(); ++i) {
        double moved = v.item_at(i) - before.item_at(i), ref_moved = want.item_at(i) - before.item_at(i);
        diff = std::max(diff, std::abs(moved - ref_moved));
        scale = std::max(scale, std::abs(ref_moved));
      }
      EXPECT_LE(diff, 1e-9 * scale) << pg.graph.value(d.value).name << " on rank " << r << " " << piece_str(d.piece);
      ++checked;
    }
  EXPECT_GE(checked, int(pg.graph.parameters().size()));
}

TEST(PartsPlan, TensorParallelGpt) { check_plan_step({"gpt tp2", false, 2, 2, 1, 1, 1, 0}); }
TEST(PartsPlan, DataTensorPipelineZero1Gpt) { check_plan_step({"gpt tp2 pp2 dp2 zero1", false, 8, 2, 2, 1, 2, 1}); }
TEST(PartsPlan, Zero2And3WithRecompute) {
  check_plan_step({"gpt tp2 dp2 zero2 full", false, 4, 2, 1, 1, 2, 2, "full"});
  check_plan_step({"gpt tp2 dp2 zero3 selective", false, 4, 2, 1, 1, 2, 3, "selective"});
  check_plan_step({"gpt pp2 dp2 zero3 gpipe", false, 4, 1, 2, 1, 2, 3, "none", "gpipe"});
}
// Vocabularies that tp does not divide: balanced slices (32 over 3 = 11, 11, 10; 31 over 2).
TEST(PartsPlan, UnevenVocabularySlices) {
  check_plan_step({"gpt tp3 vocab 32", false, 3, 3, 1, 1, 1, 0, "none", "1f1b", 32, 6, 24});
  check_plan_step(
      {"gpt tp2 pp2 vocab 31 (tied head)", false, 4, 2, 2, 1, 1, 0, "none", "1f1b", 31});
  check_plan_step({"gpt tp2 dp2 zero1 vocab 31", false, 4, 2, 1, 1, 2, 1, "none", "1f1b", 31});
  check_plan_step({"gpt tp2 dp2 zero3 vocab 31", false, 4, 2, 1, 1, 2, 3, "none", "1f1b", 31});
}
TEST(PartsPlan, ExpertParallelMoe) { check_plan_step({"moe ep2", true, 2, 1, 1, 2, 1, 0}); }
TEST(PartsPlan, ExpertAndTensorParallelMoe) {
  check_plan_step({"moe ep2 tp2", true, 4, 2, 1, 2, 1, 0});
  check_plan_step({"moe ep2 dp2 pp2 zero1 full", true, 8, 1, 2, 2, 2, 1, "full"});
  check_plan_step({"moe ep2 tp2 dp2 zero2", true, 8, 2, 1, 2, 2, 2});
}

}  // namespace
}  // namespace weft::planner
