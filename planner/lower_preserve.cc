// Phase 3 for dependencies that span data-parallel replicas and pipeline stages: one pass
// that compares what every device holds with what its consumer reads and inserts the moves
// the RVD search finds. The plan stores one program per (stage, lane) for replica 0 and
// shifts it for the others (planner/plan.h), so the search sees every replica's piece
// (blocks = dp; replica 0's alone where replicas touch nothing of each other's) and keeps
// only teams a group family can name; the moves are then emitted for this stage's devices
// of replica 0, each output described with its shift.
#include <algorithm>
#include <map>
#include <set>

#include "base/check.h"
#include "base/error.h"
#include "planner/lower_stage.h"

namespace weft::planner {

Piece StageBuilder::Pad::grow(Piece p) const {
  if (dim < 0) return p;
  DimSlice& s = p.box[size_t(dim)];
  if (s.count == 1 && s.start + s.size == limit) s.size = end - s.start;
  return p;
}

void StageBuilder::Pad::cut(TensorDesc& t) const {
  if (dim < 0) return;
  DimSlice& s = t.piece.box[size_t(dim)];
  if (t.shift_dim == dim) t.shift_limit = limit;
  if (s.count != 1 || s.start + s.size <= limit) return;
  s.size = limit - s.start;
  t.bytes = t.piece.numel() * int64_t(core::dtype_size(t.dtype));
}

int StageBuilder::local_cut(int lane, int from, TensorDesc t, const Ctx& ctx, int op) {
  t.bytes = t.piece.numel() * int64_t(core::dtype_size(t.dtype));
  const int id = add_tensor(lane, t);
  Instr c;
  c.kind = InstrKind::kLocal;
  c.op = op;
  c.part = "chunk";
  c.in = {{-1, from}};
  c.out = {{-1, id}};
  emit(lane, c, ctx);
  return id;
}

TensorDesc StageBuilder::moved_tensor(const Edge& e, const GroupLayout& after, int at,
                                      int per_block, const Pad& pad) const {
  // The piece a device of replica `b` holds, in the search's coordinates.
  auto at_replica = [&](const TensorDesc& t, int b) {
    return pad.grow(replica_piece(t, b, false));
  };
  const std::string& name = e.value >= 0 ? g_.value(e.value).name : e.from[0].name;
  TensorDesc t = e.value >= 0 ? value_tensor(e.value, after[size_t(at)])
                              : scratch_tensor(name, after[size_t(at)], e.from[0].dtype);
  t.persistent = false;
  const int blocks = int(after.size()) / per_block;
  if (blocks < 2) {
    pad.cut(t);
    return t;
  }
  // Replica 1's piece says how the piece moves per replica; every later replica must move
  // by the same step again, or the program written for replica 0 would not serve it.
  const Piece& next = after[size_t(at + per_block)];
  t.shift_part = next.part - t.piece.part;
  for (size_t d = 0; d < t.piece.box.size(); ++d)
    if (next.box[d].start != t.piece.box[d].start) {
      WEFT_CHECK(t.shift_dim < 0, "a moved piece of ", name, " shifts along two dims");
      t.shift_dim = int(d);
      t.shift = next.box[d].start - t.piece.box[d].start;
    }
  for (int b = 2; b < blocks; ++b)
    WEFT_CHECK(at_replica(t, b) == after[size_t(at + b * per_block)], "replica ", b, "'s piece of ",
               name, " is not replica 0's shifted ", b, " times");
  pad.cut(t);
  return t;
}

namespace {

// Bounding ranges of a box (a strided slice spans from its first chunk's start to its last
// chunk's end).
Box extent_of(const Box& b) {
  Box out = b;
  cover(out, b);
  return out;
}

bool extents_overlap(const Box& a, const Box& b) {
  for (size_t d = 0; d < a.size(); ++d)
    if (a[d].start >= b[d].start + b[d].size || b[d].start >= a[d].start + a[d].size) return false;
  return true;
}

// True when the data-parallel replicas of an edge touch nothing of each other's: every piece
// held or needed moves per replica by one step along one dim (no addend index: replicas of
// a sum over the batch must meet), and replica 0's pieces together span no more than that
// step. Each replica is then the same problem shifted (a loss's row max on its own batch
// rows): replica 0 alone is searched, which at dp 512 is 512 times fewer members.
bool replicas_apart(const std::vector<TensorDesc>& from, const std::vector<std::optional<TensorDesc>>& need,
                    int blocks) {
  const TensorDesc& f0 = from[0];
  if (blocks < 2 || f0.shift_dim < 0 || f0.shift == 0) return false;
  Box span = extent_of(f0.piece.box);
  auto joins = [&](const TensorDesc& t) {
    if (t.shift_dim != f0.shift_dim || t.shift != f0.shift || t.shift_part != 0) return false;
    cover(span, extent_of(t.piece.box));
    return true;
  };
  for (size_t p = 0; p < from.size(); ++p)
    if (!joins(from[p]) || (need[p] && !joins(*need[p]))) return false;
  return span[size_t(f0.shift_dim)].size <= (f0.shift < 0 ? -f0.shift : f0.shift);
}

}  // namespace

std::vector<int> StageBuilder::preserve(const Edge& e, const Ctx& ctx) {
  const int n = int(e.devices.size());
  WEFT_CHECK(n > 0 && int(e.from.size()) == n && int(e.have.size()) == n && int(e.need.size()) == n &&
                 (e.sink.empty() || int(e.sink.size()) == n),
             "preserve: one entry per device");
  const core::DType dtype = e.value >= 0 ? g_.value(e.value).dtype : e.from[0].dtype;
  // The replicas the search sees: all of them, or replica 0 alone where they are apart (its
  // results then move per replica as the edge's pieces do).
  const int dp = int(plan_.mesh.degrees().dp);
  const bool apart = replicas_apart(e.from, e.need, dp);
  const int blocks = apart ? 1 : dp;
  // ZeRO's uneven shards: each part (below) is searched in its own padded coordinates, where
  // every shard is full-size. A replica's shard is (unclipped); at dp 1 the last ep lane's
  // role holds its short shard itself (zero_dim), padded here to the others' size.
  auto pad_of = [&](const std::vector<int>& pos) {
    Pad pad;
    std::vector<DimSlice> shards;
    auto add = [&](const TensorDesc& t) {
      if (t.shift_limit <= 0) return;
      WEFT_CHECK(pad.dim < 0 || (pad.dim == t.shift_dim && pad.limit == t.shift_limit),
                 "uneven shards of one piece cut along two dims or at two ends");
      pad.dim = t.shift_dim, pad.limit = t.shift_limit;
      for (int b = 0; b < dp; ++b)
        shards.push_back(replica_piece(t, b, false).box[size_t(t.shift_dim)]);
    };
    for (int p : pos) {
      add(e.from[size_t(p)]);
      if (e.need[size_t(p)]) add(*e.need[size_t(p)]);
    }
    int64_t full = 0;
    for (const DimSlice& s : shards) full = std::max(full, s.size);
    for (const DimSlice& s : shards)
      pad.end = std::max(pad.end, s.start + (s.start + s.size == pad.limit ? full : s.size));
    return pad;
  };
  auto at_replica = [&](const TensorDesc& t, int b, const Pad& pad) {
    return pad.grow(replica_piece(t, b, false));
  };
  auto moved = [&](const GroupLayout& after, int at, int per_block, int p, const Pad& pad) {
    TensorDesc t = moved_tensor(e, after, at, per_block, pad);
    if (apart) {
      t.shift_dim = e.from[size_t(p)].shift_dim, t.shift = e.from[size_t(p)].shift;
      t.shift_limit = e.from[size_t(p)].shift_limit;
    }
    return t;
  };

  // Devices whose pieces (over every replica) touch no other's are separate problems: the
  // two halves of an unevenly split vocabulary each gather within their own holders. The
  // layout search needs pieces that chunk one box evenly, so each part searches alone.
  std::vector<Box> extent(static_cast<size_t>(n));
  for (int p = 0; p < n; ++p) {
    extent[size_t(p)] = extent_of(e.from[size_t(p)].piece.box);
    for (int b = 0; b < blocks; ++b) {
      cover(extent[size_t(p)], extent_of(replica_piece(e.from[size_t(p)], b).box));
      if (e.need[size_t(p)])
        cover(extent[size_t(p)], extent_of(replica_piece(*e.need[size_t(p)], b).box));
    }
  }
  std::vector<int> root(static_cast<size_t>(n));
  for (int p = 0; p < n; ++p) root[size_t(p)] = p;
  auto find = [&](int p) {
    while (root[size_t(p)] != p) p = root[size_t(p)] = root[size_t(root[size_t(p)])];
    return p;
  };
  for (int p = 0; p < n; ++p)
    for (int q = p + 1; q < n; ++q)
      if (extents_overlap(extent[size_t(p)], extent[size_t(q)])) root[size_t(find(q))] = find(p);

  struct Part {
    std::vector<int> pos;  // devices (positions in e.devices), ascending
    RvdPath path;
    GroupLayout held;      // every member's piece before the next move
    size_t last = 0;       // index past the last collective
    bool direct = true;    // nothing follows the last collective (it may write into the sinks)
    Pad pad;               // uneven ZeRO shards: the padded coordinates it is searched in
  };
  std::vector<Part> parts;
  std::map<int, size_t> part_of_root;
  for (int p = 0; p < n; ++p) {
    auto [it, fresh] = part_of_root.emplace(find(p), parts.size());
    if (fresh) parts.emplace_back();
    parts[it->second].pos.push_back(p);
  }
  for (Part& P : parts) {
    const int k = int(P.pos.size());
    P.pad = pad_of(P.pos);
    GroupLayout from(size_t(k * blocks));
    std::vector<std::optional<Piece>> need(size_t(k * blocks));
    Box whole = e.from[size_t(P.pos[0])].piece.box;
    std::set<int> nodes;
    for (int b = 0; b < blocks; ++b)
      for (int i = 0; i < k; ++i) {
        const int p = P.pos[size_t(i)], m = b * k + i;
        from[size_t(m)] = at_replica(e.from[size_t(p)], b, P.pad);
        cover(whole, from[size_t(m)].box);
        if (e.need[size_t(p)]) {
          need[size_t(m)] = at_replica(*e.need[size_t(p)], b, P.pad);
          cover(whole, need[size_t(m)]->box);
        }
        nodes.insert(plan_.mesh.rank_of(e.devices[size_t(p)].first, e.devices[size_t(p)].second, b) /
                     cost_.ranks_per_node);
      }
    P.path = rvd_search(from, need, whole, int64_t(core::dtype_size(dtype)), cost_, nodes.size() > 1,
                        &layouts_, blocks, e.ragged_dim, plan_.world());
    P.held = from;
    P.last = P.path.moves.size();
    while (P.last > 0 && P.path.moves[P.last - 1].kind == MoveKind::kChunk) --P.last;
    // The last collective may only be deferred (bucketed) or write into the destination
    // when nothing follows it: no trailing cut.
    const GroupLayout& end = P.path.moves.empty() ? from : P.path.moves.back().after;
    P.direct = P.last > 0 && P.last == P.path.moves.size();
    for (int i = 0; i < k && P.direct; ++i) {
      const int p = P.pos[size_t(i)];
      const bool sink = !e.sink.empty() && e.sink[size_t(p)].tensor >= 0;
      if (sink && e.ragged_dim < 0)
        P.direct =
            end[size_t(i)] ==
            at_replica(role(e.devices[size_t(p)].second).tensors[size_t(e.sink[size_t(p)].tensor)],
                       0, P.pad);
      else if (e.need[size_t(p)])
        P.direct = end[size_t(i)] == at_replica(*e.need[size_t(p)], 0, P.pad);
    }
  }

  std::vector<int> cur(static_cast<size_t>(n), -1);
  for (int p = 0; p < n; ++p)
    if (e.devices[size_t(p)].first == stage_) cur[size_t(p)] = e.have[size_t(p)];
  // The moves go out in step over the parts, so that the same move of every part joins one
  // bucket (or one program point) on every lane.
  struct LaneCall {
    int fam = -1;
    Operand in, out;
    int dim = -1, dim2 = -1;
    int64_t groups = 1;
  };
  struct Batch {
    ReduceOp reduce = ReduceOp::kSum;
    std::vector<LaneCall> lanes;
    int64_t bytes = 0;
    bool final_all = true, spans_stages = false;
  };
  size_t steps = 0;
  for (const Part& P : parts) steps = std::max(steps, P.path.moves.size());
  // Which batches (a step's collectives of one kind and operator, over the parts) wait in a
  // bucket. A waiting collective's output exists only once its bucket goes out, so a batch
  // may wait only if everything that reads its output waits too, in a bucket that goes out
  // after it: each part's next move (in a batch that waits), or, after its last, nothing
  // (no cut or copy into the destination: `direct`). Buckets sum, and a bucket holds one
  // call on every lane.
  using BatchKey = std::pair<CollKind, ReduceOp>;
  auto key_of = [](const Move& mv) { return BatchKey{move_collective(mv.kind), mv.reduce}; };
  std::vector<std::map<BatchKey, bool>> waits(steps);
  if (e.bucket)
    for (size_t step = steps; step-- > 0;) {
      std::map<BatchKey, std::vector<char>> lanes_in;  // lanes with a call in the batch
      std::map<BatchKey, bool> ok;
      for (const Part& P : parts) {
        if (step >= P.path.moves.size()) continue;
        const Move& mv = P.path.moves[step];
        if (mv.kind == MoveKind::kChunk) continue;
        const BatchKey key = key_of(mv);
        const int k = int(P.pos.size());
        std::vector<char>& in = lanes_in[key];
        in.resize(size_t(lanes_), 0);
        for (const auto& team : mv.teams)
          for (int m : team)
            if (m < k && e.devices[size_t(P.pos[size_t(m)])].first == stage_)
              in[size_t(e.devices[size_t(P.pos[size_t(m)])].second)] = 1;
        bool& batch_ok = ok.emplace(key, mv.reduce == ReduceOp::kSum).first->second;
        if (step + 1 == P.path.moves.size())
          batch_ok = batch_ok && P.direct;
        else {
          const Move& next = P.path.moves[step + 1];
          batch_ok = batch_ok && next.kind != MoveKind::kChunk && waits[step + 1][key_of(next)];
        }
      }
      for (auto& [key, in] : lanes_in)
        waits[step][key] = ok[key] && std::all_of(in.begin(), in.end(), [](char c) { return c != 0; });
    }
  std::string waiting_part;  // the part of this edge's waiting batches (lower_stage.h's Bucket)
  for (size_t step = 0; step < steps; ++step) {
    // A sum and a max are different calls even where both are all-reduces.
    std::map<std::pair<CollKind, ReduceOp>, Batch> batches;
    for (Part& P : parts) {
      if (step >= P.path.moves.size()) continue;
      const Move& mv = P.path.moves[step];
      const int k = int(P.pos.size());
      if (mv.kind == MoveKind::kChunk) {
        for (int i = 0; i < k; ++i) {
          const int p = P.pos[size_t(i)];
          if (cur[size_t(p)] >= 0 && !(P.held[size_t(i)] == mv.after[size_t(i)]))
            cur[size_t(p)] = local_cut(e.devices[size_t(p)].second, cur[size_t(p)],
                                       moved(mv.after, i, k, p, P.pad), ctx, e.op);
        }
        P.held = mv.after;
        continue;
      }
      const bool into_sink = step + 1 == P.last && P.direct && !e.sink.empty();
      const CollKind kind = move_collective(mv.kind);
      Batch& batch = batches[{kind, mv.reduce}];
      batch.reduce = mv.reduce;
      batch.lanes.resize(size_t(lanes_));
      batch.final_all = batch.final_all && step + 1 == P.last && P.direct;
      std::vector<int> next = cur;
      for (const auto& team : mv.teams) {
        // Only teams with a member here (replica 0, this stage) are this builder's to emit.
        if (std::none_of(team.begin(), team.end(),
                         [&](int m) { return m < k && cur[size_t(P.pos[size_t(m)])] >= 0; }))
          continue;
        GroupFamily f;
        for (int m : team) {
          if (m >= k) {  // the team spans replicas: its replica-0 members name it
            f.all_dp = true;
            break;
          }
          f.members.push_back(e.devices[size_t(P.pos[size_t(m)])]);
          batch.spans_stages = batch.spans_stages || f.members.back().first != f.members.front().first;
        }
        const int fam = add_family(plan_, f);
        for (int m : team) {
          if (m >= k || cur[size_t(P.pos[size_t(m)])] < 0) continue;
          const int p = P.pos[size_t(m)], l = e.devices[size_t(p)].second;
          // A copy: add_tensor below may grow the role's tensors (a reference would dangle).
          const int64_t src_bytes = role(l).tensors[size_t(cur[size_t(p)])].bytes;
          Operand out;
          if (into_sink && e.sink[size_t(p)].tensor >= 0) {
            out = e.sink[size_t(p)];
          } else {
            TensorDesc t = moved(mv.after, m, k, p, P.pad);
            t.data_dependent = e.ragged_dim >= 0;
            // A reduction in place: the addend is dead once combined (a gradient
            // accumulator's storage becomes the reduced gradient, as DDP does).
            if (kind == CollKind::kAllReduce) t.alias_of = cur[size_t(p)];
            out.tensor = add_tensor(l, t);
          }
          batch.bytes = std::max(batch.bytes, kind == CollKind::kAllGather
                                                  ? role(l).tensors[size_t(out.tensor)].bytes
                                                  : src_bytes);
          batch.lanes[size_t(l)] = {fam, {-1, cur[size_t(p)]}, out, mv.dim, mv.dim2, mv.groups};
          next[size_t(p)] = out.tensor;
        }
      }
      cur = next;
      P.held = mv.after;
    }
    for (auto& [key, batch] : batches) {
      const CollKind kind = key.first;
      const std::string& part = batch.spans_stages && !e.part_stages.empty() ? e.part_stages : e.part;
      const bool every_lane = std::all_of(batch.lanes.begin(), batch.lanes.end(),
                                          [](const LaneCall& c) { return c.fam >= 0; });
      if (waits[step][key]) {
        WEFT_CHECK(every_lane, "a waiting batch of ", part, " lacks a lane");
        // Buckets flush by part, deepest first: a waiting move must share its part with
        // the waiting moves it reads.
        WEFT_CHECK(waiting_part.empty() || waiting_part == part, "waiting moves of one edge in parts ",
                   waiting_part, " and ", part);
        waiting_part = part;
        std::vector<int> fams;
        std::vector<Operand> ins, outs;
        for (const LaneCall& c : batch.lanes) fams.push_back(c.fam), ins.push_back(c.in), outs.push_back(c.out);
        // Depth (lower_stage.h's Bucket): a batch of last moves 0, an earlier one more than
        // any later batch of this edge.
        const int depth = batch.final_all ? 0 : int(steps - step);
        bucket_add(kind, part, fams, depth, ins, outs, batch.bytes, e.op, ctx);
        continue;
      }
      for (int l = 0; l < lanes_; ++l) {
        const LaneCall& lc = batch.lanes[size_t(l)];
        if (lc.fam < 0) continue;
        Instr c = collective(kind, lc.fam, lc.in.tensor, lc.out.tensor, batch.bytes, ctx, e.op, part, l);
        c.out[0].accumulate = lc.out.accumulate;
        c.reduce = batch.reduce;
        c.dim = lc.dim;
        c.dim2 = lc.dim2;
        c.groups = lc.groups;
        c.data_dependent = kind == CollKind::kAllToAllV;  // its counts come with the routing
        emit(l, c, ctx);
      }
    }
  }
  // What the moves leave is cut to each consumer's piece, or copied (added) into the
  // destination when the last collective could not write there itself.
  for (const Part& P : parts)
    for (size_t i = 0; i < P.pos.size(); ++i) {
      const int p = P.pos[i];
      if (cur[size_t(p)] < 0 || !e.need[size_t(p)]) continue;
      const int l = e.devices[size_t(p)].second;
      const bool sink = !e.sink.empty() && e.sink[size_t(p)].tensor >= 0;
      if (sink && cur[size_t(p)] == e.sink[size_t(p)].tensor) continue;
      if (!sink && P.held[i] == at_replica(*e.need[size_t(p)], 0, P.pad)) continue;
      Instr c;
      c.kind = InstrKind::kLocal;
      c.op = e.op;
      c.part = "chunk";
      c.in = {{-1, cur[size_t(p)]}};
      if (sink) {
        c.out = {e.sink[size_t(p)]};
        cur[size_t(p)] = e.sink[size_t(p)].tensor;
        emit(l, c, ctx);
        continue;
      }
      TensorDesc t = *e.need[size_t(p)];
      t.persistent = false, t.alias_of = -1, t.keep = false;
      cur[size_t(p)] = local_cut(l, cur[size_t(p)], t, ctx, e.op);
    }
  std::vector<int> by_lane(static_cast<size_t>(lanes_), -1);
  for (int p = 0; p < n; ++p)
    if (cur[size_t(p)] >= 0) by_lane[size_t(e.devices[size_t(p)].second)] = cur[size_t(p)];
  return by_lane;
}

}  // namespace weft::planner
