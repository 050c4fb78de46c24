// The job's cost model: chosen by the lead, shared through the job's store (job_cost_model.h).
#include "launch/job_cost_model.h"

#include "base/env.h"
#include "base/error.h"
#include "core/rng.h"
#include "planner/hardware.h"
#include "planner/plan_json.h"

namespace weft::launch {

JobCostModel choose_job_cost_model(const std::string& dtype) {
  const std::string path = planner::machine_cache_path();
  std::string why;
  std::string used, yaml;
  if (std::optional<planner::Hardware> hw =
          planner::read_machine_cache(path, planner::this_machine(), &why)) {
    used = "the calibration of " + planner::machine_id(*hw->machine) + " from " + path + " (" +
           hw->calibrated_at + "), " + dtype + " rates";
    yaml = planner::hardware_to_yaml(*hw);
  } else {
    used = "built-in defaults, a rough H100 node (" + why + ")";
  }
  return job_cost_model_from_text(used + "\n" + yaml, dtype);
}

planner::PlanOptions job_plan_options(const std::string& dtype) {
  return planner::training_plan_options(choose_job_cost_model(dtype).model);
}

JobCostModel job_cost_model_from_text(const std::string& text, const std::string& dtype,
                                      const std::string& source) {
  const size_t nl = text.find('\n');
  if (nl == std::string::npos || nl == 0)
    throw ConfigError(source, "expected a line naming the model, then its hardware description");
  JobCostModel m;
  m.text = text;
  m.used = text.substr(0, nl);
  const std::string yaml = text.substr(nl + 1);
  if (!yaml.empty()) m.model = planner::hardware_from_yaml(yaml, source).cost_model(dtype);
  return m;
}

std::string job_cost_model_key() {
  const std::string run_id = env_string("TORCHELASTIC_RUN_ID", "");
  return run_id.empty() ? "train/job_cost_model" : "rdzv/" + run_id + "/job_cost_model";
}

JobCostModel share_job_cost_model(comm::Store& store, const std::string& key, bool may_choose,
                                  const std::optional<std::string>& holds, const std::string& dtype,
                                  std::chrono::milliseconds timeout) {
  std::optional<std::string> mine = holds;
  if (!mine && may_choose) mine = choose_job_cost_model(dtype).text;
  std::string text;
  if (mine) {
    // The first published text stays: a restarted lead, or a survivor republishing, takes
    // the job's, never its own new choice.
    const comm::Bytes got = store.compare_set(key, {}, comm::to_bytes(*mine));
    text = got.empty() ? *mine : comm::to_string(got);
  } else {
    try {
      store.wait({key}, timeout);
    } catch (const TimeoutError&) {
      throw TimeoutError("the job's cost model was not published in the store within " +
                         std::to_string(timeout.count() / 1000.0) + " s (key " + key +
                         "): rank 0 of the job's first world chooses it (WEFT_COMM_TIMEOUT_MS)");
    }
    text = comm::to_string(store.get(key));
  }
  return job_cost_model_from_text(text, dtype, "store key " + key);
}

uint64_t plan_fingerprint(const planner::Plan& plan) {
  planner::Plan decisions = plan;
  decisions.costs = planner::CostAnnotations{};  // planning_s differs on every rank
  return core::stable_hash(planner::plan_to_json(decisions));
}

}  // namespace weft::launch
