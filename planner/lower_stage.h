// Internal to lowering: builds the programs of all lanes of one pipeline stage at once, so
// that collectives among lanes are emitted at the same point of every member's program.
// Split over lower_stage.cc (operands, units, transfers, recompute), lower_custom.cc
// (vocab-parallel cross-entropy's and expert-parallel MoE's parts and edges), lower_preserve.cc
// (phase 3's pass for state that spans data-parallel replicas and stages) and lower_step.cc
// (the edges of gradients and parameters it serves, the optimizer, frees).
#pragma once

#include <map>
#include <optional>
#include <unordered_map>
#include <vector>

#include "planner/lower.h"
#include "planner/partition.h"
#include "planner/rvd.h"
#include "planner/small_vector.h"

namespace weft::planner {

class StageBuilder {
 public:
  using TensorIds = SmallVector<int, 2>;
  StageBuilder(const GraphInfo& gi, Plan& plan, const CostModel& cost, RvdCache& layouts,
               int stage);
  void build();

 private:
  // Where an instruction sits: its unit (or the step) and whether it re-runs forward work.
  struct Ctx {
    Stage stage = Stage::kForward;
    int mb = -1, chunk = -1;
    bool recompute = false;
    int unit = -1;  // unit instance, for per-unit caches (ZeRO-3 gathered parameters)
  };
  // Per-lane state while building.
  struct Lane {
    // value -> [mb + 1] -> tensors, primary first (mb -1: persistent values). Indexed, not
    // hashed: the lookups are the hottest path of lowering. The per-value vector is sized
    // once (m + 1) when the value first appears, so pointers into it stay valid.
    // A slot's tensors live inline (SmallVector): most hold one, a few a cut or two.
    std::vector<std::vector<TensorIds>> env;
    std::map<int, int> param;        // parameter -> its persistent tensor (ZeRO-3: the shard)
    std::map<int, Piece> param_box;  // parameter -> the piece this lane computes with
    std::map<int, std::pair<int, int>> gathered;  // ZeRO-3: parameter -> (unit, tensor)
    std::map<int, int> grad;         // parameter -> gradient accumulator (ZeRO-2/3: the shard)
    std::map<int, int> synced;       // parameter -> fully reduced gradient (full or shard)
    std::map<std::pair<int, int>, std::vector<int>> moe_saved;  // (op, mb) -> expert-side tensors
  };

  // tensors and instructions
  Role& role(int lane);
  int add_tensor(int lane, TensorDesc t);
  void emit(int lane, Instr in, const Ctx& ctx);
  TensorDesc value_tensor(int value, const Piece& p) const;
  TensorDesc scratch_tensor(const std::string& name, const Piece& p, core::DType dt) const;
  void shift_like(TensorDesc& t, int value, const SubTensor* st) const;
  int64_t slice_shift(int value, int dim) const;

  // sub-ops, environment
  SubOp sub_op(int op, int mb, int lane) const;
  const SubOp& sub_op_mb0(int op, int lane) const;  // partitioned once, then cached
  // Every lane's sub-op of `op` at micro-batch `mb`. Each op keeps one copy of its lanes'
  // sub-ops, shifted in place from the micro-batch it was last asked for: a shift only adds
  // to a few coordinates, where copying the cached sub-ops for every op x micro-batch copied
  // every operand's box (a seventh of lowering at 512 ranks). Valid until the next call for
  // the same op; emit_op, the only caller, does not nest.
  const std::vector<SubOp>& sub_ops(int op, int mb);
  // Moves the batch rows (or a loss's addend index) of `s` by `delta` micro-batches.
  void shift_by_mbs(SubOp& s, int delta) const;
  TensorIds* env_find(int lane, int value, int mb);
  TensorIds& env_slot(int lane, int value, int mb);  // created empty if absent
  void env_add(int lane, int value, int mb, int tensor);
  int value_mb(int value, int mb) const;  // -1 for persistent values

  // operands
  std::vector<int> provide(int value, int mb, const std::vector<std::optional<Piece>>& need,
                           const Ctx& ctx, int op);
  std::vector<int> provide_param(int value, const std::vector<std::optional<Piece>>& need,
                                 const Ctx& ctx, int op);
  int cut(int lane, int from, const Piece& need, const Ctx& ctx, int op);
  std::vector<int> convert(int value, int mb, const std::vector<int>& lanes,
                           const std::vector<std::optional<Piece>>& need, const Ctx& ctx, int op);
  int team_family(const std::vector<int>& lanes);
  Instr collective(CollKind k, int family, int in, int out, int64_t bytes, const Ctx& ctx,
                   int op, const std::string& part, int lane);
  std::vector<int> inputs(int op, const std::vector<SubOp>& subs, int slot, const Ctx& ctx);
  std::vector<int> outputs(int op, const std::vector<SubOp>& subs, int slot, const Ctx& ctx,
                           std::vector<bool>* accumulate);

  // Pipeline transfers (lower_stage.cc). A value crossing stages travels lane to lane as
  // each lane holds it, or, when the lanes of every ep group hold the same piece (replicas
  // over tp) and the cost model prices it lower, as 1/tp of it per lane along `split_dim`:
  // the receiving stage's layout search then re-forms what its ops read (an all-gather
  // among its lanes; Megatron's scatter-gather for pipeline traffic across nodes). Both
  // stages' builders derive the same choice. -1: as is.
  // Decided once per transfer (micro-batches differ only in batch rows, which change
  // neither the replicas nor the bytes) and kept in transfer_split_.
  int transfer_split_dim(const Transfer& t);
  Piece transfer_piece(const Transfer& t, int mb, int lane, int split_dim) const;

  // emission
  void emit_unit(const Unit& u);
  void emit_op(int op, const Ctx& ctx);
  void emit_generic(int op, const std::vector<SubOp>& subs, const Ctx& ctx);
  void emit_ce(int op, const std::vector<SubOp>& subs, const Ctx& ctx);
  void emit_moe(int op, const std::vector<SubOp>& subs, const Ctx& ctx);
  void emit_moe_bwd(int op, const std::vector<SubOp>& subs, const Ctx& ctx);
  // Phase 3's edge of one expert-parallel exchange (lower_custom.cc): `have` -> `sink` per
  // lane, to the experts' lanes (the dispatch) or back (the return). Returns `sink`.
  std::vector<int> moe_exchange(int op, const std::string& part, bool to_experts,
                                const std::vector<int>& have, const std::vector<int>& sink,
                                const Ctx& ctx);
  void ensure_value(int value, const Ctx& ctx);
  void drop_gathered_copies(const Unit& u);
  void after_grad_write(int op, const Ctx& ctx);

  // Phase 3 for a dependency whose devices span data-parallel replicas (and stages): the
  // value is held by every device in one layout and read by some in another; the RVD
  // search over all replicas' pieces finds the cheapest moves and each team becomes a group
  // family (lower_preserve.cc). DP gradient reduction, ZeRO's reduce-scatter and gathers,
  // tp-partial gradients, tied weights across stages, the vocabulary-parallel
  // cross-entropy's row max (V-max) and sums (V-sum) and expert parallelism's dispatch and
  // return (a ragged dim, all_to_all_v) are all edges of this one kind.
  struct Edge {
    // The graph value moved; -1: a custom rule's scratch value (the cross-entropy's row max
    // and sums, a MoE exchange's rows), named and typed by `from` (every device's TensorDesc
    // of it).
    int value = -1;
    std::vector<std::pair<int, int>> devices;  // (stage, lane) of data-parallel replica 0
    std::vector<TensorDesc> from;              // per device: its piece (replica 0, with shifts)
    std::vector<int> have;                     // per device: its tensor here (-1: another stage)
    std::vector<std::optional<TensorDesc>> need;  // per device: what its consumer reads
    // Per device (empty: none): the tensor the result is written into (or added to), so a
    // reduction lands in a gradient accumulator or a gather in the parameter itself.
    std::vector<Operand> sink;
    int op = -1;                    // the op served (the optimizer step of the parameter)
    std::string part;               // label of the moves ("grad.sync", "zero3.gather"...)
    std::string part_stages;        // label of a move whose teams span stages (else `part`)
    bool bucket = false;            // the last move joins the buckets of its kind
    // A dim of `from` and `need` whose extents are known only at run time (MoE routing), -1
    // none: the search moves it by all_to_all_v alone (planner/rvd.h). Such an exchange moves
    // rows by run-time counts, not by boxes, so `from` and `need` may describe the rows in
    // the edge's own coordinates (the ep team's rows) and each sink takes what `need` names.
    int ragged_dim = -1;
  };
  // Per lane of this stage: the tensor that holds its need (-1 where not a device).
  std::vector<int> preserve(const Edge& e, const Ctx& ctx);
  // ZeRO's uneven shards (TensorDesc::shift_limit) in the coordinates the search works in:
  // the search needs pieces that chunk one box evenly, so along `dim` every shard is taken
  // full-size and every piece that ends at `limit` (where the last shard is cut) is grown
  // to `end` (the last full-size shard's end). Moved tensors are cut back at `limit`.
  struct Pad {
    int dim = -1;
    int64_t limit = 0, end = 0;
    Piece grow(Piece p) const;
    void cut(TensorDesc& t) const;
  };
  TensorDesc moved_tensor(const Edge& e, const GroupLayout& after, int at, int per_block,
                          const Pad& pad) const;
  int local_cut(int lane, int from, TensorDesc t, const Ctx& ctx, int op);  // out := the sub-box t of from

  // gradients, optimizer, memory (lower_step.cc)
  struct Holders {
    int count = 1, index = 0, shift = 0;  // data-parallel holders of a gradient: this lane's index
  };
  Holders holders(int param, int lane);
  int param_storage(int lane, int value, const Piece& piece);
  Edge zero3_gather(int value, const std::vector<std::optional<Piece>>& need, const Ctx& ctx,
                    int op, std::vector<int>& have);
  void record_gathered(const Edge& gather, const std::vector<int>& got, const Ctx& ctx,
                       std::vector<int>* have);
  void gather_block(int op, const Ctx& ctx);
  int zero_dim(int param, int lane);
  Piece zero_shard(int param, int lane);
  // A ZeRO shard's replica shift (and, when uneven, where the last holder's shard ends).
  void zero_shift(TensorDesc& t, int param, int lane);
  int grad_tensor(int lane, int param, const Piece& produced, const Ctx& ctx, bool* accumulate);
  Edge grad_edge(int param, const std::vector<int>& grads, const std::vector<int>& stages);
  TensorDesc adamw_piece(int param, int lane);
  void sync_grad(int param, const Ctx& ctx);
  void scatter_grad_mb(int param, const Ctx& ctx);
  void step_phase();
  void add_frees(int lane);
  // Gradient and parameter collectives wait in buckets and go out as one grouped call per
  // bucket (as DDP and Megatron do): fewer launches, same bytes. Any move of a path may
  // wait, not only its last (a MoE gradient's sum inside a replica, then across the
  // replicas), so a bucket may hold the inputs of another: `depth` orders them. A path's
  // last moves have depth 0; an earlier move of an edge whose paths take S steps, at step
  // s, has depth S - s, more than any later move of that edge. An edge's waiting moves all
  // have one part (preserve checks), so a bucket goes out only after every pending bucket
  // of its part of greater depth, which holds whatever it reads.
  struct Bucket {
    CollKind kind = CollKind::kAllReduce;
    std::string part;
    std::vector<int> family;                  // per lane
    int depth = 0;
    std::vector<std::vector<Operand>> in, out;  // per lane
    int64_t bytes = 0;
    int op = -1;
  };
  void bucket_add(CollKind kind, const std::string& part, const std::vector<int>& family, int depth,
                  const std::vector<Operand>& in, const std::vector<Operand>& out, int64_t bytes,
                  int op, const Ctx& ctx);
  // Every bucket, or only those of `part` (the others keep filling); deepest first.
  void flush_buckets(const Ctx& ctx, const std::string& part = "");
  // Emits `out` (buckets, taken from buckets_), deepest first.
  void emit_buckets(std::vector<Bucket> out, const Ctx& ctx);

  const GraphInfo& gi_;
  const core::Graph& g_;
  Plan& plan_;
  const CostModel& cost_;
  RvdCache& layouts_;
  const int stage_, lanes_, tp_, ep_;
  const int64_t m_, K_;  // micro-batches, batch parts (data shards x m)
  bool cross_node_ = false;
  int unit_counter_ = 0;
  std::vector<Lane> lane_;
  std::vector<Unit> units_;
  std::map<int, int> grad_left_;          // ZeRO-0/1: parameter -> gradient writes left on this stage
  std::map<int, int> grad_left_unit_;     // ZeRO-2/3: parameter -> writes left in this unit
  std::vector<Bucket> buckets_;
  // op * lanes + lane -> its sub-op at micro-batch 0 (splits left out: lowering reads the
  // operands only).
  mutable std::vector<std::optional<SubOp>> sub_cache_;
  // sub_ops' copies: per op, every lane's sub-op at micro-batch shifted_mb_[op].
  std::vector<std::vector<SubOp>> shifted_;
  std::vector<int> shifted_mb_;
  std::vector<std::optional<Piece>> need_spare_;  // inputs()' per-lane pieces, kept for reuse
  std::vector<int> transfer_split_;  // per gi_.transfers entry: its split dim, -2 until decided
  bool in_emit_op_ = false;
};

}  // namespace weft::planner
