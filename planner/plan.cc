// Plan queries: role lookup, group families, per-rank materialisation.
#include "planner/plan.h"

#include <algorithm>

#include "base/check.h"

namespace weft::planner {

const char* instr_kind_name(InstrKind k) {
  switch (k) {
    case InstrKind::kLoad: return "load";
    case InstrKind::kCompute: return "compute";
    case InstrKind::kLocal: return "local";
    case InstrKind::kSend: return "send";
    case InstrKind::kRecv: return "recv";
    case InstrKind::kCollective: return "collective";
    case InstrKind::kFree: return "free";
  }
  return "?";
}

const char* stage_name(Stage s) {
  switch (s) {
    case Stage::kForward: return "forward";
    case Stage::kBackward: return "backward";
    case Stage::kStep: return "step";
  }
  return "?";
}

int Plan::role_index(int rank) const {
  Coord c = mesh.coord(rank);
  return c.pp * mesh.lanes() + mesh.lane(c);
}

int Plan::group_id(int family, int dp) const {
  const GroupFamily& f = families.at(size_t(family));
  WEFT_CHECK(f.first_group >= 0, "groups not built");
  return f.all_dp ? f.first_group : f.first_group + dp;
}

int Plan::peer_rank(int rank, int peer_stage) const {
  Coord c = mesh.coord(rank);
  c.pp = peer_stage;
  return mesh.rank(c);
}

Piece replica_piece(const TensorDesc& t, int dp, bool clip) {
  Piece p = t.piece;
  if (t.shift_dim >= 0) {
    DimSlice& s = p.box.at(size_t(t.shift_dim));
    s.start += t.shift * dp;
    if (clip && t.shift_limit > 0) s.size = std::min(s.size, t.shift_limit - s.start);
  }
  p.part += t.shift_part * dp;
  return p;
}

TensorDesc Plan::tensor_for(const TensorDesc& t, int dp) const {
  if (dp == 0) return t;
  TensorDesc out = t;
  out.piece = replica_piece(t, dp);
  if (out.piece.numel() != t.piece.numel()) {
    WEFT_CHECK(out.piece.numel() > 0, "replica ", dp, "'s piece of ", t.name, " is empty");
    out.bytes = t.bytes / t.piece.numel() * out.piece.numel();
  }
  return out;
}

RankProgram Plan::program(int rank) const {
  RankProgram p;
  p.rank = rank;
  p.role = role_index(rank);
  p.coord = mesh.coord(rank);
  const Role& r = roles.at(size_t(p.role));
  p.tensors.reserve(r.tensors.size());
  for (const TensorDesc& t : r.tensors) p.tensors.push_back(tensor_for(t, p.coord.dp));
  p.program = r.program;
  for (Instr& in : p.program) {
    if (in.kind == InstrKind::kCollective) in.group = group_id(in.group, p.coord.dp);
    if (in.kind == InstrKind::kSend || in.kind == InstrKind::kRecv) in.peer = peer_rank(rank, in.peer);
  }
  return p;
}

int add_family(Plan& plan, GroupFamily f) {
  f.first_group = -1;
  for (size_t i = 0; i < plan.families.size(); ++i) {
    const GroupFamily& g = plan.families[i];
    if (g.members == f.members && g.all_dp == f.all_dp) return int(i);
  }
  plan.families.push_back(std::move(f));
  return int(plan.families.size()) - 1;
}

void build_groups(Plan& plan) {
  plan.groups.clear();
  const Mesh& m = plan.mesh;
  int dp = int(m.degrees().dp);
  for (size_t fi = 0; fi < plan.families.size(); ++fi) {
    GroupFamily& f = plan.families[fi];
    f.first_group = int(plan.groups.size());
    auto make = [&](int d0, int d1) {
      ProcessGroup g;
      g.id = int(plan.groups.size());
      g.family = int(fi);
      for (int d = d0; d < d1; ++d)
        for (auto [stage, lane] : f.members) g.ranks.push_back(m.rank_of(stage, lane, d));
      plan.groups.push_back(std::move(g));
    };
    if (f.all_dp) make(0, dp);
    else
      for (int d = 0; d < dp; ++d) make(d, d + 1);
  }
}

}  // namespace weft::planner
