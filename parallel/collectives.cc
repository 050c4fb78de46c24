// Collective instructions: pack the pairs' chunks in member order, one communicator call,
// unpack (overwrite or accumulate) into the outputs.
#include "parallel/collectives.h"

#include <numeric>

#include "base/check.h"
#include "base/error.h"
#include "parallel/regions.h"

namespace weft::parallel {

using planner::Box;

int64_t MoeCounts::send_rows(int to) const {
  int64_t n = 0, el = local_experts();
  for (int64_t e = to * el; e < (to + 1) * el; ++e) n += rows[size_t(me)][size_t(e)];
  return n;
}

int64_t MoeCounts::recv_rows(int from) const {
  int64_t n = 0, el = local_experts();
  for (int64_t e = me * el; e < (me + 1) * el; ++e) n += rows[size_t(from)][size_t(e)];
  return n;
}

std::vector<int64_t> MoeCounts::expert_rows() const {
  std::vector<int64_t> out;
  int64_t el = local_experts();
  for (int s = 0; s < members; ++s)
    for (int64_t e = 0; e < el; ++e) out.push_back(rows[size_t(s)][size_t(me * el + e)]);
  return out;
}

namespace {

// A dense view of `n` elements at `offset` of a flat buffer, shaped like `box`.
core::Tensor segment(const core::Tensor& flat, int64_t offset, const Box& box) {
  core::Shape s = planner::box_shape(box);
  if (s.empty()) s = {1};
  return flat.slice(0, offset, planner::box_numel(box)).view(s);
}

// The dim a pair moves along: the instruction's for a single pair, else where in and out differ.
int pair_dim(const planner::Instr& in, const Box& a, const Box& b) {
  if (in.in.size() == 1 && in.dim >= 0) return in.dim;
  for (size_t d = 0; d < a.size(); ++d)
    if (!(a[d] == b[d])) return int(d);
  return in.dim >= 0 ? in.dim : 0;
}

// Chunk k of n of `full` along `dim`, with the grouping that makes my own chunk `mine`.
Box member_chunk(const Box& full, const Box& mine, int dim, int me, int64_t k, int64_t n,
                 int64_t groups) {
  const planner::DimSlice& f = full[size_t(dim)];
  for (int64_t g : {groups, int64_t(1), f.count}) {
    auto own = f.part(me, n, g);
    if (own && *own == mine[size_t(dim)]) return chunk_box(full, dim, k, n, g);
  }
  // ZeRO's uneven shards: torch.chunk's cut (ceil(size / n) each, the last shorter); the
  // communicator moves each member's own count, so no padding travels.
  auto own = f.padded_part(me, n);
  if (own && *own == mine[size_t(dim)]) {
    Box b = full;
    b[size_t(dim)] = *f.padded_part(k, n);
    return b;
  }
  throw InternalError("collective chunk: " + planner::box_str(mine) + " is not part " +
                      std::to_string(me) + " of " + std::to_string(n) + " of " +
                      planner::box_str(full) + " along dim " + std::to_string(dim));
}

// dst[region] := tensor `id`'s elements of `region`, wherever they are stored.
void load(TensorTable& t, int id, core::Tensor& dst, const Box& dst_box, const Box& region) {
  TensorTable::Located l = t.locate(id, false, false);
  copy_region(dst, dst_box, *l.tensor, *l.box, region);
}

// Operand `o`'s elements of `region` := (or +=) src[region].
void store(TensorTable& t, const planner::Operand& o, const core::Tensor& src, const Box& src_box,
           const Box& region) {
  TensorTable::Located l = t.locate(o.tensor, true, o.accumulate);
  copy_region(*l.tensor, *l.box, src, src_box, region, o.accumulate);
}

PendingCollective all_reduce(const planner::Instr& in, TensorTable& t, comm::Communicator& c) {
  comm::AllReduceOptions o;
  o.op = in.reduce == planner::ReduceOp::kMax ? comm::ReduceOp::kMax : comm::ReduceOp::kSum;
  if (in.in.size() == 1 && t.viewable(in.in[0].tensor) &&
      t.viewable(in.out[0].tensor)) {  // in place
    core::Tensor& x = t.read(in.in[0].tensor);
    const planner::Operand& out = in.out[0];
    bool same = t.live(out.tensor) && t.write(out.tensor, false).raw_data() == x.raw_data();
    if (x.is_contiguous() && (same || !out.accumulate)) {
      core::Tensor& y = t.write(out.tensor, false);
      if (!same) y.copy_from(x);
      if (y.is_contiguous()) return {c.all_reduce(y, o), nullptr};
    }
  }
  int64_t total = 0;
  core::DType dt = t.desc(in.in[0].tensor).dtype;
  for (const planner::Operand& a : in.in) total += planner::box_numel(t.desc(a.tensor).piece.box);
  core::Tensor buf = t.staging(total, dt);
  int64_t off = 0;
  for (const planner::Operand& a : in.in) {
    const Box& b = t.desc(a.tensor).piece.box;
    core::Tensor seg = segment(buf, off, b);
    load(t, a.tensor, seg, b, b);
    off += planner::box_numel(b);
  }
  comm::Work w = c.all_reduce(buf, o);
  return {w, [&t, &in, buf] {
            int64_t off = 0;
            for (size_t k = 0; k < in.out.size(); ++k) {
              const Box& b = t.desc(in.in[k].tensor).piece.box;
              const Box& ob = t.desc(in.out[k].tensor).piece.box;
              core::Tensor seg = segment(buf, off, b);
              store(t, in.out[k], seg, b, ob);
              off += planner::box_numel(b);
            }
          }};
}

// reduce_scatter (scatter = true) or all_gather: chunk k of member m of every pair, packed
// member-major so that member m's data is one contiguous segment.
PendingCollective scatter_gather(const planner::Instr& in, TensorTable& t, comm::Communicator& c,
                                 bool scatter) {
  const int n = c.size(), me = c.rank();
  const size_t pairs = in.in.size();
  core::DType dt = t.desc(in.in[0].tensor).dtype;
  std::vector<std::vector<Box>> chunk(static_cast<size_t>(n), std::vector<Box>(pairs));
  std::vector<int64_t> counts(size_t(n), 0);
  for (size_t k = 0; k < pairs; ++k) {
    const Box& ib = t.desc(in.in[k].tensor).piece.box;
    const Box& ob = t.desc(in.out[k].tensor).piece.box;
    const Box& full = scatter ? ib : ob;
    const Box& mine = scatter ? ob : ib;
    int dim = pair_dim(in, ib, ob);
    for (int m = 0; m < n; ++m) {
      chunk[size_t(m)][k] = member_chunk(full, mine, dim, me, m, n, in.groups);
      counts[size_t(m)] += planner::box_numel(chunk[size_t(m)][k]);
    }
  }
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t(0));
  core::Tensor whole = t.staging(total, dt), part = t.staging(counts[size_t(me)], dt);
  if (scatter) {
    int64_t off = 0;
    for (int m = 0; m < n; ++m)
      for (size_t k = 0; k < pairs; ++k) {
        const Box& b = chunk[size_t(m)][k];
        core::Tensor seg = segment(whole, off, b);
        load(t, in.in[k].tensor, seg, b, b);
        off += planner::box_numel(b);
      }
    comm::ReduceScatterOptions o;
    o.counts = counts;
    comm::Work w =
        c.reduce_scatter(part.slice(0, 0, counts[size_t(me)]), whole.slice(0, 0, total), o);
    return {w, [&t, &in, part, mine = chunk[size_t(me)], whole] {
              int64_t off2 = 0;
              for (size_t k = 0; k < mine.size(); ++k) {
                const Box& b = mine[k];
                const planner::Operand& out = in.out[k];
                core::Tensor seg = segment(part, off2, b);
                store(t, out, seg, b, b);
                off2 += planner::box_numel(b);
              }
            }};
  }
  int64_t off = 0;
  for (size_t k = 0; k < pairs; ++k) {
    const Box& b = chunk[size_t(me)][k];
    core::Tensor seg = segment(part, off, b);
    load(t, in.in[k].tensor, seg, b, b);
    off += planner::box_numel(b);
  }
  comm::AllGatherOptions o;
  o.counts = counts;
  comm::Work w = c.all_gather(whole.slice(0, 0, total), part.slice(0, 0, counts[size_t(me)]), o);
  return {w, [&t, &in, whole, part, chunk = std::move(chunk)] {
            int64_t off = 0;
            for (const std::vector<Box>& of_member : chunk)
              for (size_t k = 0; k < of_member.size(); ++k) {
                const Box& b = of_member[k];
                const planner::Operand& out = in.out[k];
                core::Tensor seg = segment(whole, off, b);
                store(t, out, seg, b, b);
                off += planner::box_numel(b);
              }
          }};
}

// D_i -> D_j: member m gets my chunk m along `dim`; what m sends me is its part of my box
// along `dim2` (chunk m of my output).
void all_to_all(const planner::Instr& in, TensorTable& t, comm::Communicator& c) {
  const int n = c.size(), me = c.rank();
  const size_t pairs = in.in.size();
  core::DType dt = t.desc(in.in[0].tensor).dtype;
  std::vector<std::vector<Box>> send(static_cast<size_t>(n), std::vector<Box>(pairs));
  std::vector<std::vector<Box>> recv = send;
  std::vector<int64_t> sc(size_t(n), 0), rc(size_t(n), 0);
  for (size_t k = 0; k < pairs; ++k) {
    const Box& ib = t.desc(in.in[k].tensor).piece.box;
    const Box& ob = t.desc(in.out[k].tensor).piece.box;
    for (int m = 0; m < n; ++m) {
      send[size_t(m)][k] = chunk_box(ib, in.dim, m, n, 1);
      recv[size_t(m)][k] = chunk_box(ob, in.dim2, m, n, 1);
      WEFT_CHECK(planner::box_contains(ob, send[size_t(me)][k]) || m != me,
                 "all_to_all: own chunk outside output");
      sc[size_t(m)] += planner::box_numel(send[size_t(m)][k]);
      rc[size_t(m)] += planner::box_numel(recv[size_t(m)][k]);
    }
  }
  int64_t st = std::accumulate(sc.begin(), sc.end(), int64_t(0)),
          rt = std::accumulate(rc.begin(), rc.end(), int64_t(0));
  core::Tensor sbuf = t.staging(st, dt), rbuf = t.staging(rt, dt);
  int64_t off = 0;
  for (int m = 0; m < n; ++m)
    for (size_t k = 0; k < pairs; ++k) {
      const Box& b = send[size_t(m)][k];
      core::Tensor seg = segment(sbuf, off, b);
      load(t, in.in[k].tensor, seg, b, b);
      off += planner::box_numel(b);
    }
  c.all_to_all_v(rbuf.slice(0, 0, rt), rc, sbuf.slice(0, 0, st), sc).wait();
  off = 0;
  for (int m = 0; m < n; ++m)
    for (size_t k = 0; k < pairs; ++k) {
      const Box& b = recv[size_t(m)][k];
      const planner::Operand& out = in.out[k];
      core::Tensor seg = segment(rbuf, off, b);
      store(t, out, seg, b, b);
      off += planner::box_numel(b);
    }
}

// Expert-parallel exchange of rows (dim 0). Dispatch sends each member the rows of its
// experts; return sends them back, so its counts are the dispatch's transposed.
void all_to_all_rows(const planner::Instr& in, TensorTable& t, comm::Communicator& c,
                     MoeState& moe) {
  const core::Graph& g = t.graph();
  const core::Op& op = g.op(in.op);
  const int fwd = op.type == "moe.bwd" ? op.mirror : in.op;
  const auto key = std::make_pair(fwd, in.mb);
  auto it = moe.all.find(key);
  if (it == moe.all.end()) {
    auto own = moe.own.find(key);
    WEFT_CHECK(own != moe.own.end(), "moe dispatch of op ", fwd, " micro-batch ", in.mb,
               " before its routing");
    MoeCounts mc;
    mc.me = c.rank();
    mc.members = c.size();
    mc.experts = int64_t(own->second.size());
    core::Tensor mine = core::Tensor::from_vector<int64_t>({mc.experts}, own->second);
    core::Tensor every = core::Tensor::empty({mc.experts * mc.members}, core::DType::kI64);
    c.all_gather(every, mine).wait();
    std::vector<int64_t> v = every.to_vector<int64_t>();
    for (int s = 0; s < mc.members; ++s)
      mc.rows.emplace_back(v.begin() + s * mc.experts, v.begin() + (s + 1) * mc.experts);
    moe.own.erase(own);
    it = moe.all.emplace(key, std::move(mc)).first;
  }
  const MoeCounts& mc = it->second;
  const bool dispatch = in.part == "moe.dispatch";
  const core::Tensor& x = t.read(in.in[0].tensor);
  // Row width from the plan (a member may receive no rows at all).
  const planner::Box& xb = t.desc(in.in[0].tensor).piece.box;
  const int64_t C = planner::box_numel(xb) / std::max<int64_t>(xb.at(0).numel(), 1);
  std::vector<int64_t> sc, rc;
  for (int m = 0; m < mc.members; ++m) {
    sc.push_back((dispatch ? mc.send_rows(m) : mc.recv_rows(m)) * C);
    rc.push_back((dispatch ? mc.recv_rows(m) : mc.send_rows(m)) * C);
  }
  int64_t st = std::accumulate(sc.begin(), sc.end(), int64_t(0)),
          rt = std::accumulate(rc.begin(), rc.end(), int64_t(0));
  core::Tensor src = x.contiguous();
  const planner::Operand& out = in.out[0];
  core::Tensor* dst;
  if (t.desc(out.tensor).data_dependent) {
    dst = &t.emplace(out.tensor, {rt / std::max<int64_t>(C, 1), C});
  } else {
    dst = &t.write(out.tensor, false);
    dst->zero_();  // rows past the kept assignments stay zero (padding)
  }
  WEFT_CHECK(dst->is_contiguous() && dst->numel() >= rt && src.numel() >= st,
             "moe exchange buffers too small");
  core::Tensor flat_src = src.view({src.numel()}), flat_dst = dst->view({dst->numel()});
  c.all_to_all_v(flat_dst.slice(0, 0, rt), rc, flat_src.slice(0, 0, st), sc).wait();
}

}  // namespace

void PendingCollective::complete() {
  work.wait();
  if (finish) finish();
  finish = nullptr;
  work = comm::Work();
}

PendingCollective start_collective(const planner::Instr& in, TensorTable& t, comm::Communicator& c,
                                   MoeState& moe) {
  WEFT_CHECK(in.in.size() == in.out.size() && !in.in.empty(), "collective with ", in.in.size(),
             " inputs and ", in.out.size(), " outputs");
  switch (in.coll) {
    case planner::CollKind::kAllReduce:
      return all_reduce(in, t, c);
    case planner::CollKind::kReduceScatter:
      return scatter_gather(in, t, c, true);
    case planner::CollKind::kAllGather:
      return scatter_gather(in, t, c, false);
    case planner::CollKind::kAllToAll:
      all_to_all(in, t, c);
      return {};
    case planner::CollKind::kAllToAllV:
      all_to_all_rows(in, t, c, moe);
      return {};
  }
  return {};
}

}  // namespace weft::parallel
