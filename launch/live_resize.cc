// Online resize, the worker's side: holding state across worlds, the holders' reports, the
// choice of layout A, the loss watcher and the step-end agreement.
#include "launch/live_resize.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <tuple>

#include "base/error.h"
#include "base/host.h"
#include "parallel/trainer.h"
#include "planner/planner.h"

namespace weft::launch {

HeldState hold_state(parallel::ParallelTrainer& trainer, const parallel::StateSpace& space,
                     int64_t epoch, bool torn) {
  HeldState h;
  h.epoch = epoch;
  h.rank = trainer.rank();
  h.world = trainer.world().size();
  h.step = trainer.current_step();
  if (torn) return h;
  h.tensors = trainer.state_tensors(space, parallel::layout_of(space, trainer.plan(), h.rank));
  h.valid = true;
  return h;
}

std::vector<HolderReport> exchange_reports(comm::Communicator& world, const HeldState& held,
                                           int64_t host) {
  constexpr int kFields = 6;
  const std::vector<int64_t> mine = {held.valid ? 1 : 0, held.epoch, held.rank,
                                     held.world,         held.step,  host};
  core::Tensor in = core::Tensor::from_vector<int64_t>({kFields}, mine);
  core::Tensor out = core::Tensor::empty({int64_t(world.size()) * kFields}, core::DType::kI64);
  world.all_gather(out, in).wait();
  const int64_t* v = out.data<int64_t>();
  std::vector<HolderReport> r(size_t(world.size()));
  for (size_t i = 0; i < r.size(); ++i) {
    const int64_t* f = v + i * kFields;
    r[i] = {f[0], f[1], f[2], f[3], f[4], f[5]};
  }
  return r;
}

int64_t host_key() {
  char ns[128] = {0};
  const ssize_t n = ::readlink("/proc/self/ns/net", ns, sizeof ns - 1);
  const std::string id = host_name() + "/" + (n > 0 ? std::string(ns, size_t(n)) : "");
  return int64_t(std::hash<std::string>{}(id) & 0x7fffffffffffffffULL);
}

std::vector<int> host_ids(const std::vector<HolderReport>& reports) {
  std::map<int64_t, int> ids;
  std::vector<int> out;
  for (const HolderReport& r : reports) {
    auto it = ids.emplace(r.host, int(ids.size())).first;
    out.push_back(it->second);
  }
  return out;
}

int Holders::count() const {
  int n = 0;
  for (int r : new_rank_of) n += r >= 0;
  return n;
}

namespace {

// Layout A over the new world: the old plan's rank layouts of the holders, each under its
// new rank; every other new rank holds nothing.
parallel::Layout renamed_layout(const parallel::Layout& old, const std::vector<int>& new_rank_of,
                                const std::vector<int>& hosts) {
  parallel::Layout a;
  a.ranks.resize(hosts.size());
  a.hosts = hosts;
  for (size_t r = 0; r < new_rank_of.size(); ++r)
    if (new_rank_of[r] >= 0) a.ranks[size_t(new_rank_of[r])] = old.ranks[r];
  return a;
}

// Whether `a` holds every element of every state tensor: the router's own cover of a rank
// that needs the whole state (it throws naming the first box nobody holds).
bool covers(const parallel::StateSpace& space, const parallel::Layout& a, std::string* gap) {
  parallel::Layout whole;
  whole.ranks.resize(a.ranks.size());
  whole.ranks[0] = parallel::whole_layout(space).ranks[0];
  whole.hosts = a.hosts;
  std::vector<int64_t> load(a.ranks.size(), 0);
  try {
    parallel::cover_rank(space, a, whole, 0, load);
    return true;
  } catch (const InternalError& e) {
    *gap = e.what();
    return false;
  }
}

}  // namespace

Holders choose_holders(const core::JobSpec& spec, const core::Graph& graph,
                       const parallel::StateSpace& space,
                       const std::vector<HolderReport>& reports) {
  Holders h;
  int64_t epoch = -1;
  for (const HolderReport& r : reports)
    if (r.valid) epoch = std::max(epoch, r.epoch);
  if (epoch < 0) {
    h.why_not = "no rank holds any state";
    return h;
  }
  // The steps the latest epoch's holders are at, latest first (they differ only when a
  // member died during a step's last collective: some finished the step, some did not).
  std::vector<int64_t> steps;
  int old_world = 0;
  for (const HolderReport& r : reports)
    if (r.valid && r.epoch == epoch) steps.push_back(r.step), old_world = int(r.world);
  std::sort(steps.rbegin(), steps.rend());
  steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
  planner::PlanOptions opt;
  opt.simulate = false;
  const planner::Plan old_plan = planner::make_plan(spec, graph, old_world, opt);
  const parallel::Layout old = parallel::layout_of(space, old_plan);
  const std::vector<int> hosts = host_ids(reports);
  for (int64_t step : steps) {
    std::vector<int> to(size_t(old_world), -1);
    for (size_t q = 0; q < reports.size(); ++q) {
      const HolderReport& r = reports[q];
      if (r.valid && r.epoch == epoch && r.step == step && r.world == old_world && r.rank >= 0 &&
          r.rank < old_world)
        to[size_t(r.rank)] = int(q);
    }
    parallel::Layout a = renamed_layout(old, to, hosts);
    std::string gap;
    if (!covers(space, a, &gap)) {
      if (h.why_not.empty()) h.why_not = gap;
      continue;
    }
    h.found = true;
    h.epoch = epoch;
    h.step = step;
    h.old_world = old_world;
    h.new_rank_of = std::move(to);
    h.a = std::move(a);
    return h;
  }
  return h;
}

parallel::LaunchEnv env_in_epoch(const parallel::LaunchEnv& base, const EpochNotice& n) {
  parallel::LaunchEnv e = base;
  e.world = n.transit_world();  // the transition's world; the first n.world() ranks train
  e.rank = n.node_index * n.nproc + base.local_rank;
  e.nnodes = n.nnodes;
  e.store_host = n.store_host;
  e.store_port = uint16_t(n.store_port);
  e.store_prefix = n.store_prefix;
  e.rdzv_epoch = n.epoch;
  e.host_store = false;
  return e;
}

LossWatcher::LossWatcher(const EpochWatch& watch, std::vector<comm::Communicator*> comms,
                         bool any_newer) {
  if (watch.path().empty()) return;
  thread_ = std::thread([this, watch, comms, any_newer] {
    while (!stop_.load()) {
      if (std::optional<EpochNotice> n = watch.newer(); n && (n->lost || any_newer)) {
        for (comm::Communicator* c : comms)
          c->abort("the membership changed (epoch " + std::to_string(n->epoch) + "): " + n->why);
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
}

LossWatcher::~LossWatcher() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

Agreed agree_at_step_end(comm::Communicator& world, bool stop, bool change) {
  core::Tensor t = core::Tensor::from_vector<int32_t>({2}, {stop ? 1 : 0, change ? 1 : 0});
  comm::AllReduceOptions o;
  o.op = comm::ReduceOp::kMax;
  world.all_reduce(t, o).wait();
  return {t.data<int32_t>()[0] != 0, t.data<int32_t>()[1] != 0};
}

}  // namespace weft::launch
