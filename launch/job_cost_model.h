// The cost model a multi-rank `weft train` job plans under: one for every rank and every
// world of the job. The planner picks layout conversions and gradient buckets by cost, so
// two ranks planning under different models (one host calibrated, another not, or
// calibrated differently) would run programs that do not meet: a deadlock or wrong numbers.
// So the rank that leads the job's first world chooses it (this machine's calibration when
// its cache exists, else CostModel's defaults: planner::choose_cost_model's rule) and
// publishes it in the job's store under a key of the job, not of an epoch; every other
// rank, a joiner of a later world or a restarted worker included, takes the published one.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "comm/store/store.h"
#include "parallel/launch_env.h"
#include "planner/cost.h"
#include "planner/plan.h"
#include "planner/planner.h"

namespace weft::launch {

struct JobCostModel {
  planner::CostModel model;
  // One line saying which (printed by the lead): "this machine's calibration ..." as
  // `weft plan` says it, with the machine that measured it.
  std::string used;
  // What travels through the store: `used`, a newline, then the hardware description
  // (planner::hardware_to_yaml; empty for the defaults). Every rank, the chooser too,
  // derives `model` from this text, so none differs by a rounding of the YAML's numbers.
  std::string text;
};

// The lead's choice for a job training in `dtype`: this machine's calibration when its
// cache (planner::machine_cache_path, $WEFT_COST_CACHE) exists and was measured here, else
// CostModel's defaults. A cache file that does not parse: ConfigError naming its path.
JobCostModel choose_job_cost_model(const std::string& dtype);
// The options a `weft train` job started on this machine plans with: its lead's choice
// (choose_job_cost_model) in training_plan_options. What the benches plan a row with, to
// price the program the row's workers run.
planner::PlanOptions job_plan_options(const std::string& dtype);
// A published text back (the `text` above). ConfigError naming `source` when it is not one.
JobCostModel job_cost_model_from_text(const std::string& text, const std::string& dtype,
                                      const std::string& source = "the job's cost model");

// The store key of the job's model: under weft run the rendezvous id's
// (rdzv/<TORCHELASTIC_RUN_ID>/job_cost_model: the same in every epoch and restart round),
// else train/job_cost_model (mpirun, srun: one world per job).
std::string job_cost_model_key();

// The job's model through `store`: published (compare-and-set: the first text stays) and
// returned when this rank `may_choose` (the lead of the job's first world) or already
// `holds` the job's text (a survivor of an earlier world: it publishes it again, for a
// store that a new epoch started afresh); otherwise waited for, up to `timeout`
// (TimeoutError naming the key: nobody published the job's model).
JobCostModel share_job_cost_model(comm::Store& store, const std::string& key, bool may_choose,
                                  const std::optional<std::string>& holds, const std::string& dtype,
                                  std::chrono::milliseconds timeout);

// A hash of the plan's decisions (its JSON without the cost annotations): equal on two
// ranks exactly when they run the same program. Logged per world (subsystem planner).
uint64_t plan_fingerprint(const planner::Plan& plan);

}  // namespace weft::launch
