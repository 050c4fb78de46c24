// Stage lowering: sub-ops per lane, operand provision (loads, local cuts, RVD conversions),
// units in schedule order with their pipeline transfers and recomputation.
#include "planner/lower_stage.h"

#include <algorithm>
#include <utility>

#include "base/check.h"
#include "base/error.h"

namespace weft::planner {

StageBuilder::StageBuilder(const GraphInfo& gi, Plan& plan, const CostModel& cost,
                           RvdCache& layouts, int stage)
    : gi_(gi),
      g_(gi.g),
      plan_(plan),
      cost_(cost),
      layouts_(layouts),
      stage_(stage),
      lanes_(plan.mesh.lanes()),
      tp_(int(plan.mesh.degrees().tp)),
      ep_(int(plan.mesh.degrees().ep)),
      m_(gi.pc.micro_batches),
      K_(gi.pc.data_shards() * gi.pc.micro_batches) {
  int node = plan.mesh.rank_of(stage, 0, 0) / cost.ranks_per_node;
  for (int l = 1; l < lanes_; ++l)
    if (plan.mesh.rank_of(stage, l, 0) / cost.ranks_per_node != node) cross_node_ = true;
  const ParallelConfig& pc = gi.pc;
  units_ = stage_schedule(pc.schedule, int(pc.deg.pp), int(pc.virtual_stages), int(pc.micro_batches),
                          stage);
}

Role& StageBuilder::role(int lane) { return plan_.roles.at(size_t(stage_ * lanes_ + lane)); }

int StageBuilder::add_tensor(int lane, TensorDesc t) {
  Role& r = role(lane);
  r.tensors.push_back(std::move(t));
  return int(r.tensors.size()) - 1;
}

void StageBuilder::emit(int lane, Instr in, const Ctx& ctx) {
  in.stage = ctx.stage;
  in.mb = ctx.mb;
  in.chunk = ctx.chunk;
  in.recompute = in.recompute || ctx.recompute;
  role(lane).program.push_back(std::move(in));
}

TensorDesc StageBuilder::value_tensor(int value, const Piece& p) const {
  const core::Value& v = g_.value(value);
  TensorDesc t;
  t.value = value;
  t.piece = p;
  t.dtype = v.dtype;
  t.bytes = p.numel() * int64_t(core::dtype_size(v.dtype));
  t.persistent = v.persistent;
  return t;
}

TensorDesc StageBuilder::scratch_tensor(const std::string& name, const Piece& p, core::DType dt) const {
  TensorDesc t;
  t.name = name;
  t.piece = p;
  t.dtype = dt;
  t.bytes = p.numel() * int64_t(core::dtype_size(dt));
  return t;
}

int64_t StageBuilder::slice_shift(int value, int dim) const {
  return int64_t(ep_) * m_ * (g_.value(value).shape.at(size_t(dim)) / K_);
}

void StageBuilder::shift_like(TensorDesc& t, int value, const SubTensor* st) const {
  if (st && st->batch_dim >= 0) {
    t.shift_dim = st->batch_dim;
    t.shift = slice_shift(value, st->batch_dim);
  } else if (st && g_.value(value).role == core::Role::kInput) {
    t.shift_dim = 0;
    t.shift = slice_shift(value, 0);
  } else if (st && !g_.value(value).persistent && t.piece.parts % K_ == 0 && K_ > 1) {
    t.shift_part = int32_t(int64_t(ep_) * m_ * (t.piece.parts / K_));  // a partial sum over the batch
  }
}

SubOp StageBuilder::sub_op(int op, int mb, int lane) const {
  SubOp s = sub_op_mb0(op, lane);
  shift_by_mbs(s, mb);
  return s;
}

const SubOp& StageBuilder::sub_op_mb0(int op, int lane) const {
  // Micro-batches differ only in their batch rows (or, for a loss, the addend index), so
  // the partition runs once per (op, lane) and is shifted per micro-batch.
  std::optional<SubOp>& cached = sub_cache_[size_t(op) * size_t(lanes_) + size_t(lane)];
  if (!cached) {
    SubOp s = whole_op(g_, op);
    int d = gi_.decision[size_t(op)];
    if (d >= 0) {
      int tp_i = plan_.mesh.lane_tp(lane), ep_i = plan_.mesh.lane_ep(lane);
      for (const AxisSplit& sp : plan_.decisions[size_t(d)].splits) {
        int64_t index = sp.axis == Axis::kDp ? int64_t(ep_i) * m_ : sp.axis == Axis::kEp ? ep_i : tp_i;
        s = partition_one(g_, s, sp.symbol, sp.n, index, sp.groups);
      }
    }
    s.splits.clear();
    cached = std::move(s);
  }
  return *cached;
}

void StageBuilder::shift_by_mbs(SubOp& s, int delta) const {
  if (delta == 0) return;
  // Additive, so shifting a sub-op already at micro-batch a by b - a gives micro-batch b's.
  auto shift = [&](SubTensor& t) {
    if (t.batch_dim >= 0)
      t.piece.box[size_t(t.batch_dim)].start += delta * t.piece.box[size_t(t.batch_dim)].size;
    else if (t.batch_partial)
      t.piece.part += int32_t(delta * (t.piece.parts / K_));
  };
  for (SubTensor& t : s.ins) shift(t);
  for (SubTensor& t : s.outs) shift(t);
}

const std::vector<SubOp>& StageBuilder::sub_ops(int op, int mb) {
  std::vector<SubOp>& subs = shifted_[size_t(op)];
  int& at = shifted_mb_[size_t(op)];
  if (subs.empty()) {
    subs.reserve(size_t(lanes_));
    for (int l = 0; l < lanes_; ++l) subs.push_back(sub_op_mb0(op, l));
    at = 0;
  }
  for (SubOp& s : subs) shift_by_mbs(s, mb - at);
  at = mb;
  return subs;
}

int StageBuilder::value_mb(int value, int mb) const { return g_.value(value).persistent ? -1 : mb; }

StageBuilder::TensorIds* StageBuilder::env_find(int lane, int value, int mb) {
  const auto& by_mb = lane_[size_t(lane)].env[size_t(value)];
  if (by_mb.empty()) return nullptr;
  auto& have = lane_[size_t(lane)].env[size_t(value)][size_t(mb + 1)];
  return have.empty() ? nullptr : &have;
}

StageBuilder::TensorIds& StageBuilder::env_slot(int lane, int value, int mb) {
  auto& by_mb = lane_[size_t(lane)].env[size_t(value)];
  if (by_mb.empty()) by_mb.resize(size_t(m_) + 1);
  WEFT_CHECK(mb >= -1 && mb < m_, "micro-batch ", mb, " outside 0..", m_ - 1);
  return by_mb[size_t(mb + 1)];
}

void StageBuilder::env_add(int lane, int value, int mb, int tensor) {
  env_slot(lane, value, mb).push_back(tensor);
}

int StageBuilder::team_family(const std::vector<int>& lanes) {
  GroupFamily f;
  for (int l : lanes) f.members.push_back({stage_, l});
  return add_family(plan_, f);
}

Instr StageBuilder::collective(CollKind k, int family, int in, int out, int64_t bytes, const Ctx&,
                               int op, const std::string& part, int) {
  Instr c;
  c.kind = InstrKind::kCollective;
  c.coll = k;
  c.group = family;
  c.op = op;
  c.part = part;
  c.bytes = bytes;
  c.in = {{-1, in}};
  c.out = {{-1, out}};
  return c;
}

int StageBuilder::cut(int lane, int from, const Piece& need, const Ctx& ctx, int op) {
  TensorDesc t = role(lane).tensors.at(size_t(from));
  const int value = t.value;
  t.piece = need;
  t.persistent = false;
  t.alias_of = -1;
  t.keep = false;
  const int id = local_cut(lane, from, std::move(t), ctx, op);
  if (value >= 0 && !g_.value(value).persistent) env_add(lane, value, ctx.mb, id);
  return id;
}

std::vector<int> StageBuilder::convert(int value, int mb, const std::vector<int>& lanes,
                                       const std::vector<std::optional<Piece>>& need, const Ctx& ctx,
                                       int op) {
  std::vector<int> cur;
  GroupLayout from;
  for (int l : lanes) {
    TensorIds* have = env_find(l, value, mb);
    if (!have)
      throw NotSupported("value " + g_.value(value).name + " is needed on lane " + std::to_string(l) +
                         " of stage " + std::to_string(stage_) + " but produced on no lane there");
    cur.push_back(have->front());
    from.push_back(role(l).tensors[size_t(have->front())].piece);
  }
  // The conversion happens within the slice the pieces cover.
  Box whole = from[0].box;
  for (const Piece& p : from) cover(whole, p.box);
  for (const auto& p : need)
    if (p) cover(whole, p->box);
  const core::Value& val = g_.value(value);
  RvdPath path = rvd_search(from, need, whole, int64_t(core::dtype_size(val.dtype)), cost_,
                            cross_node_, &layouts_, 1, -1, plan_.world());
  // Collectives are attributed to the op whose output they re-lay (its layer, its unit).
  if (!gi_.writers[size_t(value)].empty()) op = gi_.writers[size_t(value)][0];
  for (const Move& mv : path.moves) {
    if (mv.kind == MoveKind::kChunk) {
      for (size_t i = 0; i < lanes.size(); ++i)
        if (!(role(lanes[i]).tensors[size_t(cur[i])].piece == mv.after[i]))
          cur[i] = cut(lanes[i], cur[i], mv.after[i], ctx, op);
      continue;
    }
    std::vector<int> next = cur;
    for (const auto& team : mv.teams) {
      std::vector<int> team_lanes;
      for (int i : team) team_lanes.push_back(lanes[size_t(i)]);
      int fam = team_family(team_lanes);
      for (int i : team) {
        int l = lanes[size_t(i)];
        const TensorDesc& src = role(l).tensors[size_t(cur[size_t(i)])];
        TensorDesc t = value_tensor(value, mv.after[size_t(i)]);
        t.shift_dim = src.shift_dim, t.shift = src.shift, t.shift_part = src.shift_part;
        if (t.piece.parts < src.piece.parts) t.shift_part = 0;
        CollKind k = move_collective(mv.kind);
        const int64_t bytes = k == CollKind::kAllGather ? t.bytes : src.bytes;
        int out = add_tensor(l, std::move(t));  // (src dangles from here: tensors grew)
        Instr c = collective(k, fam, cur[size_t(i)], out, bytes, ctx, op, "", l);
        c.reduce = mv.reduce;
        c.dim = mv.dim;
        c.dim2 = mv.dim2;
        c.groups = mv.groups;
        emit(l, c, ctx);
        env_add(l, value, mb, out);
        next[size_t(i)] = out;
      }
    }
    cur = next;
  }
  for (size_t i = 0; i < lanes.size(); ++i)
    if (need[i] && !(role(lanes[i]).tensors[size_t(cur[i])].piece == *need[i]))
      cur[i] = cut(lanes[i], cur[i], *need[i], ctx, op);
  return cur;
}

std::vector<int> StageBuilder::provide(int value, int mb, const std::vector<std::optional<Piece>>& need,
                                       const Ctx& ctx, int op) {
  const core::Value& val = g_.value(value);
  if (val.role == core::Role::kParameter) return provide_param(value, need, ctx, op);
  int key_mb = value_mb(value, mb);
  std::vector<int> result(size_t(lanes_), -1);
  std::vector<char> pending(size_t(ep_), 0);
  for (int l = 0; l < lanes_; ++l) {
    if (!need[size_t(l)]) continue;
    const Piece& want = *need[size_t(l)];
    if (TensorIds* have = env_find(l, value, key_mb)) {
      for (int t : *have)
        if (role(l).tensors[size_t(t)].piece == want) result[size_t(l)] = t;
      if (result[size_t(l)] < 0)
        for (int t : *have)
          if (result[size_t(l)] < 0 && piece_extractable(role(l).tensors[size_t(t)].piece, want))
            result[size_t(l)] = cut(l, t, want, ctx, op);
    } else if (val.role == core::Role::kInput) {
      TensorDesc t = value_tensor(value, want);
      SubTensor st;
      shift_like(t, value, &st);
      int id = add_tensor(l, std::move(t));
      Instr ld;
      ld.kind = InstrKind::kLoad;
      ld.op = op;
      ld.out = {{-1, id}};
      emit(l, ld, ctx);
      env_add(l, value, key_mb, id);
      result[size_t(l)] = id;
    }
    if (result[size_t(l)] < 0) pending[size_t(plan_.mesh.lane_ep(l))] = 1;
  }
  for (int e = 0; e < ep_; ++e) {
    if (!pending[size_t(e)]) continue;
    std::vector<int> team;
    std::vector<std::optional<Piece>> team_need;
    for (int t = 0; t < tp_; ++t) {
      team.push_back(t + tp_ * e);
      team_need.push_back(need[size_t(t + tp_ * e)]);
    }
    std::vector<int> got = convert(value, key_mb, team, team_need, ctx, op);
    for (size_t i = 0; i < team.size(); ++i)
      if (need[size_t(team[i])]) result[size_t(team[i])] = got[i];
  }
  return result;
}

std::vector<int> StageBuilder::inputs(int op, const std::vector<SubOp>& subs, int slot, const Ctx& ctx) {
  // The previous call's pieces, assigned over (their boxes' storage reused); a nested call
  // finds the spare moved out and starts a fresh one.
  std::vector<std::optional<Piece>> need = std::move(need_spare_);
  need.resize(size_t(lanes_));
  for (int l = 0; l < lanes_; ++l) {
    const SubTensor& st = subs[size_t(l)].ins[size_t(slot)];
    if (!st.dropped) {
      need[size_t(l)] = st.piece;
      continue;
    }
    need[size_t(l)].reset();
    if (g_.value(st.value).role == core::Role::kParameter)
      param_storage(l, st.value, st.piece);  // held (and updated) even where not added
  }
  std::vector<int> got = provide(g_.op(op).inputs[size_t(slot)], ctx.mb, need, ctx, op);
  need_spare_ = std::move(need);
  return got;
}

std::vector<int> StageBuilder::outputs(int op, const std::vector<SubOp>& subs, int slot, const Ctx& ctx,
                                       std::vector<bool>* accumulate) {
  const core::Op& o = g_.op(op);
  int value = o.outputs[size_t(slot)];
  std::vector<int> ids(size_t(lanes_), -1);
  accumulate->assign(size_t(lanes_), false);
  int param = gi_.param_of_grad(value);
  for (int l = 0; l < lanes_; ++l) {
    const SubTensor& st = subs[size_t(l)].outs[size_t(slot)];
    if (param >= 0) {
      bool acc = false;
      ids[size_t(l)] = grad_tensor(l, param, st.piece, ctx, &acc);
      (*accumulate)[size_t(l)] = acc;
      continue;
    }
    int key_mb = value_mb(value, ctx.mb);
    TensorIds* have = env_find(l, value, key_mb);
    if (o.accumulate[size_t(slot)] && have && !ctx.recompute) {
      int primary = have->front();
      if (!(role(l).tensors[size_t(primary)].piece == st.piece))
        throw NotSupported("op %" + std::to_string(op) + " " + o.type + " adds into " +
                           g_.value(value).name + " laid out as " +
                           piece_str(role(l).tensors[size_t(primary)].piece) + " a contribution laid out as " +
                           piece_str(st.piece));
      ids[size_t(l)] = primary;
      (*accumulate)[size_t(l)] = true;
      continue;
    }
    TensorDesc t = value_tensor(value, st.piece);
    shift_like(t, value, &st);
    t.keep = gi_.keep[size_t(value)];
    int id = add_tensor(l, std::move(t));
    env_slot(l, value, key_mb) = {id};
    ids[size_t(l)] = id;
  }
  return ids;
}

void StageBuilder::emit_generic(int op, const std::vector<SubOp>& subs, const Ctx& ctx) {
  const core::Op& o = g_.op(op);
  std::vector<std::vector<int>> ins, outs;
  std::vector<std::vector<bool>> acc(o.outputs.size());
  for (size_t s = 0; s < o.inputs.size(); ++s) ins.push_back(inputs(op, subs, int(s), ctx));
  for (size_t s = 0; s < o.outputs.size(); ++s) outs.push_back(outputs(op, subs, int(s), ctx, &acc[s]));
  for (int l = 0; l < lanes_; ++l) {
    Instr c;
    c.kind = InstrKind::kCompute;
    c.op = op;
    c.in.reserve(ins.size());  // one block each, not one per growth step
    c.out.reserve(outs.size());
    for (size_t s = 0; s < ins.size(); ++s)
      if (ins[s][size_t(l)] >= 0) c.in.push_back({int(s), ins[s][size_t(l)]});
    for (size_t s = 0; s < outs.size(); ++s) c.out.push_back({int(s), outs[s][size_t(l)], acc[s][size_t(l)]});
    emit(l, c, ctx);
  }
}

void StageBuilder::emit_op(int op, const Ctx& ctx) {
  WEFT_CHECK(!in_emit_op_, "emit_op nested: its sub-op scratch would be overwritten");
  in_emit_op_ = true;
  const std::vector<SubOp>& subs = sub_ops(op, ctx.mb);
  const std::string& t = g_.op(op).type;
  if (subs[0].vocab_parallel && t == "cross_entropy") emit_ce(op, subs, ctx);
  else if (subs[0].expert_parallel && t == "moe") emit_moe(op, subs, ctx);
  else if (subs[0].expert_parallel && t == "moe.bwd") emit_moe_bwd(op, subs, ctx);
  else emit_generic(op, subs, ctx);
  in_emit_op_ = false;  // (an exception ends the builder: it is never reused)
}

void StageBuilder::ensure_value(int value, const Ctx& ctx) {
  const core::Value& val = g_.value(value);
  if (val.persistent || val.role == core::Role::kInput || gi_.writers[size_t(value)].empty()) return;
  int w = gi_.writers[size_t(value)][0];
  if (g_.op(w).phase != core::Phase::kForward || !gi_.recompute[size_t(w)] ||
      gi_.op_chunk[size_t(w)] != ctx.chunk || env_find(0, value, ctx.mb))
    return;
  for (int in : g_.op(w).inputs) ensure_value(in, ctx);
  Ctx rc = ctx;
  rc.recompute = true;
  emit_op(w, rc);
}

Piece StageBuilder::transfer_piece(const Transfer& t, int mb, int lane, int split_dim) const {
  const int w = gi_.writers[size_t(t.value)][0];
  const core::Op& o = g_.op(w);
  const int slot = int(std::find(o.outputs.begin(), o.outputs.end(), t.value) - o.outputs.begin());
  Piece p = sub_op(w, mb, lane).outs[size_t(slot)].piece;
  if (split_dim >= 0)
    p.box[size_t(split_dim)] = *p.box[size_t(split_dim)].part(plan_.mesh.lane_tp(lane), tp_);
  return p;
}

int StageBuilder::transfer_split_dim(const Transfer& t) {
  int& known = transfer_split_[size_t(&t - gi_.transfers.data())];
  if (known != -2) return known;
  known = -1;
  const int mb = 0;
  if (tp_ < 2) return known;
  const Piece first = transfer_piece(t, mb, 0, -1);
  if (first.parts != 1) return known;  // a partial sum is not a replica: every addend travels
  for (int l = 1; l < lanes_; ++l)
    if (!(transfer_piece(t, mb, l, -1) == transfer_piece(t, mb, tp_ * plan_.mesh.lane_ep(l), -1))) return known;
  // The last plain dim that tp divides (the hidden size of an activation).
  int dim = -1;
  for (size_t d = 0; d < first.box.size(); ++d)
    if (first.box[d].count == 1 && first.box[d].size % tp_ == 0) dim = int(d);
  if (dim < 0) return known;
  const int src = gi_.pc.chunk_stage(t.src_chunk), dst = gi_.pc.chunk_stage(t.dst_chunk);
  const int rpn = cost_.ranks_per_node;
  bool across = false, dst_lanes_across = false;
  for (int l = 0; l < lanes_; ++l) {
    across = across || plan_.mesh.rank_of(src, l, 0) / rpn != plan_.mesh.rank_of(dst, l, 0) / rpn;
    dst_lanes_across = dst_lanes_across || plan_.mesh.rank_of(dst, l, 0) / rpn != plan_.mesh.rank_of(dst, 0, 0) / rpn;
  }
  const int64_t bytes = first.numel() * int64_t(core::dtype_size(g_.value(t.value).dtype));
  const double whole = cost_.p2p(bytes, across);
  // The gather's wait for a core at the plan's world counts, as in the layout search (rvd.cc).
  const double split = cost_.p2p(bytes / tp_, across) +
                       cost_.collective(CollKind::kAllGather, tp_, bytes, dst_lanes_across) +
                       cost_.launch_oversub * cost_.oversub_weight(plan_.world());
  // Only a clear gain: on one node both cost the same bytes per link, and a tie keeps the
  // plain transfer (one message, no collective).
  if (split < 0.9 * whole) known = dim;
  return known;
}

void StageBuilder::emit_unit(const Unit& u) {
  Ctx ctx;
  ctx.stage = u.dir == Dir::kForward ? Stage::kForward : Stage::kBackward;
  ctx.mb = u.mb;
  ctx.chunk = u.chunk;
  ctx.unit = unit_counter_++;
  const int d = u.dir == Dir::kForward ? 0 : 1;
  auto tag = [&](const Transfer& t) {
    return (int64_t(t.value) << 24) | (int64_t(t.dst_chunk) << 16) | int64_t(u.mb);
  };
  for (const Transfer& t : gi_.transfers) {
    if (t.dst_chunk != u.chunk || t.dst_dir != u.dir) continue;
    int w = gi_.writers[size_t(t.value)][0];
    int slot = int(std::find(g_.op(w).outputs.begin(), g_.op(w).outputs.end(), t.value) -
                   g_.op(w).outputs.begin());
    const int split = transfer_split_dim(t);
    for (int l = 0; l < lanes_; ++l) {
      SubOp src = sub_op(w, u.mb, l);
      TensorDesc td = value_tensor(t.value, transfer_piece(t, u.mb, l, split));
      shift_like(td, t.value, &src.outs[size_t(slot)]);
      Instr r;
      r.kind = InstrKind::kRecv;
      r.peer = gi_.pc.chunk_stage(t.src_chunk);
      r.tag = tag(t);
      r.bytes = td.bytes;
      int id = add_tensor(l, std::move(td));
      r.out = {{-1, id}};
      emit(l, r, ctx);
      env_add(l, t.value, u.mb, id);
    }
  }
  if (u.dir == Dir::kBackward) {
    grad_left_unit_.clear();
    for (int op : gi_.chunk_ops[1][size_t(u.chunk)])
      for (int v : g_.op(op).outputs)
        if (int p = gi_.param_of_grad(v); p >= 0) ++grad_left_unit_[p];
  }
  for (int op : gi_.chunk_ops[d][size_t(u.chunk)]) {
    if (u.dir == Dir::kBackward)
      for (int v : g_.op(op).inputs) ensure_value(v, ctx);
    emit_op(op, ctx);
    if (u.dir == Dir::kBackward) after_grad_write(op, ctx);
  }
  for (const Transfer& t : gi_.transfers) {
    if (t.src_chunk != u.chunk || t.src_dir != u.dir) continue;
    const int split = transfer_split_dim(t);
    for (int l = 0; l < lanes_; ++l) {
      TensorIds* have = env_find(l, t.value, u.mb);
      WEFT_CHECK(have, "transfer of ", g_.value(t.value).name, " before it was produced");
      int out = have->front();
      if (split >= 0) out = cut(l, out, transfer_piece(t, u.mb, l, split), ctx, gi_.writers[size_t(t.value)][0]);
      Instr s;
      s.kind = InstrKind::kSend;
      s.in = {{-1, out}};
      s.peer = gi_.pc.chunk_stage(t.dst_chunk);
      s.tag = tag(t);
      s.bytes = role(l).tensors[size_t(out)].bytes;
      emit(l, s, ctx);
    }
  }
  flush_buckets(ctx);
  if (u.dir == Dir::kForward && gi_.pc.sequence_parallel) drop_gathered_copies(u);
  if (u.dir == Dir::kForward) {
    // Outputs of recomputed ops are not kept: the backward unit makes them again.
    for (int op : gi_.chunk_ops[0][size_t(u.chunk)]) {
      if (!gi_.recompute[size_t(op)]) continue;
      for (int l = 0; l < lanes_; ++l) {
        for (int v : g_.op(op).outputs)
          if (!lane_[size_t(l)].env[size_t(v)].empty()) env_slot(l, v, u.mb).clear();
        lane_[size_t(l)].moe_saved.erase({op, u.mb});
      }
    }
  }
}

// Sequence parallelism saves a norm's output split on the sequence; the whole copy that the
// forward gathered for the column-parallel matmul would otherwise stay in the environment
// and live until that matmul's backward, giving back the memory the split saved. Forgetting
// it here makes the backward gather again from the split primary (Megatron's re-gather of
// the layer-norm output): one more all_gather per column split, 1/tp of the norm's output
// kept instead of all of it. Only copies with more elements than their primary go (gathers);
// a reduce-scattered copy of a partial sum is smaller and stays.
void StageBuilder::drop_gathered_copies(const Unit& u) {
  for (int op : gi_.chunk_ops[0][size_t(u.chunk)])
    for (int v : g_.op(op).outputs)
      for (int l = 0; l < lanes_; ++l) {
        TensorIds* have = env_find(l, v, value_mb(v, u.mb));
        if (!have || have->size() < 2) continue;
        const int64_t primary = role(l).tensors[size_t(have->front())].piece.numel();
        have->erase(std::remove_if(
                        have->begin() + 1, have->end(),
                        [&](int t) { return role(l).tensors[size_t(t)].piece.numel() > primary; }),
                    have->end());
      }
}

void StageBuilder::build() {
  lane_.assign(size_t(lanes_), Lane{});
  for (Lane& l : lane_) l.env.resize(g_.values().size());
  sub_cache_.assign(g_.ops().size() * size_t(lanes_), std::nullopt);
  shifted_.assign(g_.ops().size(), {});
  shifted_mb_.assign(g_.ops().size(), 0);
  transfer_split_.assign(gi_.transfers.size(), -2);
  for (const Unit& u : units_) {
    if (u.dir != Dir::kBackward) continue;
    for (int op : gi_.chunk_ops[1][size_t(u.chunk)])
      for (int v : g_.op(op).outputs)
        if (int p = gi_.param_of_grad(v); p >= 0) ++grad_left_[p];
  }
  for (const Unit& u : units_) emit_unit(u);
  step_phase();
  for (int l = 0; l < lanes_; ++l) add_frees(l);
}

void lower_plan(const GraphInfo& gi, Plan& plan, const CostModel& cost, RvdCache& layouts) {
  const int pp = int(plan.mesh.degrees().pp), lanes = plan.mesh.lanes();
  plan.roles.assign(size_t(pp * lanes), Role{});
  for (int s = 0; s < pp; ++s)
    for (int l = 0; l < lanes; ++l) plan.roles[size_t(s * lanes + l)].stage = s,
                                    plan.roles[size_t(s * lanes + l)].lane = l;
  for (int s = 0; s < pp; ++s) StageBuilder(gi, plan, cost, layouts, s).build();
}

}  // namespace weft::planner
