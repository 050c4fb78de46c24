// The plan artifact: for every rank an ordered program of compute, communication and
// memory instructions over a table of local tensors (each a piece of a global value), plus
// the mesh, the process groups and the decisions that produced it.
//
// Symmetry: ranks that differ only in their data-parallel index run the same program on
// other batch rows (and other ZeRO shards), so the plan stores one program per role
// (pipeline stage x lane, lane = tp + tp_degree * ep) written for dp index 0. In a role,
// Instr::group is a group family and Instr::peer a pipeline stage; Plan::program(rank)
// resolves them to a process-group id and a peer rank and shifts the tensors' boxes.
//
// Executor contract (Plan::program): run the instructions in order. Tensors are allocated
// when an instruction first writes them and released by kFree; persistent tensors exist
// before the first instruction (zeroed gradients at the start of a step) and persist.
// Sends complete asynchronously (the buffer stays valid until the matching receive);
// receives and collectives block. Collective members are listed in group order, which is
// also the order of their chunks along Instr::dim. Compute operands are local tensors:
// each is its piece of the global value (a box, possibly strided chunks, and whether it is
// a partial sum); kernel attributes that depend on shapes (attention's heads, the vocabulary
// or expert offset) follow from those boxes. An alias (a ZeRO shard view, an in-place
// result) shares its root's storage; a view need not be contiguous there.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "planner/box.h"
#include "planner/cost.h"
#include "planner/mesh.h"
#include "planner/operands.h"
#include "planner/policy.h"

namespace weft::planner {

enum class InstrKind : uint8_t {
  kLoad,        // out[0] := rows of an input value (token ids, targets) from the data loader
  kCompute,     // run graph op `op` (or one `part` of its custom rule) on local operands
  kLocal,       // no communication: out[0] := a sub-box of in[0] (chunk), or out += in
  kSend,        // in[0] to rank `peer`, message `tag`
  kRecv,        // out[0] from rank `peer`, message `tag`
  kCollective,  // `coll` over process group `group`: in[k] -> out[k] for every pair, as one
                // grouped call (gradient buckets have several pairs; each pair's dim is
                // Instr::dim for a single pair, else where its in and out boxes differ)
  kFree,        // release every tensor in `in`
};
const char* instr_kind_name(InstrKind k);

enum class Stage : uint8_t { kForward, kBackward, kStep };
const char* stage_name(Stage s);

struct Instr {
  InstrKind kind = InstrKind::kCompute;
  Stage stage = Stage::kForward;
  int op = -1;  // compute: the graph op; a re-layout: the op whose output it converts; else the op served
  std::string part;       // custom-rule stage ("ce.max", "moe.experts", "norm.sumsq"...)
  int mb = -1, chunk = -1;  // micro-batch and model chunk; -1 for per-step work
  bool recompute = false;   // forward work repeated inside a backward unit
  bool data_dependent = false;  // sizes known at run time (MoE routing); bytes estimate
  OperandList in, out;  // stored inline up to OperandList::kInline each (operands.h)
  CollKind coll = CollKind::kAllReduce;
  ReduceOp reduce = ReduceOp::kSum;
  int group = -1;  // role: group family; rank program: process-group id
  int peer = -1;   // role: peer stage; rank program: peer rank
  int64_t tag = -1;
  int64_t bytes = 0;  // collective: the buffer (all_gather: output; others: input); p2p: message
  int dim = -1;       // all_gather / reduce_scatter / all_to_all split dim; local chunk: -1
  int dim2 = -1;      // all_to_all: the dim the received chunks concatenate along
  int64_t groups = 1; // strided groups along `dim` (the (3 h d) qkv layout)
  bool operator==(const Instr& o) const = default;
};

struct TensorDesc {
  int value = -1;    // graph value; -1 for scratch (then `name` says what it is)
  std::string name;
  Piece piece;       // box of the global value (scratch: of its own shape) and value split
  core::DType dtype = core::DType::kF32;
  int64_t bytes = 0;
  bool persistent = false;  // parameters, gradients, optimizer state: live across steps
  bool keep = false;        // read by the trainer after the step (losses): never freed
  bool data_dependent = false;
  int alias_of = -1;  // shares another tensor's storage (a shard view, an in-place result)
  // Per data-parallel index d the box moves by shift*d along shift_dim and the value-split
  // index by shift_part*d (role tables are written for d = 0).
  int shift_dim = -1;
  int64_t shift = 0;
  int32_t shift_part = 0;
  // > 0: the shifted box ends here at most along shift_dim (global coordinates). ZeRO's
  // uneven shards: every holder's shard is described as replica 0's (full) one shifted, and
  // the last holder's is cut at the end of the piece it shards (64 rows: 22, 22, 20).
  int64_t shift_limit = 0;
  bool operator==(const TensorDesc& o) const = default;
};

// The piece `t` stands for at data-parallel index `dp`: its box shifted and, with `clip`,
// cut at t.shift_limit (without: the full-size shard the shift describes, the coordinates
// phase 3's search works in).
Piece replica_piece(const TensorDesc& t, int dp, bool clip = true);

// Ranks = { rank(stage, lane, dp) : (stage, lane) in members, dp = own (one group per dp
// index) or all (one group, dp-major order) }.
struct GroupFamily {
  std::vector<std::pair<int, int>> members;  // (stage, lane), in group order
  bool all_dp = false;
  int first_group = -1;
  bool operator==(const GroupFamily& o) const = default;
};
struct ProcessGroup {
  int id = -1, family = -1;
  std::vector<int> ranks;
};

struct Role {
  int stage = 0, lane = 0;
  std::vector<TensorDesc> tensors;
  std::vector<Instr> program;
  bool operator==(const Role& o) const = default;
};

struct RankProgram {
  int rank = 0, role = 0;
  Coord coord;
  std::vector<TensorDesc> tensors;
  std::vector<Instr> program;
};

// Simulator output, kept apart from the decisions (a plan read back with other costs
// is the same plan).
struct RankCost {
  // comm_s: time moving data; wait_s: time blocked on peers (pipeline bubbles, stragglers).
  double step_s = 0, compute_s = 0, comm_s = 0, wait_s = 0, bubble = 0;
  // The part of wait_s blocked on a pipeline message (a receive whose send had not left):
  // the rank leaves its core to the others (CostModel::active_ranks counts runnable ranks).
  // The simulator's own figure; not written to plan JSON.
  double recv_wait_s = 0;
  int64_t peak_bytes = 0, persistent_bytes = 0;
  int64_t comm_bytes[kCollKinds] = {0, 0, 0, 0, 0};  // wire bytes sent, by collective kind
  int64_t p2p_bytes = 0;
};
struct CostAnnotations {
  bool valid = false;
  CostModel model;
  std::vector<RankCost> ranks;
  double step_s = 0, bubble = 0;
  double pipeline_estimate_s = 0;  // sum of stage times + (m-1) x the slowest stage
  double exchange_s = 0;  // the trainer's statistics exchange (step_end.h), in every rank's step
  std::vector<double> stage_s;     // per stage: one micro-batch's forward + backward
  double planning_s = 0;
};

struct Plan {
  // decisions
  Mesh mesh;
  ParallelConfig config;
  std::vector<OpDecision> decisions;  // forward ops; backward ops follow their mirror
  std::vector<GroupFamily> families;
  std::vector<ProcessGroup> groups;
  std::vector<Role> roles;  // index stage * lanes + lane
  uint64_t model_hash = 0, shape_hash = 0;
  // cost annotations
  CostAnnotations costs;

  int world() const { return mesh.world(); }
  int role_index(int rank) const;
  const Role& role_of(int rank) const { return roles.at(size_t(role_index(rank))); }
  int group_id(int family, int dp) const;
  int peer_rank(int rank, int peer_stage) const;
  // The rank's concrete program: boxes shifted to its data-parallel index, group
  // families resolved to process groups, peer stages to ranks.
  RankProgram program(int rank) const;
  TensorDesc tensor_for(const TensorDesc& t, int dp) const;
};

// Registers a family (deduplicated) and returns its id; groups are built by build_groups.
int add_family(Plan& plan, GroupFamily f);
// Enumerates every process group of every family (ids in family order).
void build_groups(Plan& plan);

}  // namespace weft::planner
