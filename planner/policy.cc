// Degree resolution, validation with named-field errors, and tensor-parallel propagation.
#include "planner/policy.h"

#include <algorithm>
#include <functional>
#include <map>

#include "base/check.h"
#include "base/error.h"
#include "planner/search.h"

namespace weft::planner {
namespace {

std::string num(int64_t v) { return std::to_string(v); }

// "try tp=2 or tp=4" from the candidates that pass `ok` (at most four, largest kept).
std::string suggest(const std::string& key, int64_t limit, const std::function<bool(int64_t)>& ok) {
  std::vector<int64_t> good;
  for (int64_t d = 1; d <= limit; ++d)
    if (limit % d == 0 && ok(d)) good.push_back(d);
  if (good.size() > 4) good.erase(good.begin(), good.end() - 4);
  if (good.empty()) return "no value of " + key + " fits; change the world size or the model";
  std::string s = "try ";
  for (size_t i = 0; i < good.size(); ++i)
    s += (i ? " or " : "") + key + "=" + num(good[i]);
  return s;
}

bool tp_fits(const core::ModelSpec& m, int64_t tp) {
  if (tp == 1) return true;
  // The vocabulary need not divide: it splits into balanced slices (partition.cc), each
  // lane needing at least one row.
  // Llama splits its KV heads (each lane holds whole query-head groups).
  return m.heads % tp == 0 && m.kv() % tp == 0 && m.dim % tp == 0 && m.mlp_width() % tp == 0 &&
         m.vocab >= tp;
}

std::string tp_reason(const core::ModelSpec& m, int64_t tp) {
  if (m.heads % tp) return "model.heads (" + num(m.heads) + ")";
  if (m.kv() % tp) return "model.kv_heads (" + num(m.kv()) + ")";
  if (m.dim % tp) return "model.dim (" + num(m.dim) + ")";
  if (m.mlp_width() % tp) return "the MLP width (" + num(m.mlp_width()) + ")";
  // Reads "tp=4 must divide model.vocab (3) into slices of at least one row".
  return "model.vocab (" + num(m.vocab) + ") into slices of at least one row";
}

void resolve_degrees(const core::JobSpec& s, int world, Degrees& d) {
  const core::ParallelSpec& p = s.parallel;
  if (world < 1) throw ConfigError("--world", "expected a world size >= 1, got " + num(world));
  int64_t fixed = 1;
  std::vector<int64_t*> autos;
  int64_t* slots[4] = {&d.dp, &d.tp, &d.pp, &d.ep};
  int64_t given[4] = {p.dp, p.tp, p.pp, p.ep};
  for (int i = 0; i < 4; ++i) {
    *slots[i] = given[i];
    if (given[i] == 0) autos.push_back(slots[i]);
    else fixed *= given[i];
  }
  if (world < fixed) {
    // Most often a single process given a multi-rank layout: name the launcher.
    const char* names[4] = {"dp", "tp", "pp", "ep"};
    int i = given[1] > 1 ? 1 : given[2] > 1 ? 2 : given[3] > 1 ? 3 : 0;
    std::string field = names[i];
    throw ConfigError("parallel." + field,
                      field + "=" + num(given[i]) + " needs at least " + num(fixed) +
                          " ranks (dp x tp x pp x ep = " + num(fixed) + ") but the world has " +
                          num(world) + ": launch with weft run --nproc-per-node " + num(fixed) +
                          " (or mpirun -np " + num(fixed) + "), or set " + field +
                          (i == 0 ? ": auto" : "=1"));
  }
  if (world % fixed != 0) {
    int64_t mp = (p.tp ? p.tp : 1) * (p.pp ? p.pp : 1) * (p.ep ? p.ep : 1);
    if (p.dp > 0 && world % mp == 0)
      throw ConfigError("parallel.dp", "dp x tp x pp x ep = " + num(fixed) + " but the world has " +
                                           num(world) + " ranks; try dp=" + num(world / mp) +
                                           " or dp: auto");
    std::string field = p.tp > 1 ? "tp" : p.pp > 1 ? "pp" : "ep";
    int64_t rest = fixed / (field == "tp" ? p.tp : field == "pp" ? p.pp : p.ep);
    int64_t limit = world % rest == 0 ? world / rest : world;
    throw ConfigError("parallel." + field,
                      "the degrees multiply to " + num(fixed) + ", which does not divide the world (" +
                          num(world) + " ranks); " +
                          suggest(field, limit, [&](int64_t v) {
                            return field != "tp" || tp_fits(s.model, v);
                          }));
  }
  int64_t left = world / fixed;
  for (size_t i = 0; i < autos.size(); ++i) *autos[i] = i == 0 ? left : 1;
  if (autos.empty() && left != 1)
    throw ConfigError("parallel.dp", "dp x tp x pp x ep = " + num(fixed) + " but the world has " +
                                         num(world) + " ranks; try dp=" + num(d.dp * left) +
                                         " or dp: auto");
}

void validate_model_fit(const core::JobSpec& s, int world, const Degrees& d) {
  const core::ModelSpec& m = s.model;
  const core::ParallelSpec& p = s.parallel;
  int64_t tp_room = world / (d.pp * d.ep * (p.dp ? d.dp : 1));
  if (!tp_fits(m, d.tp))
    throw ConfigError("parallel.tp", "tp=" + num(d.tp) + " must divide " + tp_reason(m, d.tp) + "; " +
                                         suggest("tp", tp_room, [&](int64_t v) { return tp_fits(m, v); }));
  if (d.ep > 1 && (m.arch != "moe-gpt" || m.moe.experts < 1))
    throw ConfigError("parallel.ep", "expert parallelism needs model.arch: moe-gpt; try ep=1");
  if (d.ep > 1 && m.moe.experts % d.ep != 0) {
    int64_t room = world / (d.pp * d.tp * (p.dp ? d.dp : 1));
    throw ConfigError("parallel.ep", "ep=" + num(d.ep) + " must divide model.moe.experts (" +
                                         num(m.moe.experts) + "); " +
                                         suggest("ep", room, [&](int64_t v) {
                                           return m.moe.experts % v == 0;
                                         }));
  }
  if (d.pp > m.layers)
    throw ConfigError("parallel.pp", "pp=" + num(d.pp) + " exceeds model.layers (" + num(m.layers) +
                                         "): a stage would hold no layer; " +
                                         suggest("pp", world / (d.tp * d.ep), [&](int64_t v) {
                                           return v <= m.layers;
                                         }));
}

void resolve_layout(const core::JobSpec& s, ParallelConfig& pc) {
  const core::PipelineSpec& pl = s.parallel.pipeline;
  const int64_t L = s.model.layers, pp = pc.deg.pp, v = pc.virtual_stages, n = pp * v;
  if (v > 1 && pp == 1)
    throw ConfigError("parallel.pipeline.virtual_stages",
                      "virtual stages need pp > 1; try virtual_stages=1 or raise parallel.pp");
  if (!pl.layout.empty()) {
    pc.layout_given = true;
    if (int64_t(pl.layout.size()) != n)
      throw ConfigError("parallel.pipeline.layout",
                        "has " + num(int64_t(pl.layout.size())) + " stages, expected pp x virtual_stages = " +
                            num(pp) + " x " + num(v) + " = " + num(n));
    std::vector<int> seen(size_t(L), 0);
    int64_t next = 0;
    for (size_t c = 0; c < pl.layout.size(); ++c) {
      if (pl.layout[c].empty())
        throw ConfigError("parallel.pipeline.layout", "stage " + num(int64_t(c)) + " has no layer");
      for (int64_t layer : pl.layout[c]) {
        if (layer < 0 || layer >= L)
          throw ConfigError("parallel.pipeline.layout", "layer " + num(layer) + " does not exist (model.layers = " + num(L) + ")");
        if (seen[size_t(layer)]++)
          throw ConfigError("parallel.pipeline.layout", "layer " + num(layer) + " appears twice");
        if (layer != next)
          throw ConfigError("parallel.pipeline.layout", "expected layer " + num(next) + " next, found " +
                                                            num(layer) + ": stages hold consecutive layers in order");
        ++next;
      }
    }
    if (next != L)
      throw ConfigError("parallel.pipeline.layout", "covers " + num(next) + " of " + num(L) +
                                                        " layers; every layer must be placed once");
    pc.chunks = pl.layout;
    return;
  }
  if (n > L)
    throw ConfigError(v > 1 ? "parallel.pipeline.virtual_stages" : "parallel.pp",
                      "pp x virtual_stages = " + num(n) + " chunks but only " + num(L) + " layers");
  if (v > 1 && L % n != 0)
    throw ConfigError("parallel.pipeline.virtual_stages",
                      "model.layers (" + num(L) + ") must divide into pp x virtual_stages = " + num(n) +
                          " equal chunks; " + suggest("virtual_stages", L / pp, [&](int64_t x) {
                            return x > 1 && L % (pp * x) == 0;
                          }) + ", or give parallel.pipeline.layout");
  // Even split; a remainder goes to the middle stages first (the first and last also
  // hold the embedding and the head), and the printed layout shows it.
  std::vector<int64_t> count(size_t(n), L / n);
  int64_t rem = L % n;
  for (int64_t c = 1; c + 1 < n && rem > 0; ++c, --rem) ++count[size_t(c)];
  for (int64_t c : {int64_t(0), n - 1})
    if (rem > 0) ++count[size_t(c)], --rem;
  int64_t layer = 0;
  for (int64_t c = 0; c < n; ++c) {
    std::vector<int64_t> ls;
    for (int64_t i = 0; i < count[size_t(c)]; ++i) ls.push_back(layer++);
    pc.chunks.push_back(ls);
  }
}

void resolve_batch(const core::JobSpec& s, ParallelConfig& pc) {
  const core::PipelineSpec& pl = s.parallel.pipeline;
  int64_t G = s.train.global_batch, mb = s.train.micro_batch, shards = pc.data_shards();
  int64_t unit = mb * shards;
  if (G % unit != 0) {
    int64_t up = (G / unit + 1) * unit;
    throw ConfigError("train.global_batch",
                      "global_batch (" + num(G) + ") must be a multiple of micro_batch x dp x ep = " +
                          num(mb) + " x " + num(pc.deg.dp) + " x " + num(pc.deg.ep) + " = " + num(unit) +
                          "; try global_batch=" + num(up) + (G >= unit ? " or " + num(G / unit * unit) : ""));
  }
  pc.micro_batches = G / unit;
  if (pl.micro_batches > 0 && pl.micro_batches != pc.micro_batches)
    throw ConfigError("parallel.pipeline.micro_batches",
                      num(pl.micro_batches) + " micro-batches do not give global_batch " + num(G) +
                          " = micro_batch x micro_batches x dp x ep; try micro_batches=" +
                          num(pc.micro_batches) + " or 0 (derived)");
  if (pc.schedule == "interleaved" && pc.virtual_stages > 1 && pc.micro_batches % pc.deg.pp != 0)
    throw ConfigError("parallel.pipeline.micro_batches",
                      "the interleaved schedule needs micro-batches (" + num(pc.micro_batches) +
                          ") divisible by pp (" + num(pc.deg.pp) + "); try global_batch=" +
                          num(unit * ((pc.micro_batches / pc.deg.pp + 1) * pc.deg.pp)));
}

// aux_loss_global needs the expert shares of the whole global batch before the first
// backward, so every stage runs all its forwards first. One stage: that is only an order
// (more activations live at once), chosen here. Several stages: it is GPipe, asked for by name.
void resolve_balance_order(const core::JobSpec& s, ParallelConfig& pc) {
  if (s.model.arch != "moe-gpt" || s.model.moe.balance != "aux_loss_global") return;
  if (pc.deg.pp == 1) {
    pc.schedule = "gpipe";
    return;
  }
  if (pc.schedule != "gpipe" && pc.micro_batches * pc.virtual_stages > 1)
    throw ConfigError("parallel.pipeline.schedule",
                      "model.moe.balance: aux_loss_global needs every micro-batch's forward before "
                      "the first backward (the expert shares of the whole global batch), which " +
                          pc.schedule + " does not do with pp " + num(pc.deg.pp) +
                          "; use schedule: gpipe, or balance: aux_loss | loss_free");
}

// Checked here as well as in the job spec's validation: tp may have been auto there.
void resolve_sequence_parallel(const core::JobSpec& s, ParallelConfig& pc) {
  if (!s.parallel.sequence_parallel) return;
  const int64_t tp = pc.deg.tp, T = s.model.seq_len;
  if (tp == 1)
    throw ConfigError("parallel.sequence_parallel",
                      "sequence parallelism splits the tensor-parallel regions' norms and residual "
                      "adds over the tp ranks, so with tp 1 it does nothing; set parallel.tp to 2 "
                      "or more, or remove parallel.sequence_parallel");
  if (T % tp != 0)
    throw ConfigError(
        "parallel.sequence_parallel",
        "sequence parallelism splits model.seq_len (" + num(T) + ") over tp (" + num(tp) +
            "), which must divide it; " +
            suggest("tp", T, [&](int64_t v) { return v > 1 && tp_fits(s.model, v); }) +
            ", or remove parallel.sequence_parallel");
  pc.sequence_parallel = true;
}

// A job whose searched keys are still auto has not been through fit_layout (which runs the
// plan search): planning it as it stands would silently ignore them.
void refuse_unsearched(const core::JobSpec& s) {
  const core::ParallelSpec& p = s.parallel;
  auto refuse = [](const std::string& field) {
    throw ConfigError(field, "auto is chosen by the plan search, which runs in weft plan and "
                             "weft train (planner::fit_layout); give a value to plan this job "
                             "without it");
  };
  if (p.plan != "manual" && p.plan != "search") refuse("parallel.plan");
  if (p.zero == core::ParallelSpec::kAutoZero) refuse("parallel.zero");
  if (p.recompute == "auto") refuse("parallel.recompute");
  if (p.sequence_parallel_auto) refuse("parallel.sequence_parallel");
  if (p.pipeline.schedule == "auto") refuse("parallel.pipeline.schedule");
  if (p.pipeline.virtual_stages == 0) refuse("parallel.pipeline.virtual_stages");
  if (p.pipeline.layout_auto) refuse("parallel.pipeline.layout");
  if (s.train.micro_batch == 0) refuse("train.micro_batch");
}

}  // namespace

ParallelConfig resolve_parallel(const core::JobSpec& s, int world) {
  const core::ParallelSpec& p = s.parallel;
  refuse_unsearched(s);
  ParallelConfig pc;
  pc.order = parse_order(p.order);
  resolve_degrees(s, world, pc.deg);
  validate_model_fit(s, world, pc.deg);
  if (p.zero < 0 || p.zero > 3)
    throw ConfigError("parallel.zero", "expected 0, 1, 2 or 3, got " + num(p.zero));
  pc.zero = int(p.zero);
  if (p.recompute != "none" && p.recompute != "selective" && p.recompute != "full")
    throw ConfigError("parallel.recompute", "expected none|selective|full, got '" + p.recompute + "'");
  pc.recompute = p.recompute;
  const std::string& sched = p.pipeline.schedule;
  if (sched != "gpipe" && sched != "1f1b" && sched != "interleaved")
    throw ConfigError("parallel.pipeline.schedule", "expected gpipe|1f1b|interleaved, got '" + sched + "'");
  pc.schedule = sched;
  pc.virtual_stages = p.pipeline.virtual_stages < 1 ? 1 : p.pipeline.virtual_stages;
  if (pc.virtual_stages > 1 && sched != "interleaved")
    throw ConfigError("parallel.pipeline.virtual_stages",
                      "virtual stages need parallel.pipeline.schedule: interleaved; try virtual_stages=1");
  pc.global_batch = s.train.global_batch;
  pc.micro_batch = s.train.micro_batch;
  resolve_sequence_parallel(s, pc);
  resolve_layout(s, pc);
  resolve_batch(s, pc);
  resolve_balance_order(s, pc);
  return pc;
}

// ---- tensor-parallel propagation ---------------------------------------------------

namespace {

// How one value is laid over the tp lanes while deciding: replicated, partial, or split
// on a dim (with strided groups).
struct TpLayout {
  char kind = 'R';
  int dim = -1;
  int64_t groups = 1;
};

}  // namespace

std::vector<OpDecision> decide_partitions(const core::Graph& g, const ParallelConfig& pc) {
  const int64_t tp = pc.deg.tp, ep = pc.deg.ep;
  const bool sp = pc.sequence_parallel && tp > 1;
  const int64_t batch_parts = pc.data_shards() * pc.micro_batches;
  std::vector<int> fwd = g.ops_in_phase(core::Phase::kForward);
  std::map<int, std::vector<int>> consumers;
  for (int id : fwd)
    for (int v : g.op(id).inputs) consumers[v].push_back(id);
  std::map<int, TpLayout> lay;
  auto L = [&](int v) { return lay.count(v) ? lay[v] : TpLayout{}; };

  // A column split of a linear needs every consumer to accept its output split on the
  // last dim; attention takes it as (3 h d) by heads, i.e. in 3 strided groups.
  auto column_groups = [&](int out) -> int64_t {
    int64_t groups = 0;
    for (int c : consumers[out]) {
      const std::string& t = g.op(c).type;
      // Llama: rope (of q and k), grouped-query attention (of v) and swiglu (of gate and
      // up) read whole heads or hidden units in one contiguous chunk per lane.
      const bool contiguous = t == "gelu" || t == "cross_entropy" || t == "rope" ||
                              t == "gqa_attention" || t == "swiglu";
      int64_t want = t == "attention" ? 3 : contiguous ? 1 : 0;
      if (want == 0 || (groups && groups != want)) return 0;
      groups = want;
    }
    return groups;
  };

  std::vector<OpDecision> out;
  for (int id : fwd) {
    const core::Op& op = g.op(id);
    OpDecision d;
    d.op = id;
    d.splits.push_back({Axis::kDp, "b", batch_parts, 1});
    const std::string& t = op.type;
    auto add_tp = [&](const std::string& sym, int64_t groups) {
      d.splits.push_back({Axis::kTp, sym, tp, groups});
    };
    if (t == "moe") {
      if (ep > 1) d.splits.push_back({Axis::kEp, "e", ep, 1});
      if (tp > 1) add_tp("f", 1);
      lay[op.outputs[0]] = TpLayout{tp > 1 ? 'V' : 'R'};
    } else if (sp && (t == "layernorm" || t == "rmsnorm" || t == "add")) {
      // Sequence parallelism (Megatron, Korthikanti et al. 2022): the ops between a row-
      // parallel output and the next column-parallel input hold 1/tp of the tokens instead
      // of a replica each. Only the choice is made here: the layout search of lowering turns
      // the row-parallel partial sums into reduce-scatters on t and gathers t back in front
      // of each column split (and the mirror in the backward). Norms normalise over c, so t
      // splits them exactly; their parameter gradients become partial sums over the lanes,
      // which the gradient sync reduces like the router's under tp.
      add_tp("t", 1);
      for (int v : op.outputs) lay[v] = TpLayout{'D', 1, 1};
    } else if (tp > 1 && t == "embedding") {
      add_tp("v", 1);
      lay[op.outputs[0]] = TpLayout{'V'};
    } else if (tp > 1 && (t == "linear" || t == "matmul")) {
      TpLayout x = L(op.inputs[0]);
      int last = int(g.value(op.inputs[0]).shape.size()) - 1;
      if (x.kind == 'D' && x.dim == last && x.groups == 1) {
        add_tp("k", 1);
        lay[op.outputs[0]] = TpLayout{'V'};
      } else if (int64_t gr = x.kind == 'R' || (sp && x.kind == 'D' && x.dim == 1)
                                  ? column_groups(op.outputs[0])
                                  : 0) {
        // (Under sequence parallelism the input is split on t: lowering gathers it.)
        add_tp("n", gr);
        lay[op.outputs[0]] = TpLayout{'D', last, gr};
      }
    } else if (tp > 1 && t == "attention") {
      TpLayout x = L(op.inputs[0]);
      if (x.kind == 'D' && x.groups == 3) {
        add_tp("h", 1);
        lay[op.outputs[0]] = TpLayout{'D', 2, 1};
        lay[op.outputs[1]] = TpLayout{'D', 1, 1};
      }
    } else if (tp > 1 && t == "rope") {
      TpLayout x = L(op.inputs[0]);
      if (x.kind == 'D' && x.dim == 2 && x.groups == 1) {
        add_tp("h", 1);
        lay[op.outputs[0]] = x;
      }
    } else if (tp > 1 && t == "gqa_attention") {
      // q, k and v all split by whole KV-head groups: the lanes split the KV heads g.
      bool split = true;
      for (int v : op.inputs) {
        TpLayout y = L(v);
        split = split && y.kind == 'D' && y.dim == 2 && y.groups == 1;
      }
      if (split) {
        add_tp("g", 1);
        lay[op.outputs[0]] = TpLayout{'D', 2, 1};
        lay[op.outputs[1]] = TpLayout{'D', 1, 1};
      }
    } else if (tp > 1 && (t == "gelu" || t == "add" || t == "swiglu")) {
      TpLayout x = L(op.inputs[0]);
      bool same = x.kind == 'D' && x.groups == 1;
      for (int v : op.inputs) {
        TpLayout y = L(v);
        same = same && y.kind == 'D' && y.dim == x.dim && y.groups == 1;
      }
      if (same) {
        const char* syms[] = {"b", "t", t == "add" ? "c" : "n"};
        add_tp(syms[x.dim], 1);
        lay[op.outputs[0]] = x;
      }
    } else if (tp > 1 && t == "cross_entropy") {
      TpLayout x = L(op.inputs[0]);
      if (x.kind == 'D' && x.dim == 2) add_tp("v", 1);
    }
    out.push_back(d);
  }
  return out;
}

core::JobSpec fit_layout(const core::JobSpec& spec, int world, std::string* changed) {
  if (changed) changed->clear();
  // Searched keys: the search's best layout for this world (under the default cost model, so
  // that every rank and every later world choose alike).
  if (needs_search(spec)) return searched_spec(spec, world);
  try {
    resolve_parallel(spec, world);
    return spec;
  } catch (const ConfigError& e) {
    if (spec.elastic.layout != "auto") {
      const std::string f = e.field();
      if (f == "parallel.dp" || f == "parallel.tp" || f == "parallel.pp" || f == "parallel.ep")
        throw ConfigError(f, std::string(e.what()).substr(f.size() + 2) +
                                 " (or set elastic.layout: auto to fall back to the nearest "
                                 "layout that fits each world)");
      throw;
    }
    // Candidates: every divisor of each fixed degree (auto ones stay auto), the most model
    // parallelism first (tp, then pp, then ep as tie-breaks); dp takes what is left.
    const core::ParallelSpec& p = spec.parallel;
    auto divisors = [](int64_t n) {
      std::vector<int64_t> d;
      for (int64_t i = n; i >= 1; --i)
        if (n % i == 0) d.push_back(i);
      return d;
    };
    struct Choice {
      int64_t tp, pp, ep;
    };
    std::vector<Choice> choices;
    for (int64_t tp : p.tp ? divisors(p.tp) : std::vector<int64_t>{0})
      for (int64_t pp : p.pp ? divisors(p.pp) : std::vector<int64_t>{0})
        for (int64_t ep : p.ep ? divisors(p.ep) : std::vector<int64_t>{0})
          choices.push_back({tp, pp, ep});
    auto size = [](int64_t d) { return d ? d : 1; };
    std::stable_sort(choices.begin(), choices.end(), [&](const Choice& a, const Choice& b) {
      const int64_t ma = size(a.tp) * size(a.pp) * size(a.ep), mb = size(b.tp) * size(b.pp) * size(b.ep);
      if (ma != mb) return ma > mb;
      if (a.tp != b.tp) return a.tp > b.tp;
      return a.pp > b.pp;
    });
    for (const Choice& c : choices) {
      core::JobSpec fit = spec;
      fit.parallel.dp = 0;
      fit.parallel.tp = c.tp;
      fit.parallel.pp = c.pp;
      fit.parallel.ep = c.ep;
      // A pipeline layout written for the asked pp does not fit another one.
      if (c.pp != p.pp) fit.parallel.pipeline = core::PipelineSpec{};
      try {
        try {
          resolve_parallel(fit, world);
        } catch (const ConfigError& e) {
          // Sequence parallelism goes with tensor parallelism: where the fallback lowers tp
          // to 1 (or to a tp that does not divide the sequence), it goes too.
          if (e.field() != "parallel.sequence_parallel") throw;
          fit.parallel.sequence_parallel = false;
          resolve_parallel(fit, world);
        }
      } catch (const ConfigError&) {
        continue;
      }
      if (changed) {
        std::string s;
        auto note = [&](const char* name, int64_t was, int64_t now) {
          if (was == now) return;
          s += (s.empty() ? "" : ", ") + std::string(name) + " " + (was ? num(was) : "auto") +
               " -> " + (now ? num(now) : "auto");
        };
        note("dp", p.dp, 0);
        note("tp", p.tp, c.tp);
        note("pp", p.pp, c.pp);
        note("ep", p.ep, c.ep);
        if (p.sequence_parallel && !fit.parallel.sequence_parallel)
          s += std::string(s.empty() ? "" : ", ") + "sequence_parallel off";
        *changed = s;
      }
      return fit;
    }
    throw;
  }
}

}  // namespace weft::planner
