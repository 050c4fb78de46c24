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
#include "checkpoint/snapshot_writer.h"
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
                                           int64_t host, const std::vector<HolderReport>& offers) {
  constexpr int kFields = 9;
  const int n = world.size();
  // How many offers each rank makes, then every rank's reports padded to the largest count.
  core::Tensor count_in = core::Tensor::from_vector<int64_t>({1}, {int64_t(offers.size())});
  core::Tensor counts = core::Tensor::empty({int64_t(n)}, core::DType::kI64);
  world.all_gather(counts, count_in).wait();
  int64_t most = 0;
  for (int r = 0; r < n; ++r) most = std::max(most, counts.data<int64_t>()[r]);
  const int64_t per = (1 + most) * kFields;
  std::vector<int64_t> mine(size_t(per), 0);
  auto put = [&](size_t at, const HolderReport& r) {
    const int64_t f[kFields] = {r.valid,         r.epoch,  r.rank,   r.world,      r.step,
                                host,            world.rank(), r.source, r.layout_hash};
    std::copy(f, f + kFields, mine.begin() + int64_t(at) * kFields);
  };
  HolderReport live{held.valid ? 1 : 0, held.epoch, held.rank, held.world, held.step};
  put(0, live);
  for (size_t i = 0; i < offers.size(); ++i) put(1 + i, offers[i]);
  core::Tensor in = core::Tensor::from_vector<int64_t>({per}, mine);
  core::Tensor out = core::Tensor::empty({int64_t(n) * per}, core::DType::kI64);
  world.all_gather(out, in).wait();
  const int64_t* v = out.data<int64_t>();
  auto get = [&](int r, int64_t i) {
    const int64_t* f = v + r * per + i * kFields;
    HolderReport h{f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8]};
    return h;
  };
  std::vector<HolderReport> reports;
  for (int r = 0; r < n; ++r) reports.push_back(get(r, 0));
  for (int r = 0; r < n; ++r)
    for (int64_t i = 0; i < counts.data<int64_t>()[r]; ++i) reports.push_back(get(r, 1 + i));
  return reports;
}

bool snapshot_backs(const HeldState& held, const std::vector<HolderReport>& reports) {
  if (!held.valid) return false;
  for (const HolderReport& r : reports)
    if (r.source != HolderReport::kLive && r.valid && r.epoch == held.epoch &&
        r.rank == held.rank && r.world == held.world && r.step == held.step)
      return true;
  return false;
}

int64_t host_key() {
  char ns[128] = {0};
  const ssize_t n = ::readlink("/proc/self/ns/net", ns, sizeof ns - 1);
  const std::string id = host_name() + "/" + (n > 0 ? std::string(ns, size_t(n)) : "");
  return int64_t(std::hash<std::string>{}(id) & 0x7fffffffffffffffULL);
}

std::vector<int> host_ids(const std::vector<HolderReport>& reports, int world) {
  std::map<int64_t, int> ids;
  std::vector<int> out;
  for (int q = 0; q < world; ++q) {
    auto it = ids.emplace(reports[size_t(q)].host, int(ids.size())).first;
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
// new rank (a new rank offering several old ranks holds their boxes one after the other, in
// old-rank order); every other new rank holds nothing.
parallel::Layout renamed_layout(const parallel::Layout& old, const std::vector<int>& new_rank_of,
                                const std::vector<int>& hosts) {
  parallel::Layout a;
  a.ranks.resize(hosts.size());
  a.hosts = hosts;
  bool merged = false;
  for (size_t r = 0; r < new_rank_of.size(); ++r) {
    if (new_rank_of[r] < 0) continue;
    parallel::RankLayout& to = a.ranks[size_t(new_rank_of[r])];
    const parallel::RankLayout& from = old.ranks[r];
    if (to.locals.empty()) {
      to = from;
      continue;
    }
    merged = true;
    const int base = int(to.locals.size());
    to.locals.insert(to.locals.end(), from.locals.begin(), from.locals.end());
    for (parallel::StateBox b : from.boxes) {
      b.local += base;
      to.boxes.push_back(std::move(b));
    }
  }
  // The old plan's replica numbers count ranks of the old world; with merged ranks, count
  // again over the new one.
  if (merged) parallel::assign_replicas(a);
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

Holders choose_holders(planner::PlanCache& plans, const parallel::StateSpace& space,
                       const std::vector<HolderReport>& reports, int world) {
  Holders h;
  // The (step, epoch) groups anybody offers, latest step first, then latest epoch. Live
  // holders differ in step only when a member died during a step's last collective (some
  // finished it, some did not); snapshots are older steps.
  std::vector<std::pair<int64_t, int64_t>> groups;
  for (const HolderReport& r : reports)
    if (r.valid) groups.emplace_back(r.step, r.epoch);
  if (groups.empty()) {
    h.why_not = "no rank holds any state";
    return h;
  }
  std::sort(groups.rbegin(), groups.rend());
  groups.erase(std::unique(groups.begin(), groups.end()), groups.end());
  std::map<int, parallel::Layout> old_layouts;  // by old world size
  const std::vector<int> hosts = host_ids(reports, world);
  for (const auto& [step, epoch] : groups) {
    int old_world = 0;
    for (const HolderReport& r : reports)
      if (r.valid && r.epoch == epoch && r.step == step) old_world = int(r.world);
    auto it = old_layouts.find(old_world);
    if (it == old_layouts.end())
      it = old_layouts.emplace(old_world, parallel::layout_of(space, *plans.plan(old_world))).first;
    const parallel::Layout& old = it->second;
    std::vector<int> to(size_t(old_world), -1), from(size_t(old_world), -1);
    // A rank's live state first, then a snapshot on the node that took it, then a replica
    // on another node, then one rebuilt from parity: the fewest bytes between hosts.
    for (int64_t source : {HolderReport::kLive, HolderReport::kSnapshot, HolderReport::kReplica,
                           HolderReport::kRebuilt}) {
      for (size_t q = 0; q < reports.size(); ++q) {
        const HolderReport& r = reports[q];
        if (r.source != source || !r.valid || r.epoch != epoch || r.step != step ||
            r.world != old_world || r.rank < 0 || r.rank >= old_world || to[size_t(r.rank)] >= 0)
          continue;
        if (r.source != HolderReport::kLive &&
            uint64_t(r.layout_hash) != checkpoint::snapshot_layout_hash(old.ranks[size_t(r.rank)]))
          continue;  // a snapshot of other boxes (another plan): never a source
        to[size_t(r.rank)] = int(r.holder);
        from[size_t(r.rank)] = int(q);
      }
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
    for (int q : from)
      if (q >= 0 && reports[size_t(q)].source != HolderReport::kLive) {
        h.snapshots++;
        h.replicas += reports[size_t(q)].source == HolderReport::kReplica;
        h.rebuilt += reports[size_t(q)].source == HolderReport::kRebuilt;
      }
    h.new_rank_of = std::move(to);
    h.report_of = std::move(from);
    h.old = old;
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
                         bool any_newer, std::function<void(const EpochNotice&)> ahead) {
  if (watch.path().empty()) return;
  thread_ = std::thread([this, watch, comms, any_newer, ahead = std::move(ahead)] {
    int64_t handed = watch.epoch();  // the latest epoch given to `ahead`
    while (!stop_.load()) {
      std::optional<EpochNotice> n = watch.newer();
      if (n && (n->loses_process_of(watch.epoch()) || any_newer)) {
        for (comm::Communicator* c : comms)
          c->abort("the membership changed (epoch " + std::to_string(n->epoch) + "): " + n->why);
        return;
      }
      if (n && ahead && n->epoch > handed) {
        handed = n->epoch;
        ahead(*n);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
}

LossWatcher::~LossWatcher() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

Agreed agree_at_step_end(comm::Communicator& world, bool stop, bool change, bool snapshot_ready,
                         int64_t interval) {
  core::Tensor t = core::Tensor::from_vector<int64_t>(
      {4}, {stop ? 1 : 0, change ? 1 : 0, snapshot_ready ? 0 : 1, interval});
  comm::AllReduceOptions o;
  o.op = comm::ReduceOp::kMax;
  world.all_reduce(t, o).wait();
  const int64_t* v = t.data<int64_t>();
  return {v[0] != 0, v[1] != 0, v[2] == 0, v[3]};
}

}  // namespace weft::launch
