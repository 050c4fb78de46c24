// PlanCache: one plan per world size, made on demand or ahead on a background thread.
#include "planner/plan_cache.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>

#include "planner/policy.h"

namespace weft::planner {
namespace {

// Every world of the job plans with the same cost model: one memo of layout searches
// serves them all (the caller's, if its options name one).
PlanOptions with_layout_cache(PlanOptions o) {
  if (!o.layout_cache) o.layout_cache = std::make_shared<RvdCache>();
  return o;
}

}  // namespace

PlanCache::PlanCache(const core::JobSpec& spec, const PlanOptions& opt)
    : spec_(spec),
      opt_(with_layout_cache(opt)),
      graph_(std::make_shared<const core::ModelGraph>(build_planning_graph(spec))) {}

PlanCache::PlanCache(const core::JobSpec& spec, std::function<CostModel()> cost)
    : PlanCache(spec, training_plan_options()) {
  cost_source_ = std::move(cost);
}

const PlanOptions& PlanCache::options() {
  std::lock_guard<std::mutex> lock(options_mu_);
  if (cost_source_) {
    opt_.cost = cost_source_();  // throws before anything changes
    cost_source_ = nullptr;
  }
  return opt_;
}

PlanCache::~PlanCache() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    queue_.clear();
  }
  cv_.notify_all();
  if (ahead_.joinable()) ahead_.join();
}

std::shared_ptr<const Plan> PlanCache::plan(int world) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = plans_.find(world); it != plans_.end()) return it->second;
    // Not to be made ahead any more: this thread makes it now. Also when the background
    // thread is making it right now: at its low priority, on a busy host, it may take far
    // longer than this thread does.
    queue_.erase(std::remove(queue_.begin(), queue_.end(), world), queue_.end());
  }
  auto made = std::make_shared<const Plan>(
      make_plan(fit_layout(spec_, world), graph_->graph, world, options()));
  std::lock_guard<std::mutex> lock(mu_);
  // Another thread may have made it meanwhile: every caller gets the first one kept.
  auto [it, inserted] = plans_.emplace(world, std::move(made));
  made_ += inserted;
  return it->second;
}

void PlanCache::plan_ahead(const std::vector<int>& worlds) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return;
    queue_.clear();
    for (int w : worlds)
      if (w >= 1 && !plans_.count(w) && !failed_ahead_.count(w) && w != ahead_now_ &&
          std::find(queue_.begin(), queue_.end(), w) == queue_.end())
        queue_.push_back(w);
    if (queue_.empty()) return;
    if (!ahead_.joinable()) ahead_ = std::thread(&PlanCache::ahead_loop, this);
  }
  cv_.notify_all();
}

void PlanCache::ahead_loop() {
  // The lowest priority for this thread alone (Linux: nice is per thread), so that the
  // training step it overlaps keeps its cores.
  (void)::setpriority(PRIO_PROCESS, id_t(::syscall(SYS_gettid)), 19);
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    const int world = queue_.front();
    queue_.pop_front();
    if (plans_.count(world)) continue;
    ahead_now_ = world;
    lock.unlock();
    std::shared_ptr<const Plan> made;
    try {
      made = std::make_shared<const Plan>(
          make_plan(fit_layout(spec_, world), graph_->graph, world, options()));
    } catch (...) {
      // Degrees that do not fit this size (or any other failure): whoever needs the plan
      // makes it and gets the error on its own thread.
    }
    lock.lock();
    if (made) {
      made_ += plans_.emplace(world, std::move(made)).second;  // unless plan() was first
    } else {
      failed_ahead_.insert(world);
    }
    ahead_now_ = 0;
    cv_.notify_all();
  }
}

bool PlanCache::has(int world) const {
  std::lock_guard<std::mutex> lock(mu_);
  return plans_.count(world) > 0;
}

int PlanCache::plans_made() const {
  std::lock_guard<std::mutex> lock(mu_);
  return made_;
}

void PlanCache::wait_ahead() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return stop_ || (queue_.empty() && ahead_now_ == 0); });
}

}  // namespace weft::planner
