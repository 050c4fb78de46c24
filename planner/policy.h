// Policies: the parallel section resolved against the world size and the model (auto
// degrees filled, every choice validated with a ConfigError that names the field and a
// valid alternative), and the transformation decisions for each forward op (which dim
// symbol tensor parallelism splits: Megatron's column/row pairs fall out of propagating
// layouts through the graph).
#pragma once

#include <string>
#include <vector>

#include "core/config/job_spec.h"
#include "core/graph/graph.h"
#include "planner/mesh.h"

namespace weft::planner {

struct ParallelConfig {
  Degrees deg;
  std::vector<Axis> order;
  int64_t global_batch = 0, micro_batch = 0;
  int64_t micro_batches = 1;  // per data-parallel rank and step (gradient accumulation)
  std::string schedule = "1f1b";  // gpipe | 1f1b | interleaved
  int64_t virtual_stages = 1;
  std::vector<std::vector<int64_t>> chunks;  // model chunk -> its layers; pp * virtual_stages
  bool layout_given = false;
  std::string recompute = "none";
  int zero = 0;
  // Megatron's sequence parallelism (tp > 1 only): decide_partitions splits the norms and
  // residual adds on the sequence over the tp lanes; lowering's layout search then derives
  // reduce-scatter / all-gather where plain tp has all-reduce.
  bool sequence_parallel = false;
  // Gradient (and ZeRO parameter) collectives are grouped into calls of about this size.
  int64_t bucket_bytes = int64_t(25) << 20;
  // Batch shards: the batch splits over dp x ep ranks (expert parallelism is carved out of
  // data parallelism for the dense layers, as in Megatron).
  int64_t data_shards() const { return deg.dp * deg.ep; }
  int chunk_count() const { return int(chunks.size()); }
  int chunk_stage(int chunk) const { return chunk % int(deg.pp); }
};

// Fills `auto` degrees (dp first: it takes what the world leaves; other autos become 1
// unless dp is fixed, then the first of tp, pp, ep takes it; a job's own auto tp, pp and ep
// are searched by fit_layout before they get here) and validates everything the plan
// depends on. Refuses the keys only the search fills (zero, schedule, virtual_stages,
// layout, recompute, train.micro_batch: auto). Throws ConfigError naming the field
// ("parallel.tp") with a valid alternative ("... try tp=2 or tp=4").
ParallelConfig resolve_parallel(const core::JobSpec& spec, int world);

// The job for a world of `world` ranks. A job with searched keys (planner/search.h:
// plan: search, or tp, pp, ep, zero, schedule, virtual_stages, layout, recompute or
// train.micro_batch auto) gets the search's best layout for this world, every key set
// (plan: manual). Else, with elastic.layout: fixed, `spec` itself once
// resolve_parallel accepts it (its ConfigError otherwise, with a hint at elastic.layout:
// auto when the world size is what does not fit). With auto and degrees that do not fit:
// the nearest layout that does (fixed tp, pp and ep lowered to divisors of what was asked,
// keeping as much model parallelism as fits, tp before pp before ep; dp becomes auto;
// sequence_parallel is turned off where tp falls to 1), and `changed` says what changed
// ("tp 2 -> 1, sequence_parallel off"); the original error when nothing fits. A pure
// function of (spec, world): every rank and every later world derive the same layout.
core::JobSpec fit_layout(const core::JobSpec& spec, int world, std::string* changed = nullptr);

// One split of an op: along `symbol` into n parts over a mesh axis (kDp stands for the
// batch split over data shards x micro-batches).
struct AxisSplit {
  Axis axis = Axis::kTp;
  std::string symbol;
  int64_t n = 1, groups = 1;
  bool operator==(const AxisSplit& o) const = default;
};
struct OpDecision {
  int op = -1;
  std::vector<AxisSplit> splits;  // in application order: batch, experts, tensor
  bool operator==(const OpDecision& o) const = default;
};

// Decisions for every forward op (backward ops take their mirror's). Ops that read no
// batch (none in GPT) are not batch-split.
std::vector<OpDecision> decide_partitions(const core::Graph& g, const ParallelConfig& pc);

}  // namespace weft::planner
