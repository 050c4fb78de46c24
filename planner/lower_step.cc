// Gradients and the optimizer step: accumulators, the edges from them to what AdamW reads
// (data-parallel reduction, ZeRO's reduce-scatter, tp-partial gradients, tied weights
// across stages: phase 3's pass in lower_preserve.cc derives each one's collectives), the
// global gradient norm, AdamW per parameter shard, ZeRO's parameter gathers, and the frees.
//
// Gradient holders: a dense parameter's gradient is summed over every rank of the stage
// with the same tp index (dp x ep ranks, dp-major); an expert's over the dp ranks only.
// ZeRO shards a parameter's local piece over those holders along the first dim that
// divides, else unevenly along the first plain dim as torch.chunk and FSDP do: ceil(n /
// holders) rows each, the last holder's shorter, else (only strided dims, as many chunks as
// holders) one whole chunk each. Only a parameter no such cut fits stays whole (and is
// reduced by all-reduce): zero_dim says which and why.
#include <algorithm>

#include "base/check.h"
#include "planner/buckets.h"
#include "planner/lower_stage.h"

namespace weft::planner {

// Where this lane's addend of a gradient sits among its data-parallel holders: phase 1's
// description of the batch split (the groups that reduce it are phase 3's to find).
StageBuilder::Holders StageBuilder::holders(int param, int lane) {
  Holders h;
  const int dp = int(plan_.mesh.degrees().dp);
  if (gi_.expert_param[size_t(param)]) h.count = dp, h.index = 0, h.shift = 1;
  else h.count = ep_ * dp, h.index = plan_.mesh.lane_ep(lane), h.shift = ep_;
  return h;
}

namespace {

// Part k of n of one dim of a parameter's piece, as ZeRO cuts it: 1/n of every chunk where
// n divides them; else, for a plain dim, torch.chunk's cut (the last part shorter); else,
// for a strided dim of n chunks (a tp lane's q, k and v rows over 3 holders), whole chunk k.
std::optional<DimSlice> zero_part(const DimSlice& s, int64_t k, int64_t n) {
  if (std::optional<DimSlice> p = s.part(k, n, s.count)) return p;
  if (s.count == 1) return s.padded_part(k, n);
  return s.part(k, n, 1);
}

// Whether zero_part's parts are all of one size (nothing to cut at TensorDesc::shift_limit).
bool zero_parts_even(const DimSlice& s, int64_t n) {
  return s.part(0, n, s.count).has_value() || (s.count > 1 && s.part(0, n, 1).has_value());
}

}  // namespace

int StageBuilder::zero_dim(int param, int lane) {
  if (gi_.pc.zero == 0) return -1;
  Holders h = holders(param, lane);
  auto it = lane_[size_t(lane)].param_box.find(param);
  if (h.count <= 1 || it == lane_[size_t(lane)].param_box.end()) return -1;
  // Prefer a plain dim (dim 0 first: a contiguous shard of the local tensor), then a
  // strided one (the qkv rows: the shard takes 1/count of every chunk).
  const Box& b = it->second.box;
  for (int pass = 0; pass < 2; ++pass)
    for (size_t d = 0; d < b.size(); ++d)
      if ((b[d].count == 1) == (pass == 0) && b[d].part(0, h.count, b[d].count).has_value()) return int(d);
  // No dim divides: the first plain dim cut as torch.chunk does (zero_shard). The plan
  // describes replica 0's shards and shifts them for the others; with two or more replicas
  // only later replicas hold short parts (cut at TensorDesc::shift_limit), and at dp 1 (the
  // holders are ep lanes of the one replica) the last lane's role holds its short part as
  // it is, which phase 3 pads back to full size (lower_preserve.cc, pad_of).
  for (size_t d = 0; d < b.size(); ++d)
    if (b[d].padded_part(0, h.count).has_value()) return int(d);
  // Only strided dims (the qkv bias of a tp lane: q, k and v rows, 3 chunks of 16): where the
  // holders are as many as the chunks, each takes one whole chunk (an even cut, 3 over dp 3).
  for (size_t d = 0; d < b.size(); ++d)
    if (b[d].count == h.count && b[d].part(0, h.count, 1).has_value()) return int(d);
  // Still whole, two kinds, both small (bias and norm vectors):
  // - Only strided dims, and the holders neither divide each chunk nor equal the chunks
  //   (the qkv bias of a tp lane, 3 chunks of 16, over dp 5). A torch.chunk cut
  //   within each chunk is a box (every chunk's part has the same offset and size, so
  //   shift_limit would clip all alike), but phase 3 searches uneven shards in padded
  //   coordinates, growing a short part past its end: a strided part grown so runs into the
  //   next tp lane's rows, where the search would take them for this lane's. The executor's
  //   uneven chunks (parallel/collectives.cc) are plain ranges too.
  // - Too short for a non-empty last part (4 rows over 3: 2, 2, 0; only dims under
  //   holders x (holders - 1) rows). Empty shards would need zero-element tensors in every
  //   rank's program, collective counts of zero and empty boxes in the router, checkpoints
  //   and snapshots, none of which the plan admits now (Plan::tensor_for refuses an empty
  //   piece).
  return -1;
}

Piece StageBuilder::zero_shard(int param, int lane) {
  Holders h = holders(param, lane);
  int d = zero_dim(param, lane);
  Piece p = lane_[size_t(lane)].param_box.at(param);
  p.part = 0, p.parts = 1;
  const DimSlice s = p.box[size_t(d)];
  p.box[size_t(d)] = *zero_part(s, h.index, h.count);
  // Replica 0's shards are what every other replica's are shifted from: full-size wherever
  // a replica follows.
  WEFT_CHECK(plan_.mesh.degrees().dp < 2 || p.box[size_t(d)].size == zero_part(s, 0, h.count)->size,
             "ZeRO shard ", h.index, " of ", g_.value(param).name, " is short on replica 0");
  return p;
}

void StageBuilder::zero_shift(TensorDesc& t, int param, int lane) {
  const int d = zero_dim(param, lane);
  const Holders h = holders(param, lane);
  const DimSlice& whole = lane_[size_t(lane)].param_box.at(param).box[size_t(d)];
  // Holder i's part starts i steps on (a part's rows, or a chunk's stride for whole chunks).
  const int64_t step = zero_part(whole, 1, h.count)->start - zero_part(whole, 0, h.count)->start;
  t.shift_dim = d;
  t.shift = step * h.shift;
  if (!zero_parts_even(whole, h.count)) t.shift_limit = whole.start + whole.size;
}

int StageBuilder::grad_tensor(int lane, int param, const Piece& produced, const Ctx& ctx, bool* acc) {
  Lane& L = lane_[size_t(lane)];
  const int grad_value = gi_.grad_value[size_t(param)];
  const int q = K_ > 0 && produced.parts % K_ == 0 ? int(produced.parts / K_) : 1;
  const int r = produced.part % q;
  Holders h = holders(param, lane);
  TensorDesc t = value_tensor(grad_value, produced);
  t.piece.part = r + q * h.index;
  t.piece.parts = q * h.count;
  t.shift_part = q * h.shift;
  if (gi_.pc.zero >= 2 && zero_dim(param, lane) >= 0) {
    // ZeRO-2/3: this micro-batch's full gradient is transient; reduce-scattered into the
    // shard accumulator after its last contribution.
    if (TensorIds* have = env_find(lane, grad_value, ctx.mb)) {
      *acc = true;
      return have->front();
    }
    t.persistent = false;
    int id = add_tensor(lane, t);
    env_add(lane, grad_value, ctx.mb, id);
    *acc = false;
    return id;
  }
  *acc = true;  // accumulators are zeroed at the start of a step
  auto it = L.grad.find(param);
  if (it != L.grad.end()) {
    WEFT_CHECK(role(lane).tensors[size_t(it->second)].piece.box == produced.box,
               "two contributions to ", g_.value(grad_value).name, " with different boxes");
    return it->second;
  }
  t.persistent = true;
  int id = add_tensor(lane, t);
  L.grad[param] = id;
  return id;
}

int StageBuilder::param_storage(int lane, int value, const Piece& piece) {
  Lane& L = lane_[size_t(lane)];
  L.param_box.emplace(value, piece);
  auto it = L.param.find(value);
  if (it != L.param.end()) return it->second;
  int zd = gi_.pc.zero >= 3 ? zero_dim(value, lane) : -1;
  TensorDesc t = value_tensor(value, zd >= 0 ? zero_shard(value, lane) : L.param_box.at(value));
  t.persistent = true;
  if (zd >= 0) zero_shift(t, value, lane);
  int id = add_tensor(lane, t);
  L.param[value] = id;
  return id;
}

// ZeRO-3: the edge that gathers `value`'s shards into the whole piece each lane computes with,
// for the lanes that need it and have not gathered it in this unit. have[l]: the lane's
// tensor of it so far (its shard, its whole piece, or this unit's gathered copy).
StageBuilder::Edge StageBuilder::zero3_gather(int value, const std::vector<std::optional<Piece>>& need,
                                              const Ctx& ctx, int op, std::vector<int>& have) {
  Edge gather;
  gather.value = value;
  gather.op = op;
  gather.part = "zero3.gather";
  for (int l = 0; l < lanes_; ++l) {
    if (!need[size_t(l)]) continue;
    Lane& L = lane_[size_t(l)];
    have[size_t(l)] = param_storage(l, value, *need[size_t(l)]);
    if (gi_.pc.zero < 3 || zero_dim(value, l) < 0) continue;
    auto it = L.gathered.find(value);
    if (it != L.gathered.end() && it->second.first == ctx.unit) {
      have[size_t(l)] = it->second.second;
      continue;
    }
    gather.devices.push_back({stage_, l});
    gather.from.push_back(role(l).tensors[size_t(have[size_t(l)])]);
    gather.have.push_back(have[size_t(l)]);
    gather.need.push_back(value_tensor(value, L.param_box.at(value)));
  }
  return gather;
}

void StageBuilder::record_gathered(const Edge& gather, const std::vector<int>& got, const Ctx& ctx,
                                   std::vector<int>* have) {
  for (const auto& [stage, l] : gather.devices) {
    lane_[size_t(l)].gathered[gather.value] = {ctx.unit, got[size_t(l)]};
    if (have) (*have)[size_t(l)] = got[size_t(l)];
  }
}

// ZeRO-3 gathers a block at a time, as FSDP gathers a wrapped module's flat parameter: the
// first op of a run of ops of one transformer block (or of the embedding or the head) that
// needs a gather fetches every parameter the run's ops read in this unit, as one grouped call
// per family: one launch per block instead of one per tensor, the same bytes. The block's
// parameters are whole from that call until each one's last use, as under FSDP. The
// cross-entropy's and MoE's own lowerings ask for their parameters themselves (their pieces
// are theirs to name); a forward op recomputed inside a backward unit gathers alone.
void StageBuilder::gather_block(int op, const Ctx& ctx) {
  if (ctx.recompute || ctx.chunk < 0 || ctx.stage == Stage::kStep) return;
  const int d = ctx.stage == Stage::kForward ? 0 : 1;
  const std::vector<int>& ops = gi_.chunk_ops[d][size_t(ctx.chunk)];
  auto at = std::find(ops.begin(), ops.end(), op);
  if (at == ops.end()) return;
  const int layer = g_.op(op).layer;
  std::vector<int> seen, have(size_t(lanes_), -1);
  std::vector<std::optional<Piece>> need(static_cast<size_t>(lanes_));
  for (auto it = at; it != ops.end() && g_.op(*it).layer == layer; ++it) {
    const core::Op& o = g_.op(*it);
    bool custom = false;
    for (int l = 0; l < lanes_ && !custom; ++l) {
      const SubOp& s = sub_op_mb0(*it, l);
      custom = s.vocab_parallel || s.expert_parallel;
    }
    if (custom) continue;
    for (size_t s = 0; s < o.inputs.size(); ++s) {
      const int v = o.inputs[s];
      if (g_.value(v).role != core::Role::kParameter) continue;
      if (std::find(seen.begin(), seen.end(), v) != seen.end()) continue;
      seen.push_back(v);
      for (int l = 0; l < lanes_; ++l) {
        const SubTensor& st = sub_op_mb0(*it, l).ins[s];
        need[size_t(l)].reset();
        if (!st.dropped) need[size_t(l)] = st.piece;
      }
      Edge e = zero3_gather(v, need, ctx, *it, have);
      if (e.devices.empty()) continue;
      e.bucket = true;
      record_gathered(e, preserve(e, ctx), ctx, nullptr);
    }
  }
  flush_buckets(ctx, "zero3.gather");
}

std::vector<int> StageBuilder::provide_param(int value, const std::vector<std::optional<Piece>>& need,
                                             const Ctx& ctx, int op) {
  std::vector<int> have(size_t(lanes_), -1);
  // ZeRO-3: a lane computes with the whole piece, gathered from the shards once per unit
  // and freed after the unit's last use; an edge like any other.
  Edge gather = zero3_gather(value, need, ctx, op, have);
  if (!gather.devices.empty()) {
    gather_block(op, ctx);  // this parameter and the rest of its block, when it can
    gather = zero3_gather(value, need, ctx, op, have);
  }
  if (!gather.devices.empty()) record_gathered(gather, preserve(gather, ctx), ctx, &have);
  std::vector<int> result(size_t(lanes_), -1);
  for (int l = 0; l < lanes_; ++l) {
    if (!need[size_t(l)]) continue;
    const Piece& got = role(l).tensors[size_t(have[size_t(l)])].piece;
    if (got == *need[size_t(l)]) result[size_t(l)] = have[size_t(l)];
    else if (piece_extractable(got, *need[size_t(l)])) result[size_t(l)] = cut(l, have[size_t(l)], *need[size_t(l)], ctx, op);
    else
      throw NotSupported("parameter " + g_.value(value).name + " is held as " + piece_str(got) +
                         " but an op needs " + piece_str(*need[size_t(l)]));
  }
  return result;
}

TensorDesc StageBuilder::adamw_piece(int param, int lane) {
  const int grad_value = gi_.grad_value[size_t(param)];
  const int zd = zero_dim(param, lane);
  if (zd < 0) return value_tensor(grad_value, lane_[size_t(lane)].param_box.at(param));
  TensorDesc t = value_tensor(grad_value, zero_shard(param, lane));
  zero_shift(t, param, lane);
  return t;
}

StageBuilder::Edge StageBuilder::grad_edge(int param, const std::vector<int>& grads, const std::vector<int>& stages) {
  Edge e;
  e.value = gi_.grad_value[size_t(param)];
  e.op = gi_.adamw_of[size_t(param)];
  const int S = int(stages.size());
  for (int si = 0; si < S; ++si)
    for (int l = 0; l < lanes_; ++l) {
      e.devices.push_back({stages[size_t(si)], l});
      // A tied weight's copies are split alike on every stage that uses it (the same lane
      // holds the same piece), and each stage's gradient is one addend of the sum: stage
      // si's copy is addend si of S on top of its own tp and data-parallel addends.
      TensorDesc t = role(l).tensors[size_t(grads[size_t(l)])];
      t.piece.part += t.piece.parts * si;
      t.piece.parts *= S;
      e.from.push_back(t);
      e.have.push_back(stages[size_t(si)] == stage_ ? grads[size_t(l)] : -1);
      e.need.push_back(adamw_piece(param, l));
    }
  e.part = "grad.sync";
  e.part_stages = "grad.tied";
  return e;
}

// The gradient of a parameter used on this stage only, once its last contribution is in:
// from the accumulators (addends over tp, the batch shards and ep) to what AdamW reads (the
// whole piece, or the ZeRO-1 shard), bucketed with the other gradients.
void StageBuilder::sync_grad(int param, const Ctx& ctx) {
  std::vector<int> grads(static_cast<size_t>(lanes_));
  for (int l = 0; l < lanes_; ++l) grads[size_t(l)] = lane_[size_t(l)].grad.at(param);
  Edge e = grad_edge(param, grads, {stage_});
  e.bucket = true;
  std::vector<int> got = preserve(e, ctx);
  for (int l = 0; l < lanes_; ++l) lane_[size_t(l)].synced[param] = got[size_t(l)];
}

// ZeRO-2/3: one micro-batch's gradient, once complete in this unit, is reduced into each
// holder's shard accumulator (the edge's destination, added to).
void StageBuilder::scatter_grad_mb(int param, const Ctx& ctx) {
  const int grad_value = gi_.grad_value[size_t(param)];
  std::vector<int> grads(static_cast<size_t>(lanes_));
  for (int l = 0; l < lanes_; ++l) grads[size_t(l)] = env_find(l, grad_value, ctx.mb)->front();
  Edge e = grad_edge(param, grads, {stage_});
  e.bucket = true;
  for (int l = 0; l < lanes_; ++l) {
    Lane& L = lane_[size_t(l)];
    if (!L.grad.count(param)) {
      TensorDesc t = adamw_piece(param, l);
      t.persistent = true;
      L.grad[param] = add_tensor(l, t);
    }
    e.sink.push_back({-1, L.grad[param], true});  // accumulates over micro-batches
    L.synced[param] = L.grad[param];
  }
  preserve(e, ctx);
}

void StageBuilder::bucket_add(CollKind kind, const std::string& part, const std::vector<int>& family,
                              int depth, const std::vector<Operand>& in, const std::vector<Operand>& out,
                              int64_t bytes, int op, const Ctx& ctx) {
  Bucket* b = nullptr;
  for (Bucket& x : buckets_)
    if (x.kind == kind && x.part == part && x.family == family && x.depth == depth) b = &x;
  if (!b) {
    buckets_.push_back(Bucket{kind, part, family, depth, std::vector<std::vector<Operand>>(size_t(lanes_)),
                              std::vector<std::vector<Operand>>(size_t(lanes_)), 0, op});
    b = &buckets_.back();
  }
  for (int l = 0; l < lanes_; ++l) {
    b->in[size_t(l)].push_back(in[size_t(l)]);
    b->out[size_t(l)].push_back(out[size_t(l)]);
  }
  b->bytes += bytes;
  if (!bucket_full(double(b->bytes), gi_.pc.bucket_bytes)) return;  // buckets.h
  // A full bucket goes out now, after the deeper ones of its part (which may hold what it
  // reads: an edge's waiting moves all have one part, preserve checks).
  std::vector<Bucket> now, rest;
  const size_t full = size_t(b - buckets_.data());
  for (size_t i = 0; i < buckets_.size(); ++i)
    (i == full || (buckets_[i].part == part && buckets_[i].depth > depth) ? now : rest)
        .push_back(std::move(buckets_[i]));
  buckets_ = std::move(rest);
  emit_buckets(std::move(now), ctx);
}

void StageBuilder::flush_buckets(const Ctx& ctx, const std::string& part) {
  std::vector<Bucket> now, rest;
  for (Bucket& b : buckets_) (part.empty() || b.part == part ? now : rest).push_back(std::move(b));
  buckets_ = std::move(rest);
  emit_buckets(std::move(now), ctx);
}

void StageBuilder::emit_buckets(std::vector<Bucket> out, const Ctx& ctx) {
  std::stable_sort(out.begin(), out.end(), [](const Bucket& a, const Bucket& z) { return a.depth > z.depth; });
  for (Bucket& b : out)
    for (int l = 0; l < lanes_; ++l) {
      Instr c;
      c.kind = InstrKind::kCollective;
      c.coll = b.kind;
      c.group = b.family[size_t(l)];
      c.op = b.op;
      c.part = b.part;
      c.bytes = b.bytes;
      c.in = b.in[size_t(l)];
      c.out = b.out[size_t(l)];
      if (c.in.size() == 1) {
        // One pair: name the dim it gathers or scatters along (grouped calls derive each
        // pair's dim from where its in and out boxes differ).
        const Box& a = role(l).tensors[size_t(c.in[0].tensor)].piece.box;
        const Box& z = role(l).tensors[size_t(c.out[0].tensor)].piece.box;
        for (size_t d = 0; d < a.size() && d < z.size(); ++d)
          if (!(a[d] == z[d])) c.dim = int(d), c.groups = std::max(a[d].count, z[d].count);
      }
      emit(l, c, ctx);
    }
}

void StageBuilder::after_grad_write(int op, const Ctx& ctx) {
  if (ctx.recompute) return;
  for (int v : g_.op(op).outputs) {
    int p = gi_.param_of_grad(v);
    if (p < 0) continue;
    bool per_mb = gi_.pc.zero >= 2 && zero_dim(p, 0) >= 0;
    if (per_mb && --grad_left_unit_[p] == 0) scatter_grad_mb(p, ctx);
    // A weight tied across stages is reduced in the step (step_phase).
    if (--grad_left_[p] == 0 && !per_mb && gi_.param_stages[size_t(p)].size() == 1) sync_grad(p, ctx);
  }
}

void StageBuilder::step_phase() {
  Ctx ctx;
  ctx.stage = Stage::kStep;
  ctx.unit = unit_counter_++;
  std::vector<int> params;
  for (int p : g_.parameters())
    if (std::count(gi_.param_stages[size_t(p)].begin(), gi_.param_stages[size_t(p)].end(), stage_))
      params.push_back(p);
  const int zero = gi_.pc.zero;
  flush_buckets(ctx);

  // Tied parameters (the embedding and the head share wte) live on two stages: their
  // gradients are summed across the stages too, which only the step can do (the stages
  // meet nowhere else: a collective mid-backward would wait on a stage that is still
  // sending activations' gradients down the pipeline).
  for (int p : params) {
    const auto& st = gi_.param_stages[size_t(p)];
    if (st.size() < 2) continue;
    std::vector<int> grads(static_cast<size_t>(lanes_));
    for (int l = 0; l < lanes_; ++l) grads[size_t(l)] = lane_[size_t(l)].grad.at(p);
    std::vector<int> got = preserve(grad_edge(p, grads, st), ctx);
    for (int l = 0; l < lanes_; ++l) lane_[size_t(l)].synced[p] = got[size_t(l)];
  }

  // Global gradient norm: each gradient element counted once. Sharded gradients are
  // distinct on every rank (sum over the world); whole ones are replicated over the data-
  // parallel holders (sum within one data-parallel replica, counting one tp/ep/stage copy).
  const core::Op& gn = g_.op(gi_.global_norm);
  GroupFamily everyone;
  for (int s = 0; s < int(plan_.mesh.degrees().pp); ++s)
    for (int l = 0; l < lanes_; ++l) everyone.members.push_back({s, l});
  int fam_rep = add_family(plan_, everyone);
  everyone.all_dp = true;
  int fam_all = add_family(plan_, everyone);
  int norm_value = gn.outputs[0];
  std::vector<std::vector<std::pair<int, int>>> lane_gathers(static_cast<size_t>(lanes_));
  for (int l = 0; l < lanes_; ++l) {
    Lane& L = lane_[size_t(l)];
    std::vector<Operand> sharded, whole;
    for (int p : params) {
      bool owner = gi_.param_stages[size_t(p)][0] == stage_;
      const Piece& mine = L.param_box.at(p);
      for (int t = 0; t < plan_.mesh.lane_tp(l); ++t)
        if (lane_[size_t(t + tp_ * plan_.mesh.lane_ep(l))].param_box.at(p) == mine) owner = false;
      bool is_sharded = zero_dim(p, l) >= 0;
      if (!is_sharded && !gi_.expert_param[size_t(p)] && plan_.mesh.lane_ep(l) != 0) owner = false;
      if (!owner) continue;
      int slot = int(std::find(gn.inputs.begin(), gn.inputs.end(), gi_.grad_value[size_t(p)]) -
                     gn.inputs.begin());
      (is_sharded ? sharded : whole).push_back({slot, L.synced.at(p)});
    }
    Piece one{Box{DimSlice{0, 1, 1, 0}}};
    std::vector<Operand> partial_sums;
    auto reduce = [&](const std::vector<Operand>& grads, int fam) {
      int s = add_tensor(l, scratch_tensor("norm.sumsq", one, core::DType::kF64));
      Instr c;
      c.kind = InstrKind::kCompute;
      c.op = gi_.global_norm;
      c.part = "norm.sumsq";
      c.in = grads;
      c.out = {{-1, s}};
      emit(l, c, ctx);
      int r = add_tensor(l, scratch_tensor("norm.sumsq", one, core::DType::kF64));
      emit(l, collective(CollKind::kAllReduce, fam, s, r, 8, ctx, gi_.global_norm, "norm", l), ctx);
      partial_sums.push_back({-1, r});
    };
    if (zero >= 1) reduce(sharded, fam_all);
    reduce(whole, fam_rep);
    TensorDesc nt = value_tensor(norm_value, Piece{full_box(g_.value(norm_value).shape)});
    nt.persistent = true;
    int norm = add_tensor(l, nt);
    Instr fin;
    fin.kind = InstrKind::kCompute;
    fin.op = gi_.global_norm;
    fin.part = "norm.finish";
    fin.in = partial_sums;
    fin.out = {{0, norm}};
    emit(l, fin, ctx);

    // AdamW on this rank's piece (its ZeRO shard when sharded), then ZeRO-1/2 gather the
    // updated shards back into the whole parameter.
    std::vector<std::pair<int, int>> gathers;  // (param, shard view)
    for (int p : params) {
      const core::Op& up = g_.op(gi_.adamw_of[size_t(p)]);
      int zd = zero_dim(p, l);
      int pt = L.param.at(p);
      Piece piece = role(l).tensors[size_t(pt)].piece;
      TensorDesc shard_like = role(l).tensors[size_t(pt)];
      if (zd >= 0 && zero < 3) {
        TensorDesc view = shard_like;
        view.piece = zero_shard(p, l);
        view.bytes = view.piece.numel() * int64_t(core::dtype_size(view.dtype));
        view.alias_of = pt;
        view.persistent = true;
        zero_shift(view, p, l);
        shard_like = view;
        pt = add_tensor(l, view);
        gathers.push_back({p, pt});
        piece = view.piece;
      }
      auto state = [&](int value) {
        TensorDesc s = value_tensor(value, piece);
        s.persistent = true;
        s.shift_dim = shard_like.shift_dim, s.shift = shard_like.shift;
        s.shift_limit = shard_like.shift_limit;
        return add_tensor(l, s);
      };
      Instr c;
      c.kind = InstrKind::kCompute;
      c.op = up.id;
      c.in = {{0, pt}, {1, L.synced.at(p)}, {2, state(up.inputs[2])}, {3, state(up.inputs[3])}, {4, norm}};
      emit(l, c, ctx);
    }
    for (auto [p, view] : gathers) lane_gathers[size_t(l)].push_back({p, view});
  }
  // ZeRO-1/2: the updated shards are gathered back into the whole parameters, bucketed.
  for (size_t i = 0; i < lane_gathers[0].size(); ++i) {
    Edge e;
    e.value = lane_gathers[0][i].first;
    e.op = gi_.adamw_of[size_t(e.value)];
    e.part = "param.gather";
    e.bucket = true;
    for (int l = 0; l < lanes_; ++l) {
      const int view = lane_gathers[size_t(l)][i].second, whole = lane_[size_t(l)].param.at(e.value);
      e.devices.push_back({stage_, l});
      e.from.push_back(role(l).tensors[size_t(view)]);
      e.have.push_back(view);
      e.need.push_back(role(l).tensors[size_t(whole)]);
      e.sink.push_back({-1, whole, false});
    }
    preserve(e, ctx);
  }
  flush_buckets(ctx);
}

void StageBuilder::add_frees(int lane) {
  Role& r = role(lane);
  const size_t n = r.tensors.size();
  auto root = [&](int t) {
    while (r.tensors[size_t(t)].alias_of >= 0) t = r.tensors[size_t(t)].alias_of;
    return t;
  };
  std::vector<int> last(n, -1);
  for (size_t i = 0; i < r.program.size(); ++i) {
    for (const Operand& o : r.program[i].in) last[size_t(root(o.tensor))] = int(i);
    for (const Operand& o : r.program[i].out) last[size_t(root(o.tensor))] = int(i);
  }
  // Tensors freed after instruction i, ascending: freed[begin[i], begin[i + 1]) (one flat
  // array, counted then filled, instead of a vector per instruction).
  const size_t len = r.program.size();
  std::vector<int> begin(len + 1, 0), freed;
  auto freeable = [&](size_t t) {
    const TensorDesc& d = r.tensors[t];
    return !(d.alias_of >= 0 || d.persistent || d.keep || last[t] < 0);
  };
  for (size_t t = 0; t < n; ++t)
    if (freeable(t)) ++begin[size_t(last[t]) + 1];
  size_t frees = 0;
  for (size_t i = 0; i < len; ++i) frees += begin[i + 1] > 0, begin[i + 1] += begin[i];
  freed.resize(size_t(begin[len]));
  std::vector<int> fill(begin.begin(), begin.end() - 1);
  for (size_t t = 0; t < n; ++t)
    if (freeable(t)) freed[size_t(fill[size_t(last[t])]++)] = int(t);
  std::vector<Instr> out;
  out.reserve(len + frees);
  for (size_t i = 0; i < len; ++i) {
    out.push_back(std::move(r.program[i]));
    if (begin[i] == begin[i + 1]) continue;
    Instr f;
    f.kind = InstrKind::kFree;
    f.stage = out.back().stage;
    f.mb = out.back().mb;
    f.chunk = out.back().chunk;
    f.in.reserve(size_t(begin[i + 1] - begin[i]));
    for (int k = begin[i]; k < begin[i + 1]; ++k) f.in.push_back({-1, freed[size_t(k)]});
    out.push_back(std::move(f));
  }
  r.program = std::move(out);
}

}  // namespace weft::planner
