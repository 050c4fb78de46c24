// Plans of one job for each world size it meets, made once per process. A worker of an
// elastic job keeps its process across worlds (online resize); entering a world needs the
// plan of the world the state comes from (the holders' layout), of the world it enters (the
// trainer's) and, for a departing worker, of the world it leaves behind. Each used to be
// made again at every entry; the cache makes each once and can make the likely next ones
// ahead, on a background thread, while the current world trains.
//
// Owned by whoever outlives the worlds (the worker's training loop); not process-wide:
// two jobs, or two tests, have caches of their own.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "core/config/job_spec.h"
#include "core/models/gpt.h"
#include "planner/plan.h"
#include "planner/planner.h"

namespace weft::planner {

class PlanCache {
 public:
  // Builds the planning graph (build_planning_graph) now. Plans are made with `opt`; by
  // default a trainer's (planner.h, training_plan_options).
  // Its worlds share one memo of layout searches (opt.layout_cache, or one of its own).
  // `spec` must outlive the cache.
  explicit PlanCache(const core::JobSpec& spec, const PlanOptions& opt = training_plan_options());
  // The same under the job's cost model, which `cost` gives (launch/job_cost_model.h: it may
  // wait for rank 0 to publish it). Asked once, by the first plan (or cost_model()), on that
  // thread: a world's plan cannot be made before the model is known, and a rank may learn it
  // only once its first world's store is up. A `cost` that throws is asked again next time.
  PlanCache(const core::JobSpec& spec, std::function<CostModel()> cost);
  // Stops planning ahead and joins its thread: the queue is dropped, a plan in progress is
  // finished first (the planner cannot be interrupted).
  ~PlanCache();
  PlanCache(const PlanCache&) = delete;
  PlanCache& operator=(const PlanCache&) = delete;

  const core::JobSpec& spec() const { return spec_; }
  // The planning graph, the same for every world size of the job (a trainer and the state
  // space share it).
  const std::shared_ptr<const core::ModelGraph>& graph() const { return graph_; }

  // The plan for `world` ranks, of the layout fit_layout(spec, world) gives it (the job's,
  // unless elastic.layout: auto had to change its degrees): the one made before (by this call or ahead), else made now
  // on the calling thread, never waiting for the background thread (when that is making
  // this very plan, the first one finished is kept). Throws make_plan's ConfigError for
  // degrees that do not fit `world` (nothing cached then). The same object for every call
  // with the same `world`. Thread-safe.
  std::shared_ptr<const Plan> plan(int world);

  // Makes the plans for `worlds` (in this order, skipping those made and sizes below 1) on a
  // background thread at the lowest CPU priority (nice 19), so that the training step it
  // overlaps keeps its cores; returns at once. Requests not yet started are replaced by these. A
  // world whose plan fails is skipped (plan() then throws its error on the caller's thread).
  void plan_ahead(const std::vector<int>& worlds);

  // The cost model every plan of this cache is made under (asks the source when not yet
  // asked; its error then). Thread-safe.
  const CostModel& cost_model() { return options().cost; }

  // Whether the plan for `world` is made.
  bool has(int world) const;
  // How many plans this cache keeps (one per world size), made ahead or not.
  int plans_made() const;
  // Blocks until the background thread has nothing queued or in progress (tests).
  void wait_ahead();

 private:
  void ahead_loop();
  // opt_, its cost model asked from cost_source_ the first time.
  const PlanOptions& options();

  const core::JobSpec& spec_;
  std::mutex options_mu_;  // held while the source is asked (a wait on the store)
  PlanOptions opt_;        // not changed once cost_source_ is empty
  std::function<CostModel()> cost_source_;
  const std::shared_ptr<const core::ModelGraph> graph_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<int, std::shared_ptr<const Plan>> plans_;
  std::deque<int> queue_;       // worlds to plan ahead
  std::set<int> failed_ahead_;  // not planned ahead again: plan() makes them and throws
  int ahead_now_ = 0;           // the world the background thread is planning; 0 none
  int made_ = 0;
  bool stop_ = false;
  std::thread ahead_;  // started by the first plan_ahead
};

}  // namespace weft::planner
