// JSON writer and reader for plans (the reader uses core/io's small JSON parser).
#include "planner/plan_json.h"

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "base/error.h"
#include "core/io/json.h"

namespace weft::planner {
namespace {

using core::io::JsonValue;
using core::io::json_number;
using core::io::json_quote;

// ---- writing --------------------------------------------------------------------------

// [[x,y],...]: a calibrated curve of the cost model.
std::string json_pairs(const std::vector<std::pair<double, double>>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i)
    out += (i ? ",[" : "[") + json_number(v[i].first) + "," + json_number(v[i].second) + "]";
  return out + "]";
}

struct W {
  std::string s;
  void raw(const std::string& x) { s += x; }
  void key(const char* k) {
    if (!s.empty() && s.back() != '{' && s.back() != '[') s += ',';
    s += '"';
    s += k;
    s += "\":";
  }
  void sep() {
    if (!s.empty() && s.back() != '{' && s.back() != '[') s += ',';
  }
  void i(const char* k, int64_t v) { key(k), s += std::to_string(v); }
  void d(const char* k, double v) { key(k), s += json_number(v); }
  void b(const char* k, bool v) { key(k), s += v ? "true" : "false"; }
  void str(const char* k, const std::string& v) { key(k), s += json_quote(v); }
};

std::string hex(uint64_t v) {
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, v);
  return buf;
}

const char* kind_names[] = {"load", "compute", "local", "send", "recv", "collective", "free"};
const char* stage_names[] = {"forward", "backward", "step"};
const char* coll_names[] = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "all_to_all_v"};

void write_tensor(W& w, const TensorDesc& t) {
  w.sep();
  w.raw("{");
  if (t.value >= 0) w.i("v", t.value);
  if (!t.name.empty()) w.str("name", t.name);
  w.key("box");
  w.raw("[");
  for (size_t d = 0; d < t.piece.box.size(); ++d) {
    const DimSlice& x = t.piece.box[d];
    w.raw((d ? ",[" : "[") + std::to_string(x.start) + "," + std::to_string(x.size) + "," +
          std::to_string(x.count) + "," + std::to_string(x.stride) + "]");
  }
  w.raw("]");
  if (t.piece.parts > 1) w.key("part"), w.raw("[" + std::to_string(t.piece.part) + "," + std::to_string(t.piece.parts) + "]");
  if (t.piece.reduce == ReduceOp::kMax) w.str("reduce", "max");
  w.str("dt", core::dtype_name(t.dtype));
  w.i("bytes", t.bytes);
  if (t.persistent) w.b("persistent", true);
  if (t.keep) w.b("keep", true);
  if (t.data_dependent) w.b("data_dependent", true);
  if (t.alias_of >= 0) w.i("alias_of", t.alias_of);
  if (t.shift_dim >= 0 || t.shift_part)
    w.key("shift"), w.raw("[" + std::to_string(t.shift_dim) + "," + std::to_string(t.shift) + "," +
                          std::to_string(t.shift_part) + "]");
  if (t.shift_limit > 0) w.i("shift_limit", t.shift_limit);
  w.raw("}");
}

void write_operands(W& w, const char* k, const OperandList& ops) {
  w.key(k);
  w.raw("[");
  for (size_t i = 0; i < ops.size(); ++i)
    w.raw((i ? ",[" : "[") + std::to_string(ops[i].slot) + "," + std::to_string(ops[i].tensor) +
          (ops[i].accumulate ? ",1]" : "]"));
  w.raw("]");
}

void write_instr(W& w, const Instr& in) {
  w.sep();
  w.raw("{");
  w.str("k", kind_names[int(in.kind)]);
  w.str("s", stage_names[int(in.stage)]);
  if (in.op >= 0) w.i("op", in.op);
  if (!in.part.empty()) w.str("part", in.part);
  if (in.mb >= 0) w.i("mb", in.mb);
  if (in.chunk >= 0) w.i("chunk", in.chunk);
  if (in.recompute) w.b("recompute", true);
  if (in.data_dependent) w.b("data_dependent", true);
  if (!in.in.empty()) write_operands(w, "in", in.in);
  if (!in.out.empty()) write_operands(w, "out", in.out);
  if (in.kind == InstrKind::kCollective) {
    w.str("coll", coll_names[int(in.coll)]);
    if (in.reduce == ReduceOp::kMax) w.str("reduce", "max");
    w.i("group", in.group);
  }
  if (in.peer >= 0) w.i("peer", in.peer);
  if (in.tag >= 0) w.i("tag", in.tag);
  if (in.bytes) w.i("bytes", in.bytes);
  if (in.dim >= 0) w.i("dim", in.dim);
  if (in.dim2 >= 0) w.i("dim2", in.dim2);
  if (in.groups != 1) w.i("groups", in.groups);
  w.raw("}");
}

void write_costs(W& w, const CostAnnotations& c) {
  w.key("costs");
  w.raw("{");
  w.b("valid", c.valid);
  w.key("model");
  w.raw("{");
  w.d("flops", c.model.flops), w.d("mem_bw", c.model.mem_bw), w.d("launch", c.model.launch);
  w.d("alpha_intra", c.model.alpha_intra);
  w.d("bw_intra", c.model.bw_intra), w.d("alpha_inter", c.model.alpha_inter), w.d("bw_inter", c.model.bw_inter);
  w.i("ranks_per_node", c.model.ranks_per_node), w.i("device_memory", c.model.device_memory);
  w.i("cores", c.model.cores), w.d("op_overhead", c.model.op_overhead);
  w.d("launch_oversub", c.model.launch_oversub);
  // The calibrated rates by op size: a plan re-read for `weft plan --out` / simulation must
  // cost compute as the plan that wrote it did.
  w.key("flops_by_size");
  w.raw(json_pairs(c.model.flops_by_size));
  // The calibrated collective rates, likewise; only when measured, so that a plan under a
  // model without them is written as before.
  bool any_op = false;
  for (double r : c.model.op_rates) any_op = any_op || r > 0;
  if (any_op) {
    w.key("op_rates");
    w.raw("[");
    for (size_t i = 0; i < c.model.op_rates.size(); ++i) w.raw((i ? "," : "") + json_number(c.model.op_rates[i]));
    w.raw("]");
  }
  bool any_coll = false;
  for (const auto& cb : c.model.coll_bw_by_size) any_coll = any_coll || !cb.empty();
  if (any_coll) {
    w.key("coll_bw_by_size");
    w.raw("[");
    for (size_t k = 0; k < c.model.coll_bw_by_size.size(); ++k) {
      w.raw((k ? "," : "") + json_pairs(c.model.coll_bw_by_size[k]));
    }
    w.raw("]");
  }
  bool any_rate_curve = false;
  for (const auto& rc : c.model.op_rates_by_size) any_rate_curve = any_rate_curve || !rc.empty();
  if (any_rate_curve) {  // likewise: one list per rated type, in kRatedOpTypes' order
    w.key("op_rates_by_size");
    w.raw("[");
    for (size_t k = 0; k < c.model.op_rates_by_size.size(); ++k)
      w.raw((k ? "," : "") + json_pairs(c.model.op_rates_by_size[k]));
    w.raw("]");
  }
  if (!c.model.sync_wait_by_burst.empty()) {  // likewise
    w.key("sync_wait_by_burst");
    w.raw(json_pairs(c.model.sync_wait_by_burst));
  }
  if (!c.model.sync_wait_oversub_by_burst.empty()) {  // likewise
    w.key("sync_wait_oversub_by_burst");
    w.raw(json_pairs(c.model.sync_wait_oversub_by_burst));
  }
  if (c.model.sync_wait_oversub_ranks > 0) w.i("sync_wait_oversub_ranks", c.model.sync_wait_oversub_ranks);
  if (!c.model.sync_wait_oversub_more_by_burst.empty()) {  // likewise
    w.key("sync_wait_oversub_more_by_burst");
    w.raw(json_pairs(c.model.sync_wait_oversub_more_by_burst));
    w.i("sync_wait_oversub_more_ranks", c.model.sync_wait_oversub_more_ranks);
  }
  w.raw("}");
  w.d("step_s", c.step_s), w.d("bubble", c.bubble), w.d("pipeline_estimate_s", c.pipeline_estimate_s);
  w.d("planning_s", c.planning_s);
  w.key("stage_s");
  w.raw("[");
  for (size_t i = 0; i < c.stage_s.size(); ++i) w.raw((i ? "," : "") + json_number(c.stage_s[i]));
  w.raw("]");
  w.key("ranks");
  w.raw("[");
  for (const RankCost& r : c.ranks) {
    w.sep();
    w.raw("{");
    w.d("step_s", r.step_s), w.d("compute_s", r.compute_s), w.d("comm_s", r.comm_s), w.d("wait_s", r.wait_s);
    w.d("bubble", r.bubble);
    w.i("peak_bytes", r.peak_bytes), w.i("persistent_bytes", r.persistent_bytes), w.i("p2p_bytes", r.p2p_bytes);
    w.key("comm_bytes");
    w.raw("[");
    for (int k = 0; k < kCollKinds; ++k) w.raw((k ? "," : "") + std::to_string(r.comm_bytes[k]));
    w.raw("]}");
  }
  w.raw("]}");
}

// ---- reading --------------------------------------------------------------------------

[[noreturn]] void bad(const std::string& what) { throw IoError("plan JSON: " + what); }

const JsonValue& at(const JsonValue& o, const char* k) {
  const JsonValue* v = o.find(k);
  if (!v) bad(std::string("missing \"") + k + "\"");
  return *v;
}
int64_t num(const JsonValue& v) {
  int64_t x;
  if (!v.as_int64(x)) bad("expected an integer, got '" + v.text + "'");
  return x;
}
int64_t num_or(const JsonValue& o, const char* k, int64_t fallback) {
  const JsonValue* v = o.find(k);
  return v ? num(*v) : fallback;
}
bool flag(const JsonValue& o, const char* k) {
  const JsonValue* v = o.find(k);
  return v && v->kind == JsonValue::Kind::kBool && v->boolean;
}
std::string text_or(const JsonValue& o, const char* k, const std::string& fallback = "") {
  const JsonValue* v = o.find(k);
  return v ? v->text : fallback;
}
template <size_t N>
int index_of(const char* (&names)[N], const std::string& s) {
  for (size_t i = 0; i < N; ++i)
    if (s == names[i]) return int(i);
  bad("unknown name '" + s + "'");
}

OperandList read_operands(const JsonValue* v) {
  OperandList ops;
  if (!v) return ops;
  ops.reserve(v->items.size());
  for (const JsonValue& o : v->items) {
    const double slot = num(o.items.at(0));
    // Operand::slot is 16 bits (operands.h): an op's input or output index, or -1.
    if (slot < -1 || slot > 32767) bad("operand slot " + std::to_string(int64_t(slot)) + " outside -1..32767");
    ops.push_back({int(slot), int(num(o.items.at(1))), o.items.size() > 2 && num(o.items[2]) != 0});
  }
  return ops;
}

TensorDesc read_tensor(const JsonValue& o) {
  TensorDesc t;
  t.value = int(num_or(o, "v", -1));
  t.name = text_or(o, "name");
  for (const JsonValue& d : at(o, "box").items)
    t.piece.box.push_back({num(d.items.at(0)), num(d.items.at(1)), num(d.items.at(2)), num(d.items.at(3))});
  if (const JsonValue* p = o.find("part")) t.piece.part = int32_t(num(p->items.at(0))), t.piece.parts = int32_t(num(p->items.at(1)));
  if (text_or(o, "reduce") == "max") t.piece.reduce = ReduceOp::kMax;
  t.dtype = core::parse_dtype(at(o, "dt").text, "plan tensor dtype");
  t.bytes = num(at(o, "bytes"));
  t.persistent = flag(o, "persistent");
  t.keep = flag(o, "keep");
  t.data_dependent = flag(o, "data_dependent");
  t.alias_of = int(num_or(o, "alias_of", -1));
  if (const JsonValue* s = o.find("shift"))
    t.shift_dim = int(num(s->items.at(0))), t.shift = num(s->items.at(1)), t.shift_part = int32_t(num(s->items.at(2)));
  t.shift_limit = num_or(o, "shift_limit", 0);
  return t;
}

Instr read_instr(const JsonValue& o) {
  Instr in;
  in.kind = InstrKind(index_of(kind_names, at(o, "k").text));
  in.stage = Stage(index_of(stage_names, at(o, "s").text));
  in.op = int(num_or(o, "op", -1));
  in.part = text_or(o, "part");
  in.mb = int(num_or(o, "mb", -1));
  in.chunk = int(num_or(o, "chunk", -1));
  in.recompute = flag(o, "recompute");
  in.data_dependent = flag(o, "data_dependent");
  in.in = read_operands(o.find("in"));
  in.out = read_operands(o.find("out"));
  if (in.kind == InstrKind::kCollective) {
    in.coll = CollKind(index_of(coll_names, at(o, "coll").text));
    in.reduce = text_or(o, "reduce") == "max" ? ReduceOp::kMax : ReduceOp::kSum;
    in.group = int(num(at(o, "group")));
  }
  in.peer = int(num_or(o, "peer", -1));
  in.tag = num_or(o, "tag", -1);
  in.bytes = num_or(o, "bytes", 0);
  in.dim = int(num_or(o, "dim", -1));
  in.dim2 = int(num_or(o, "dim2", -1));
  in.groups = num_or(o, "groups", 1);
  return in;
}

double dbl(const JsonValue& o, const char* k) { return at(o, k).number; }

}  // namespace

std::string plan_to_json(const Plan& p) {
  W w;
  w.s.reserve(1 << 20);
  w.raw("{");
  w.str("format", "weft-plan/1");
  w.key("hash");
  w.raw("{");
  w.str("model", hex(p.model_hash));
  w.str("shapes", hex(p.shape_hash));
  w.raw("}");
  w.key("decisions");
  w.raw("{");
  const ParallelConfig& c = p.config;
  w.key("mesh");
  w.raw("{");
  w.i("dp", c.deg.dp), w.i("tp", c.deg.tp), w.i("pp", c.deg.pp), w.i("ep", c.deg.ep);
  w.str("order", p.mesh.order_string());
  w.raw("}");
  w.i("global_batch", c.global_batch), w.i("micro_batch", c.micro_batch), w.i("micro_batches", c.micro_batches);
  w.str("schedule", c.schedule), w.i("virtual_stages", c.virtual_stages);
  w.str("recompute", c.recompute), w.i("zero", c.zero), w.b("layout_given", c.layout_given);
  w.b("sequence_parallel", c.sequence_parallel);
  w.i("bucket_bytes", c.bucket_bytes);
  w.key("layout");
  w.raw("[");
  for (size_t k = 0; k < c.chunks.size(); ++k) {
    w.raw(k ? ",[" : "[");
    for (size_t j = 0; j < c.chunks[k].size(); ++j) w.raw((j ? "," : "") + std::to_string(c.chunks[k][j]));
    w.raw("]");
  }
  w.raw("]");
  w.key("partitions");
  w.raw("[");
  for (const OpDecision& d : p.decisions) {
    w.sep();
    w.raw("{");
    w.i("op", d.op);
    w.key("splits");
    w.raw("[");
    for (size_t i = 0; i < d.splits.size(); ++i) {
      const AxisSplit& s = d.splits[i];
      w.raw(std::string(i ? "," : "") + "[" + json_quote(axis_name(s.axis)) + "," + json_quote(s.symbol) + "," +
            std::to_string(s.n) + "," + std::to_string(s.groups) + "]");
    }
    w.raw("]}");
  }
  w.raw("]");
  w.key("families");
  w.raw("[");
  for (const GroupFamily& f : p.families) {
    w.sep();
    w.raw("{");
    w.key("members");
    w.raw("[");
    for (size_t i = 0; i < f.members.size(); ++i)
      w.raw((i ? ",[" : "[") + std::to_string(f.members[i].first) + "," + std::to_string(f.members[i].second) + "]");
    w.raw("]");
    w.b("all_dp", f.all_dp);
    w.raw("}");
  }
  w.raw("]");
  w.key("groups");
  w.raw("[");
  for (const ProcessGroup& g : p.groups) {
    w.sep();
    w.raw("{");
    w.i("id", g.id), w.i("family", g.family);
    w.key("ranks");
    w.raw("[");
    for (size_t i = 0; i < g.ranks.size(); ++i) w.raw((i ? "," : "") + std::to_string(g.ranks[i]));
    w.raw("]}");
  }
  w.raw("]");
  w.key("roles");
  w.raw("[");
  for (const Role& r : p.roles) {
    w.sep();
    w.raw("{");
    w.i("stage", r.stage), w.i("lane", r.lane);
    w.key("tensors");
    w.raw("[");
    for (const TensorDesc& t : r.tensors) write_tensor(w, t);
    w.raw("]");
    w.key("program");
    w.raw("[");
    for (const Instr& in : r.program) write_instr(w, in);
    w.raw("]}");
  }
  w.raw("]}");
  write_costs(w, p.costs);
  w.raw("}");
  return std::move(w.s);
}

Plan plan_from_json(const std::string& text) {
  JsonValue root = core::io::parse_json(text, "plan");
  if (text_or(root, "format") != "weft-plan/1") bad("not a weft-plan/1 document");
  Plan p;
  const JsonValue& h = at(root, "hash");
  p.model_hash = std::stoull(at(h, "model").text, nullptr, 16);
  p.shape_hash = std::stoull(at(h, "shapes").text, nullptr, 16);
  const JsonValue& d = at(root, "decisions");
  const JsonValue& m = at(d, "mesh");
  ParallelConfig& c = p.config;
  c.deg = Degrees{num(at(m, "dp")), num(at(m, "tp")), num(at(m, "pp")), num(at(m, "ep"))};
  c.order = parse_order(at(m, "order").text);
  p.mesh = Mesh(c.deg, c.order);
  c.global_batch = num(at(d, "global_batch"));
  c.micro_batch = num(at(d, "micro_batch"));
  c.micro_batches = num(at(d, "micro_batches"));
  c.schedule = at(d, "schedule").text;
  c.virtual_stages = num(at(d, "virtual_stages"));
  c.recompute = at(d, "recompute").text;
  c.zero = int(num(at(d, "zero")));
  c.layout_given = flag(d, "layout_given");
  c.sequence_parallel = flag(d, "sequence_parallel");
  c.bucket_bytes = num(at(d, "bucket_bytes"));
  for (const JsonValue& k : at(d, "layout").items) {
    std::vector<int64_t> layers;
    for (const JsonValue& l : k.items) layers.push_back(num(l));
    c.chunks.push_back(layers);
  }
  static const char* axes[] = {"tp", "ep", "dp", "pp"};
  for (const JsonValue& o : at(d, "partitions").items) {
    OpDecision dec;
    dec.op = int(num(at(o, "op")));
    for (const JsonValue& s : at(o, "splits").items)
      dec.splits.push_back({Axis(index_of(axes, s.items.at(0).text)), s.items.at(1).text, num(s.items.at(2)),
                            num(s.items.at(3))});
    p.decisions.push_back(dec);
  }
  for (const JsonValue& o : at(d, "families").items) {
    GroupFamily f;
    for (const JsonValue& mm : at(o, "members").items)
      f.members.push_back({int(num(mm.items.at(0))), int(num(mm.items.at(1)))});
    f.all_dp = flag(o, "all_dp");
    p.families.push_back(f);
  }
  build_groups(p);
  const JsonValue& groups = at(d, "groups");
  if (groups.items.size() != p.groups.size()) bad("group table does not match the families");
  for (size_t i = 0; i < p.groups.size(); ++i) {
    std::vector<int> ranks;
    for (const JsonValue& r : at(groups.items[i], "ranks").items) ranks.push_back(int(num(r)));
    if (ranks != p.groups[i].ranks) bad("group " + std::to_string(i) + " does not match its family");
  }
  for (const JsonValue& o : at(d, "roles").items) {
    Role r;
    r.stage = int(num(at(o, "stage")));
    r.lane = int(num(at(o, "lane")));
    for (const JsonValue& t : at(o, "tensors").items) r.tensors.push_back(read_tensor(t));
    for (const JsonValue& in : at(o, "program").items) r.program.push_back(read_instr(in));
    p.roles.push_back(std::move(r));
  }
  if (const JsonValue* co = root.find("costs")) {
    CostAnnotations& k = p.costs;
    k.valid = flag(*co, "valid");
    const JsonValue& cm = at(*co, "model");
    k.model.flops = dbl(cm, "flops"), k.model.mem_bw = dbl(cm, "mem_bw"), k.model.launch = dbl(cm, "launch");
    k.model.alpha_intra = dbl(cm, "alpha_intra"), k.model.bw_intra = dbl(cm, "bw_intra");
    k.model.alpha_inter = dbl(cm, "alpha_inter"), k.model.bw_inter = dbl(cm, "bw_inter");
    k.model.ranks_per_node = int(num(at(cm, "ranks_per_node")));
    k.model.device_memory = num(at(cm, "device_memory"));
    // Absent in plans written before the CPU-host fields: their defaults.
    if (const JsonValue* v = cm.find("cores")) k.model.cores = int(v->number);
    if (const JsonValue* v = cm.find("op_overhead")) k.model.op_overhead = v->number;
    if (const JsonValue* v = cm.find("launch_oversub")) k.model.launch_oversub = v->number;
    // A list of [x, y] points (a curve); `form` names the pair for the error.
    using Curve = std::vector<std::pair<double, double>>;
    auto curve = [&](const JsonValue& list, const std::string& name, const char* form, Curve& out) {
      for (const JsonValue& pt : list.items) {
        if (pt.items.size() != 2) bad("costs.model." + name + ": each entry is " + form);
        out.push_back({pt.items[0].number, pt.items[1].number});
      }
    };
    if (const JsonValue* v = cm.find("flops_by_size"))  // absent before calibrated rates
      curve(*v, "flops_by_size", "[flop, flop/s]", k.model.flops_by_size);
    if (const JsonValue* v = cm.find("op_rates")) {  // only in calibrated plans
      // New rated types are appended (kRatedOpTypes), so a plan written before some were has
      // fewer: the rest stay unrated (0: priced as before), as in a hardware file without them.
      if (v->items.size() > k.model.op_rates.size())
        bad("costs.model.op_rates: at most one rate per rated op type (" +
            std::to_string(k.model.op_rates.size()) + "), got " + std::to_string(v->items.size()));
      for (size_t i = 0; i < v->items.size(); ++i) k.model.op_rates[i] = v->items[i].number;
    }
    if (const JsonValue* v = cm.find("coll_bw_by_size")) {  // only in calibrated plans
      if (v->items.size() != k.model.coll_bw_by_size.size())
        bad("costs.model.coll_bw_by_size: one list per collective kind");
      for (size_t kind = 0; kind < v->items.size(); ++kind)
        curve(v->items[kind], "coll_bw_by_size", "[bytes, bytes/s]", k.model.coll_bw_by_size[kind]);
    }
    if (const JsonValue* v = cm.find("op_rates_by_size")) {  // only in calibrated plans
      if (v->items.size() > k.model.op_rates_by_size.size())
        bad("costs.model.op_rates_by_size: at most one list per rated op type (" +
            std::to_string(k.model.op_rates_by_size.size()) + "), got " + std::to_string(v->items.size()));
      for (size_t type = 0; type < v->items.size(); ++type)
        curve(v->items[type], "op_rates_by_size", "[flop, flop/s]", k.model.op_rates_by_size[type]);
    }
    // The wait curves, only in calibrated plans.
    for (auto& [name, out] : {std::pair<const char*, Curve*>{"sync_wait_by_burst", &k.model.sync_wait_by_burst},
                              {"sync_wait_oversub_by_burst", &k.model.sync_wait_oversub_by_burst},
                              {"sync_wait_oversub_more_by_burst", &k.model.sync_wait_oversub_more_by_burst}})
      if (const JsonValue* v = cm.find(name)) curve(*v, name, "[burst s, wait s]", *out);
    if (const JsonValue* v = cm.find("sync_wait_oversub_ranks")) {  // only in calibrated plans
      if (!(v->number >= 2 && v->number == std::floor(v->number) && v->number <= double(1 << 30)))
        bad("costs.model.sync_wait_oversub_ranks: expected a whole number of ranks >= 2, got " +
            json_number(v->number));
      k.model.sync_wait_oversub_ranks = int(v->number);
    }
    if (const JsonValue* v = cm.find("sync_wait_oversub_more_ranks")) {  // only in calibrated plans
      if (!(v->number >= 2 && v->number == std::floor(v->number) && v->number <= double(1 << 30)))
        bad("costs.model.sync_wait_oversub_more_ranks: expected a whole number of ranks >= 2, got " +
            json_number(v->number));
      k.model.sync_wait_oversub_more_ranks = int(v->number);
    }
    k.step_s = dbl(*co, "step_s"), k.bubble = dbl(*co, "bubble");
    k.pipeline_estimate_s = dbl(*co, "pipeline_estimate_s"), k.planning_s = dbl(*co, "planning_s");
    for (const JsonValue& x : at(*co, "stage_s").items) k.stage_s.push_back(x.number);
    for (const JsonValue& r : at(*co, "ranks").items) {
      RankCost rc;
      rc.step_s = dbl(r, "step_s"), rc.compute_s = dbl(r, "compute_s"), rc.comm_s = dbl(r, "comm_s");
      rc.wait_s = dbl(r, "wait_s");
      rc.bubble = dbl(r, "bubble");
      rc.peak_bytes = num(at(r, "peak_bytes")), rc.persistent_bytes = num(at(r, "persistent_bytes"));
      rc.p2p_bytes = num(at(r, "p2p_bytes"));
      const JsonValue& cb = at(r, "comm_bytes");
      for (int i = 0; i < kCollKinds && i < int(cb.items.size()); ++i) rc.comm_bytes[i] = num(cb.items[size_t(i)]);
      k.ranks.push_back(rc);
    }
  }
  return p;
}

void write_plan_file(const Plan& plan, const std::string& path) {
  std::ofstream f(path, std::ios::binary);
  if (!f) throw IoError("cannot write plan file " + path);
  f << plan_to_json(plan);
  if (!f) throw IoError("error writing plan file " + path);
}

Plan read_plan_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw IoError("cannot read plan file " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  return plan_from_json(ss.str());
}

}  // namespace weft::planner
