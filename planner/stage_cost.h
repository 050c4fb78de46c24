// The plan search's stage-level cost model: what one rank of a (tp, ep, micro_batch) split
// spends per layer on one micro-batch (the graph's ops at their local shapes under the
// CostModel, plus the tensor- and expert-parallel collectives the split implies), and a
// whole candidate's step time and memory from its stages, its schedule and its gradient
// traffic. Nothing is lowered to per-rank programs; simulate_plan of the lowered plan is the
// reference it is tested against (tests/planner/search_test.cc).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/config/job_spec.h"
#include "core/graph/graph.h"
#include "planner/cost.h"
#include "planner/mesh.h"
#include "planner/policy.h"

namespace weft::planner {

// Per layer and per micro-batch, seconds on one rank of the split.
struct SplitCosts {
  std::vector<double> fwd, bwd;  // compute + tensor/expert-parallel collectives
  std::vector<double> attn_fwd;  // attention's forward compute (selective recompute re-runs it)
  double embed_fwd = 0, embed_bwd = 0;  // the embedding (first stage)
  double head_fwd = 0, head_bwd = 0;    // final norm, head and loss (last stage)
  // What the same collectives' waits add to the replica's drift (CostModel::wait_variance
  // of each call's sync_wait), seconds^2, likewise per layer, embedding and head.
  std::vector<double> fwd_var, bwd_var;
  double embed_fwd_var = 0, embed_bwd_var = 0, head_fwd_var = 0, head_bwd_var = 0;
  // This rank's parameter bytes, per layer and outside the layers.
  std::vector<double> param_bytes;
  double embed_param_bytes = 0, head_param_bytes = 0;
  // Of the head's parameters, those the embedding reads too (a tied embedding): one tensor
  // where one chunk holds both ends (pp 1), counted in each above.
  double tied_param_bytes = 0;
  // Each parameter's bytes on this rank, in the order the forward first reads them: per
  // layer, the embedding's, the head's (with whether it is a tied tensor, read at both
  // ends). What the gradient and parameter buckets are counted from (buckets.h).
  std::vector<std::vector<double>> param_sizes;
  std::vector<double> embed_param_sizes, head_param_sizes;
  std::vector<bool> embed_param_tied, head_param_tied;
  double boundary_bytes = 0;  // the activation one micro-batch sends across a stage boundary
  double grad_elem = 4;       // bytes per gradient element
  // Tensor- and expert-parallel collectives of one micro-batch through every layer, the
  // embedding and the head (0 without tp or ep): whether a rank synchronises within its units.
  int64_t layer_calls = 0;
};

// Where a group's collectives run: across nodes or inside one (the mesh's rank order), and
// in a job of how many ranks.
struct Crossing {
  bool tp = false, ep = false, dp = false, pp = false;
  // The candidate's ranks (0: unknown). Every collective is priced at it as the RVD search
  // prices a move (planner/rvd.cc): launch_oversub where a node runs more ranks than cores.
  int world = 0;
};
// One collective of a candidate: CostModel::collective's launch, steps and bytes (the bytes
// at one rank per core, as the layout search prices them: the simulator's processor
// sharing is a fixed point of the finished plan), plus CostModel::oversub_launch at `world`
// (launch_oversub, or 0 where sync_wait_oversub_by_burst prices an oversubscribed call).
double collective_at(const CostModel& cost, CollKind k, int n, int64_t bytes, bool cross_node, int world);
Crossing crossing(const Degrees& deg, const std::vector<Axis>& order, int ranks_per_node);

// The stage model's CostModel::active_ranks for a candidate of `world` ranks: where a node
// runs more ranks than cores, its ranks times the share of the step a stage is busy in the
// pipeline schedule (time_schedule with every chunk's forward 1 and backward 2: a stage in
// its bubble waits for a message and leaves its core to the others, as simulate_plan
// counts); 0 (every rank runnable) within the cores, without a pipeline, or on GPUs. The
// search prices a candidate's waits with it (CostModel::runnable_weight), so that a
// pipeline over the cores is not charged the wait of a probe whose every rank looped.
double schedule_runnable(const CostModel& cost, int world, const std::string& schedule, int pp,
                         int v, int m);

// The split's per-layer costs. `g` is the planning graph (batch = global_batch); the batch
// splits into global_batch / micro_batch pieces of micro_batch sequences. With
// `sequence_parallel` the norms and residual adds run on 1/tp of the tokens, each tp
// all-reduce is a reduce-scatter plus an all-gather, and each norm output is gathered once
// more in the backward (lower_stage.cc's drop_gathered_copies).
SplitCosts split_costs(const core::Graph& g, const CostModel& cost, int64_t global_batch,
                       int64_t tp, int64_t ep, int64_t micro_batch, const Crossing& cross,
                       bool sequence_parallel = false);

// A candidate's settings once every key is chosen.
struct Layout {
  Degrees deg;
  int zero = 0;
  std::string schedule = "1f1b", recompute = "none";
  bool sequence_parallel = false;
  int64_t virtual_stages = 1, micro_batch = 1, micro_batches = 1;
  std::vector<int64_t> chunk_layers;  // layers per model chunk (pp x virtual_stages chunks)
  int64_t bucket_bytes = ParallelConfig{}.bucket_bytes;  // the job's (ParallelConfig's)
};

// The gradient buckets of model chunk `chunk` (layers begin..end) that a data-parallel sync
// goes out in (ZeRO-0/1 after the chunk's last backward, ZeRO-2/3 after each micro-batch's):
// buckets.h's rule on its parameters in the order the backward completes their gradients
// (the head's, the layers' last to first, the embedding's), at the layout's bucket_bytes. A
// tied embedding's gradient is in them once where one chunk holds both ends; across chunks
// the lowering reduces it in the step instead (lower_step.cc's grad.tied).
int64_t chunk_grad_buckets(const SplitCosts& sc, const Layout& l, int chunk, int64_t begin,
                           int64_t end);

struct Prediction {
  double step_s = 0, bubble = 0;
  double memory_bytes = 0;          // the largest stage's estimate
  std::vector<double> stage_bytes;  // per stage
  double pipeline_s = 0;            // the schedule's makespan (before the step-end work)
  double exchange_s = 0;            // the trainer's statistics exchange (step_end.h), in step_s
};

// Micro-batches of activations each stage holds at its peak under the schedule.
std::vector<int64_t> stage_in_flight(const std::string& schedule, int pp, int v, int m);

// One stage's units: each chunk's forward and backward time per micro-batch, from the
// layers it holds (first..last layer index, exclusive end). The stage-boundary messages are
// not in them: predict's time_schedule times those (schedule.h's Boundaries).
struct ChunkTime {
  double fwd = 0, bwd = 0;
  // The variance each unit adds to its replica's drift: its tensor/expert-parallel calls'
  // (CostModel::wait_variance).
  double fwd_var = 0, bwd_var = 0;
  // Whether the unit runs a collective (a tensor/expert-parallel call, a ZeRO-3 gather, a
  // ZeRO-2/3 reduce-scatter): its stage's burst restarts inside it.
  bool fwd_syncs = false, bwd_syncs = false;
};
ChunkTime chunk_time(const SplitCosts& sc, const Layout& l, const CostModel& cost,
                     const Crossing& cross, int chunk, int64_t begin, int64_t end);

// What chunk `chunk` of `chunks` spends per micro-batch on its stage-boundary messages,
// were each to wait as right after a synchronisation (CostModel::message_wait at no burst):
// the transfer, the wait and the sender's part of each one it receives and sends on. For
// the search's stage boundaries (predict times the messages through the schedule).
double chunk_messages_s(const SplitCosts& sc, const CostModel& cost, const Crossing& cross,
                        int chunk, int chunks);

// Step time, bubble and memory of a full candidate.
Prediction predict(const core::ModelSpec& m, const SplitCosts& sc, const Layout& l,
                   const CostModel& cost, const Crossing& cross,
                   const std::vector<int64_t>& in_flight);

// The memory estimate of stage `s` holding `layers` layers (memory_estimate.h).
double stage_memory(const core::ModelSpec& m, const Layout& l, int s, int64_t layers,
                    int64_t in_flight);

}  // namespace weft::planner
