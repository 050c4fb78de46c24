// weft train's side of elasticity: refusals, the node-range check, resume after a restart.
#include "launch/elastic_worker.h"

#include <filesystem>

#include "base/env.h"
#include "base/error.h"

namespace weft::launch {

void refuse_unsupported_job_settings(const core::JobSpec& spec, const parallel::LaunchEnv& env) {
  // snapshot.every works (launch/rank_snapshots.h), and so do replicas on the next node
  // (launch/snapshot_replicas.h) and parity on the others (launch/snapshot_parity.h).
  const core::SnapshotSpec none;
  const core::SnapshotSpec& s = spec.snapshot;
  if (s.redundancy != "none" && !s.enabled())
    throw ConfigError("snapshot.redundancy",
                      "'" + s.redundancy +
                          "' protects in-memory snapshots on other nodes, and there are none: "
                          "set snapshot.every (the steps between snapshots), or redundancy: none");
  if (s.redundancy == "replica" && env.nnodes_max < 2)
    throw ConfigError("snapshot.redundancy",
                      "replica needs at least 2 nodes: each node's snapshots are copied to the "
                      "next node's snapshot agent, and this job runs on one (weft run "
                      "--standalone, --nnodes 1, or no weft run); use none (the node's own "
                      "snapshots survive any worker's crash), or run on 2 nodes or more");
  if (s.redundancy == "ec" && env.nnodes_max < s.ec_k + s.ec_m)
    throw ConfigError("snapshot.ec",
                      "k=" + std::to_string(s.ec_k) + ", m=" + std::to_string(s.ec_m) +
                          " needs at least k + m = " + std::to_string(s.ec_k + s.ec_m) +
                          " nodes (a stripe's fragments on distinct nodes), and this job runs on "
                          "at most " + std::to_string(std::max(1, env.nnodes_max)) +
                          " (weft run --nnodes MIN:MAX); lower k or m, run on more nodes, or use "
                          "snapshot.redundancy: replica");
  const char* ec_key = s.ec_k != none.ec_k ? "snapshot.ec.k" : s.ec_m != none.ec_m ? "snapshot.ec.m" : nullptr;
  if (ec_key && s.redundancy != "ec")
    throw ConfigError(ec_key, "snapshot.ec applies to snapshot.redundancy: ec only; set it, or "
                              "drop the ec section");
  const auto check = [&](const char* key, int64_t want, int have, const char* which) {
    if (want == 0 || env.nnodes_max == 0 || want == have) return;
    throw ConfigError(key, std::string("the job file asks for ") + std::to_string(want) +
                               " but weft run was started with --nnodes " +
                               std::to_string(env.nnodes_min) + ":" +
                               std::to_string(env.nnodes_max) + " (" + which + " " +
                               std::to_string(have) + "); make them agree, or drop the key");
  };
  check("elastic.min_nodes", spec.elastic.min_nodes, env.nnodes_min, "MIN");
  check("elastic.max_nodes", spec.elastic.max_nodes, env.nnodes_max, "MAX");
  refuse_elastic_keys_of_a_fixed_world(spec.elastic, env.launcher);
}

void refuse_elastic_keys_of_a_fixed_world(const core::ElasticSpec& el, const std::string& launcher) {
  if (launcher == "weft run") return;
  // Only weft run supervises workers and lets the world change. Under mpirun, srun or as one
  // process the world is fixed and a lost process ends the job, so these keys would parse
  // and do nothing. A key at its default asks for nothing beyond that default (the shipped
  // configs spell on_change: reshard out, and run as one process too), so only a value that
  // differs from it is refused. elastic.layout is not among them: fit_layout chooses the
  // layout of any world, fixed ones included.
  const core::ElasticSpec d;
  const char* key = el.min_nodes != d.min_nodes                         ? "elastic.min_nodes"
                    : el.max_nodes != d.max_nodes                       ? "elastic.max_nodes"
                    : el.on_change != d.on_change                       ? "elastic.on_change"
                    : el.old_state != d.old_state                       ? "elastic.old_state"
                    : el.transfer_connections != d.transfer_connections ? "elastic.transfer_connections"
                                                                        : nullptr;
  if (!key) return;
  const std::string how = launcher == "single" ? "runs as one process without a launcher"
                                               : "was started by " + launcher;
  throw ConfigError(key, std::string("acts only under weft run, which supervises the workers and "
                                     "lets the world change; this job ") +
                             how +
                             ", whose world is fixed (a lost process ends the job): launch it "
                             "with `weft run` (it takes torchrun's flags), or drop the key");
}

std::string resume_source(const core::JobSpec& spec, const parallel::LaunchEnv& env,
                          const std::string& resume_flag) {
  if (!resume_flag.empty()) return resume_flag;
  if (env.restart_count == 0 || spec.checkpoint.dir.empty()) return "";
  namespace fs = std::filesystem;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(spec.checkpoint.dir, ec))
    if (e.is_directory() && e.path().filename().string().rfind("step-", 0) == 0)
      return spec.checkpoint.dir;
  return "";
}

bool parked_worker() { return env_int(kParkedVar, 0) == 1; }

std::optional<EpochNotice> wait_for_admission(const EpochWatch& watch,
                                              const volatile std::sig_atomic_t& stop) {
  NoticeWaiter waiter(watch.path());
  for (;;) {
    if (stop) return std::nullopt;
    if (std::optional<EpochNotice> n = watch.newer()) return n;
    // The notice's rename wakes the waiter (inotify); a stop signal, which may land on another
    // thread, is seen within the slice.
    waiter.wait(std::chrono::milliseconds(200));
  }
}

bool continues_run(const parallel::LaunchEnv& env, bool resume_flag) {
  return resume_flag || env.restart_count > 0;
}

}  // namespace weft::launch
