// The analytic cost model: an op's work from its local shapes (FLOPs and bytes moved, time
// = the larger of FLOPs / FLOP rate and bytes / memory bandwidth) and ring collectives
// under an alpha-beta model with separate intra- and inter-node links. The defaults are a
// rough H100 node; planner/hardware.h fills every field from a hardware description (the
// h100 and h200 presets, a file, or this machine's calibration), and weft plan --flops,
// --bw-intra, ... set single fields.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/graph/graph.h"

namespace weft::planner {

enum class CollKind : uint8_t { kAllReduce, kAllGather, kReduceScatter, kAllToAll, kAllToAllV };
const char* coll_name(CollKind k);
constexpr int kCollKinds = 5;

// Op types whose kernels are neither GEMMs nor plain copies (attention's loops, the
// normalisations, the activations, the loss, the optimizer): weft calibrate times each on
// its own, since pricing them at the GEMM rate or at memcpy's bandwidth is wrong several-fold
// either way on a CPU (gelu's tanh, adamw's square roots, attention's softmax). The fused
// MoE layer too: its FLOPs are the expert GEMMs', but at small shapes its time is the
// router's softmax and top-k, the dispatch and combine gathers and the per-expert loop
// (2-3x what the GEMM rate gives). New types go at the end, so that an index keeps its type.
constexpr int kRatedOps = 24;
extern const char* const kRatedOpTypes[kRatedOps];
// The index of `type` in kRatedOpTypes, or -1.
int rated_op(const std::string& type);

struct CostModel {
  double flops = 400e12;        // sustained FLOP/s per device
  double mem_bw = 2.0e12;       // bytes/s for memory-bound ops and local copies
  double launch = 10e-6;        // fixed cost of any collective call (kernel launch, sync)
  double alpha_intra = 1e-6;    // seconds per message step inside a node
  double bw_intra = 150e9;      // bytes/s per rank inside a node
  double alpha_inter = 10e-6;   // across nodes
  double bw_inter = 25e9;
  int ranks_per_node = 8;
  int64_t device_memory = int64_t(80) << 30;  // default memory budget per rank

  // CPU hosts (weft bench scaling calibrates these; the defaults keep the GPU model above).
  // cores: 0 means one device per rank. When > 0, the ranks of a node time-share this many
  // cores: with more ranks on a node than cores, compute runs ranks/cores times slower.
  int cores = 0;
  // Fixed seconds of every compute and local instruction (dispatch, operand lookup,
  // allocation). 0 on GPUs, where launches are asynchronous and hide behind the kernels; on
  // a CPU it bounds tiny models, whose ops take microseconds.
  double op_overhead = 0;
  // Extra seconds per collective call when a node runs more ranks than cores: a process woken
  // by its peers' message waits for a time slice of a core the others are computing on (once
  // all are running, the steps proceed at alpha). Not per point-to-point message: the
  // executor posts receives ahead, so a message leaves at send time. 0: never oversubscribed,
  // as on GPUs.
  double launch_oversub = 0;
  // Ranks of a node runnable at the same moment, on average (0: all of them). Not a
  // setting: simulate_plan finds it, and the search's stage model estimates it from the
  // pipeline schedule. Runnable: computing or in a collective (the probe that measured
  // sync_wait_oversub_by_burst had every process in one or the other, and paid a time slice
  // a call); not runnable: blocked on a pipeline message, in a bubble or past its step's end,
  // where a rank leaves its core to the others. Where ranks outnumber cores it sets both the
  // processor sharing (sharing()) and how much of the oversubscribed wait a collective pays
  // (runnable_weight()), so that a pipeline whose stages wait in turn is priced by the ranks
  // that compete for the cores rather than by world / cores.
  double active_ranks = 0;
  // Measured sustained FLOP/s by the size of one op in FLOPs, ascending in FLOPs (weft
  // calibrate: small GEMMs run well below a large one's rate on a CPU, so one rate cannot
  // fit both a tiny model and a large one). Empty (the default): `flops` for every op.
  // Read only by compute(): the layout search costs collectives and copies, never compute,
  // so its memo (RvdCache) need not key on it.
  std::vector<std::pair<double, double>> flops_by_size;
  // Measured wire rate (bytes/s) of each collective kind by the size of the call's buffer
  // (the `bytes` collective() takes), ascending in bytes (weft calibrate, at 2 ranks of one
  // node). A CPU transport runs each kind its own way (Gloo: all-reduce by bcube up to 512
  // KiB and by a ring above, reduce-scatter as an all-reduce of the whole buffer and a
  // slice), so one link bandwidth cannot price them all: a 4 MiB all-reduce ran at a third
  // of the rate the link fit gives. Empty for a kind (the default): bw_intra. Never used
  // across nodes (bw_inter), where nothing was measured.
  std::array<std::vector<std::pair<double, double>>, kCollKinds> coll_bw_by_size;
  // Measured rate of each rated op type (kRatedOpTypes), in op_work's FLOPs per second of
  // that kernel (weft calibrate, f32); 0 (the default): priced as any op, by FLOPs at
  // flop_rate() or bytes at mem_bw, whichever is slower.
  std::array<double, kRatedOps> op_rates{};
  // The same rates by the FLOPs of one op, per rated type, ascending in FLOPs (weft
  // calibrate: each type at every shape its models run it, the layout models' width and
  // config S's): a kernel's fixed per-call work (attention's per-head loops and softmax
  // setup, a norm's row loop) weighs more in a small op, so one rate cannot price both (at
  // width 32 attention ran at a third of its rate at width 256). Interpolated in log(FLOPs)
  // and clamped at its ends, as flops_by_size; a type without a curve keeps op_rates.
  std::array<std::vector<std::pair<double, double>>, kRatedOps> op_rates_by_size;
  // Measured wait of a synchronising collective beyond its price above, by the compute a rank
  // did since its previous synchronisation (the burst), ascending in burst seconds (weft
  // calibrate, at 2 ranks of one node, as the mean over many calls: a step pays every one).
  // On a CPU host the ranks' bursts do not end together (a rank's thread is descheduled
  // or woken late, its peer waits), so what a collective costs in a step grows with the
  // compute between calls until it is about a time slice. Empty (the default, and on GPUs):
  // no wait. Charged by the simulator and the stage model, never by the layout search
  // (rvd.cc), so that it moves predictions and never a plan; a pipeline message pays it as
  // a collective of two (measured on a 2-rank all-reduce, itself an exchange of messages).
  std::vector<std::pair<double, double>> sync_wait_by_burst;
  // The same wait where a node runs more ranks than cores, beyond the call's price less
  // launch_oversub (which it replaces: `weft calibrate`'s step-like loop on pairs of the
  // first probe world above the cores, all of them looping). There a woken rank waits for a
  // time slice of a core others compute on, which the longer its peers' bursts the less it
  // has to (4 processes on 2 cores: about 3 ms a call after 0.13 ms of compute, 1.4 ms after
  // 1 ms), where launch_oversub, timed on isolated calls, charges every call alike. Empty
  // (the default, and on GPUs): launch_oversub as before. Read by the simulator and the
  // stage model only; the layout search keeps launch_oversub, so no plan changes.
  std::vector<std::pair<double, double>> sync_wait_oversub_by_burst;
  // Ranks of one node in the probe that measured sync_wait_oversub_by_burst, all of them
  // runnable (weft calibrate: the first probe world above the cores, 4 on 2 cores). The
  // curve is the wait at that many runnable ranks or more; runnable_weight() scales it down
  // towards sync_wait_by_burst as fewer are. 0 (unknown): every rank of the node.
  int sync_wait_oversub_ranks = 0;
  // The same loop at more ranks of the node (weft calibrate: the next probe world, 8 on 2
  // cores), every one runnable, and how many. The wait is not monotone in the ranks (8
  // processes on 2 cores waited less per call at short bursts than 4), so no factor on the
  // curve above reaches it: sync_wait() interpolates between the curves by the runnable
  // ranks, from sync_wait_oversub_ranks' curve to this one, and keeps this one above it.
  // Empty / 0 (the default): sync_wait_oversub_by_burst for every count above its ranks.
  std::vector<std::pair<double, double>> sync_wait_oversub_more_by_burst;
  int sync_wait_oversub_more_ranks = 0;

  // Ring algorithms: launch + all_reduce 2(n-1) steps moving 2(n-1)/n of `bytes`;
  // all_gather and reduce_scatter (n-1) steps moving (n-1)/n of the full buffer `bytes`;
  // all_to_all(v) likewise. n = 1 costs nothing. The launch term is why one collective
  // over a group beats the same data moved by several smaller ones.
  // `world`: ranks of the job (0: unknown), which says how many share a node's cores.
  double collective(CollKind k, int n, int64_t bytes, bool cross_node, int world = 0) const;
  double p2p(int64_t bytes, bool cross_node, int world = 0) const;
  // What a pipeline send holds its own rank for: on a CPU host (cores > 0) the message's
  // transfer, p2p(): the executor's send runs on the rank's thread (Gloo writes a message
  // its receiver has posted from the sender's thread, and loopback delivers it inside that
  // write), so the sender's next instruction starts when the message has left (`weft bench
  // scaling --attribute`: 0.11-0.18 ms a send at 4 KiB within and over the cores, priced 0
  // before). 0 on a GPU, whose copy engine moves it while the sender's stream goes on.
  double send_s(int64_t bytes, bool cross_node, int world = 0) const {
    return cores > 0 ? p2p(bytes, cross_node, world) : 0;
  }
  double local_copy(int64_t bytes, int world = 0) const {
    return local_copy_alone(bytes) * sharing(world);
  }
  double compute(double flop, double bytes, int world = 0) const {
    return compute_alone(flop, bytes) * sharing(world);
  }
  // The two above on a node no other rank shares (sharing 1): what a simulation that only
  // changes active_ranks computes once.
  double local_copy_alone(int64_t bytes) const { return op_overhead + double(bytes) / mem_bw; }
  double compute_alone(double flop, double bytes) const;
  // One op's work: at its type's measured rate when there is one (OpWork::rated; by the
  // op's FLOPs where op_rates_by_size has a curve for the type), else as above.
  double compute_alone(const struct OpWork& w) const;
  double compute(const struct OpWork& w, int world = 0) const { return compute_alone(w) * sharing(world); }
  // The rate of rated type `rated` (kRatedOpTypes) for one op of `flop` FLOPs: its
  // op_rates_by_size curve where it has one, else op_rates (0: not rated).
  double op_rate(int rated, double flop) const;
  // FLOP/s of one op of `flop` FLOPs: `flops`, or flops_by_size interpolated linearly in
  // log(FLOPs) and clamped at its ends.
  double flop_rate(double flop) const;
  // Wire bytes/s of one collective of kind k on a buffer of `bytes` inside a node:
  // coll_bw_by_size[k] interpolated linearly in log(bytes) and clamped at its ends, or bw_intra.
  double coll_bw(CollKind k, int64_t bytes) const;
  // Seconds a collective waits beyond collective() after `burst` seconds of the ranks' own
  // compute since their previous one: sync_wait_by_burst interpolated linearly in
  // log(burst) and clamped at its ends; 0 without the curve and at a group of one. Where
  // the node runs more ranks than cores, sync_wait_oversub_by_burst is read instead (0
  // without it: launch_oversub prices that regime), as far as runnable_weight() says:
  // within + weight x (oversub - within), the oversubscribed curve with every rank
  // runnable (active_ranks 0), the within-cores one where no more are runnable than cores.
  // Above sync_wait_oversub_ranks runnable, with sync_wait_oversub_more_by_burst: linear in
  // the runnable ranks from that curve to this one, this one from its own ranks up.
  double sync_wait(double burst, int n, int world = 0) const;
  // How much of the oversubscribed regime's extra wait (sync_wait_oversub_by_burst beyond
  // sync_wait_by_burst) a call pays: 0 within the cores; else (runnable - cores) /
  // (measured - cores) clamped to [0, 1], with runnable = active_ranks (0: every rank of
  // the node) and measured = sync_wait_oversub_ranks (0: every rank of the node), both at
  // most the node's ranks. 1 wherever active_ranks is 0, as before the runnable count.
  double runnable_weight(int world) const;
  // The wait a pipeline message pays, as a collective of two, after the longer of its two
  // ranks' bursts: sync_wait(burst, 2, world) in every regime. Where the node is
  // oversubscribed that is the measured curve as far as the runnable ranks allow (a
  // receiver woken by its message waits for a time slice of a core the runnable ranks hold:
  // `weft bench scaling --attribute "pp4 interleaved v2"` measured rank 0's 12 receives at
  // 7.9-15.4 ms a step where the simulator gave them 2.7-3.1 with bubbles, before this), and
  // 0 without the curve (launch_oversub's regime, which charges no message: the executor
  // posts receives ahead, so a message leaves at send time).
  double message_wait(double burst, int world = 0) const { return sync_wait(burst, 2, world); }
  // Why a synchronisation waits, and what follows from it: each member arrives late by a
  // spread of its own (a thread descheduled, a wake-up behind a time slice), and the call
  // completes at the last member, so a group of n's wait w (sync_wait) is e(n) x sigma
  // (e(n): the expected maximum of n standard normals, expected_max), and its exit varies
  // by v(n) x sigma^2 (v(n): the variance of that maximum, max_variance). Ranks that
  // synchronise only among themselves drift from the others by the sum of those variances
  // (wait_variance), and a collective across data-parallel replicas, which met last at the
  // previous step's end, completes at the last replica: e(replicas) x the drift's standard
  // deviation (replica_drift). (`weft bench scaling --attribute dp2xtp2`: the gradient
  // buckets completed at the gradient norm after 5-42 ms of waiting, against 1.2-1.8 ms of
  // all-reduce.) The wait itself stays the curve's at every n: scaling the pairs' curve by
  // e(n) / e(2) for larger groups priced tp4 and ep4 47-86% over in two runs of three
  // (docs/planner.md, "replicas drift apart").
  static double expected_max(int n);  // 0 for n <= 1
  static double max_variance(int n);  // 1 for n <= 1
  // The variance a synchronisation of n members that waited `wait` (sync_wait, message_wait)
  // adds to its members' drift: v(n) x (wait / e(n))^2, x wait_spread^2; 0 for n <= 1.
  double wait_variance(double wait, int n) const;
  // What a collective spanning `replicas` replicas pays for a drift of variance `var` (the
  // most-drifted member's, the sum of its replica's wait_variance since the step began):
  // e(replicas) x sqrt(var). 0 within one replica and at var 0 (dp alone: its replicas pay no
  // wait apart; GPUs: no wait curves).
  double replica_drift(double var, int replicas) const;
  // Scales the spreads wait_variance derives: 1, as the waits imply. Not a setting (no
  // hardware file carries it): 0 gives the model before the drift, which `weft bench
  // scaling` prints beside it.
  double wait_spread = 1.0;
  // What a collective call pays for oversubscription in its fixed part: launch_oversub where
  // the node runs more ranks than cores, unless sync_wait_oversub_by_burst prices that
  // regime (then 0 here and the curve in sync_wait). Not scaled by runnable_weight:
  // launch_oversub is the layout search's price too, and the simulator charges what the
  // search paid (RvdWorld); the runnable ranks scale the measured curve only.
  double oversub_launch(int world) const {
    return sync_wait_oversub_by_burst.empty() ? launch_oversub * oversub_weight(world) : 0;
  }
  // How many times slower a rank computes when `world` ranks share the node's cores: 1 with
  // cores = 0 or no more ranks on a node than cores; else (runnable ranks) / cores, at
  // least 1, with runnable = active_ranks (0: every rank of the node).
  double sharing(int world) const;
  bool oversubscribed(int world) const { return sharing(world) > 1; }
  // Share of launch_oversub a message pays: 1 with more ranks on the node than cores, even
  // when few compute (a wake-up chain through the group still queues behind time slices).
  double oversub_weight(int world) const;
  int ranks_on_node(int world) const { return std::min(world, std::max(1, ranks_per_node)); }
  bool operator==(const CostModel& o) const = default;
};

// Elements of a shape, as a double: cost arithmetic on large shapes (a vocabulary's logits
// over a long sequence) never overflows an integer product.
double shape_elements(const core::Shape& s);

// Bytes a rank sends for one collective of `bytes` over n ranks (what `weft plan` reports
// as communication volume).
int64_t wire_bytes(CollKind k, int n, int64_t bytes);

// Bytes of the row counts the executor exchanges before each MoE layer's forward dispatch
// (parallel/collectives.cc): an all_gather of one int64 per expert and member of the n.
inline int64_t moe_count_bytes(int64_t experts, int n) { return 8 * experts * int64_t(n); }

// Work of one (sub-)op run on local operands with these shapes. `part` names a stage of a
// custom rule ("ce.max", "moe.experts", ...; empty for the whole op).
struct OpWork {
  double flop = 0, bytes = 0;
  int rated = -1;  // index in kRatedOpTypes of a whole op of a rated type, else -1
};
OpWork op_work(const core::Op& op, const std::string& part, const std::vector<core::Shape>& ins,
               const std::vector<core::Shape>& outs, size_t elem_bytes);

}  // namespace weft::planner
