// The live side's in-memory snapshots of `weft bench elastic` (launch/bench_elastic_snapshots.h).
#include "launch/bench_elastic_snapshots.h"

#include <algorithm>
#include <cstdio>
#include <memory>

#include "base/check.h"
#include "base/error.h"
#include "checkpoint/snapshot_stripes.h"
#include "checkpoint/snapshot_writer.h"
#include "core/graph/moe_balance.h"
#include "launch/snapshot_agent.h"
#include "launch/snapshot_parity.h"
#include "planner/memory_estimate.h"
#include "parallel/vps.h"
#include "planner/plan_cache.h"

namespace weft::launch::bench {

namespace {

std::string mib(double bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f MiB", bytes / double(1 << 20));
  return b;
}

}  // namespace

LosableState losable_state(const core::JobSpec& spec, int world) {
  // As a worker of that world builds its layout (launch/train_ranks.cc): the plan of
  // fit_layout(spec, world), the space of the planning graph with the MoE balance's buffers.
  planner::PlanCache plans(spec);
  const std::unique_ptr<core::MoeBalance> balance = core::MoeBalance::for_model(spec.model);
  const parallel::StateSpace space =
      parallel::StateSpace::from_graph(plans.graph()->graph, balance.get());
  const parallel::Layout layout = parallel::layout_of(space, *plans.plan(world));  // replicas
  LosableState s;
  s.world = world;
  s.min_holders = world;
  for (const parallel::RankLayout& r : layout.ranks) {
    s.payload = std::max(s.payload, checkpoint::snapshot_payload_bytes(r));
    for (const parallel::StateBox& b : r.boxes) {
      const parallel::StateTensor& t = space.at(b.state);
      const int64_t bytes = b.numel() * int64_t(core::dtype_size(t.dtype));
      s.state_bytes += bytes / std::max(1, b.replicas);
      s.min_holders = std::min(s.min_holders, b.replicas);
      if (b.replicas > 1) continue;
      s.alone_bytes += bytes;
      if (s.example.empty()) s.example = t.name;
    }
  }
  return s;
}

void choose_snapshots(Options& o) {
  const LosableState ls = losable_state(o.spec, kFailureWorld);
  const bool losable = ls.alone_bytes > 0 && ls.world > 1;
  const bool user_every = user_sets(o, "snapshot.every"),
             user_redundancy = user_sets(o, "snapshot.redundancy");
  // auto: each world times a probe snapshot and takes the interval at which one costs at most
  // 1% of a step (what a user who sizes snapshots to the job gets); replica: the failure kills
  // a node whole, and every node's snapshots are also on the next node.
  o.live_sets.clear();
  if (losable) o.live_sets = {"snapshot.every=auto", "snapshot.redundancy=replica"};
  o.spec = core::load_job_spec(o.config, train_sets(o, int(o.spec.model.layers)));
  const core::SnapshotSpec& s = o.spec.snapshot;
  const std::string held =
      str("at world ", ls.world, " the plan holds ", mib(double(ls.alone_bytes)), " of the ",
          mib(double(ls.state_bytes)), " of state on one rank only (", ls.example,
          ", for one), which the failure row's SIGKILLed node takes with it");
  if (losable && !s.enabled())
    throw ConfigError("snapshot.every",
                      "0 cannot survive the failure row: " + held +
                          ", so its new world would start over from step 0; leave snapshot.every "
                          "out (the bench takes auto) or set it to a number of steps");
  if (losable && s.redundancy == "none")
    throw ConfigError("snapshot.redundancy",
                      "none cannot survive the failure row: " + held +
                          ", and its snapshots too (redundancy none keeps them on their node); "
                          "use replica or ec, or leave it out (the bench takes replica)");
  if (losable && s.redundancy == "ec" && s.ec_k + s.ec_m > kFailureWorld)
    throw ConfigError("snapshot.ec",
                      str("k ", s.ec_k, " + m ", s.ec_m, " is more than the ", kFailureWorld,
                          " nodes of the failure's world, which then takes no parity: " + held +
                              "; use k + m <= ",
                          kFailureWorld, " (the default 2 + 1) or snapshot.redundancy replica"));
  if (!s.enabled()) {
    o.snapshot_header = str("snapshots: none on either side: at world ", ls.world,
                            " every state box is held by ", ls.min_holders,
                            " ranks, so a SIGKILLed node takes nothing the survivors lack");
    return;
  }
  // The agents' shared memory at the failure's world, counted as each agent's reserve counts
  // it (snapshot_agent_reserve.cc): a rank's slots (three under replica or ec), the replicas
  // or parity it holds for others (two slots' worth), under ec the rebuild target made ahead.
  // Checked here beside the workers, so that a job that cannot hold both is refused before
  // anything starts (the workers' own check would stop it with exit 2 after the first world).
  const int slots = s.redundancy == "none" ? 2 : 3;
  const double others = s.redundancy == "replica" ? 2.0 * double(ls.payload)
                        : s.redundancy == "ec" ? 2.0 * double(ls.payload / s.ec_k + 1) * s.ec_m
                                               : 0;
  double ahead = 0;  // summed over the nodes: each in its own group of the ring
  if (s.redundancy == "ec" && ls.world >= s.ec_k + s.ec_m)
    for (int node = 0; node < ls.world; ++node) {
      const checkpoint::GroupBound g = checkpoint::group_bound(ls.world, node, s.ec_k, s.ec_m);
      ahead += SnapshotParity::ahead_bytes(1, ls.payload, g.size, g.data_fragments);
    }
  const double snapshots =
      ls.world * (snapshot_segment_bytes(ls.payload, slots) + others) + ahead;
  const int64_t avail = planner::available_memory_bytes();
  if (avail > 0 && o.workers_bytes + snapshots > 0.9 * double(avail))
    throw ConfigError(
        "snapshot.every",
        str("the live side's in-memory snapshots (", s.redundancy, ") take about ", gb(snapshots),
            " at world ", ls.world, " (", slots, " slots of ", mib(double(ls.payload)),
            " per rank and what each node holds for the others), which with the workers' ",
            gb(o.workers_bytes), " is more than 90% of the ", gb(double(avail)),
            " available: use fewer parameters (--params)",
            s.redundancy == "replica" ? ", or --set snapshot.redundancy=ec (parity instead of a copy)" : ""));
  const std::string every = s.every == core::SnapshotSpec::kAuto ? "auto" : str(s.every);
  const std::string chose = user_every || user_redundancy ? "--set" : "the bench's";
  std::string why =
      losable ? held
              : str("the layout would not need them: at world ", ls.world,
                    " every state box is held by ", ls.min_holders, " ranks");
  if (!user_every && s.every == core::SnapshotSpec::kAuto)
    why += "; auto: each world times a probe snapshot, then takes one every N steps at <= 1% of a step";
  if (!user_redundancy && s.redundancy == "replica")
    why += "; replica: each node's snapshots are copied to the next node, so a node lost whole "
           "resumes from its copy";
  o.snapshot_header =
      str("snapshots (live side only): snapshot.every ", every, ", snapshot.redundancy ",
          s.redundancy, s.redundancy == "ec" ? str(" (k ", s.ec_k, ", m ", s.ec_m, ")") : "",
          " (", chose, "): ", why, "; ", mib(double(ls.payload)), " per rank per slot");
}

}  // namespace weft::launch::bench
