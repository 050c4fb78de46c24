// Online resize, the worker's side: holding state across worlds, the holders' reports, the
// choice of layout A, the loss watcher and the step-end agreement.
#include "launch/live_resize.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <set>
#include <tuple>

#include "base/check.h"
#include "base/error.h"
#include "base/host.h"
#include "checkpoint/snapshot_writer.h"
#include "parallel/trainer.h"
#include "planner/planner.h"

namespace weft::launch {

int64_t HeldState::bytes() const {
  int64_t n = 0;
  for (const HeldPiece& p : pieces)
    for (const core::Tensor& t : p.tensors) n += t.defined() ? int64_t(t.nbytes()) : 0;
  return n;
}

HeldState hold_state(parallel::ParallelTrainer& trainer, const parallel::StateSpace& space,
                     int64_t epoch, bool torn) {
  HeldState h;
  h.epoch = epoch;
  h.rank = trainer.rank();
  h.world = trainer.plan().world();
  h.step = trainer.current_step();
  if (const std::optional<core::StepStats>& st = trainer.exchanged_stats()) {
    h.records_step = st->step;
    h.records = trainer.exchanged_values();
  }
  if (torn) return h;
  if (trainer.can_finish_step()) h.unfinished = h.step;
  HeldPiece p;
  p.rank = h.rank;
  p.world = h.world;
  p.tensors = trainer.state_tensors(space, parallel::layout_of(space, trainer.plan(), h.rank));
  h.pieces.push_back(std::move(p));
  h.valid = true;
  return h;
}

namespace {

// all_gather of `mine` (any length) over `world`: every rank's, in rank order.
std::vector<std::vector<int64_t>> gather_rows(comm::Communicator& world,
                                              const std::vector<int64_t>& mine) {
  const int n = world.size();
  core::Tensor len_in = core::Tensor::from_vector<int64_t>({1}, {int64_t(mine.size())});
  core::Tensor lens = core::Tensor::empty({int64_t(n)}, core::DType::kI64);
  world.all_gather(lens, len_in).wait();
  int64_t most = 1;
  for (int r = 0; r < n; ++r) most = std::max(most, lens.data<int64_t>()[r]);
  std::vector<int64_t> padded(size_t(most), 0);
  std::copy(mine.begin(), mine.end(), padded.begin());
  core::Tensor in = core::Tensor::from_vector<int64_t>({most}, padded);
  core::Tensor out = core::Tensor::empty({int64_t(n) * most}, core::DType::kI64);
  world.all_gather(out, in).wait();
  std::vector<std::vector<int64_t>> rows(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    const int64_t* v = out.data<int64_t>() + r * most;
    rows[size_t(r)].assign(v, v + lens.data<int64_t>()[r]);
  }
  return rows;
}

// A report's partial boxes as int64s: per box its local, its rank (dimensions), then start,
// extent and local_start (the state is the local's).
void put_boxes(const std::vector<parallel::StateBox>& boxes, std::vector<int64_t>& out) {
  for (const parallel::StateBox& b : boxes) {
    out.push_back(b.local);
    out.push_back(int64_t(b.start.size()));
    for (const std::vector<int64_t>* v : {&b.start, &b.extent, &b.local_start})
      out.insert(out.end(), v->begin(), v->end());
  }
}

std::vector<parallel::StateBox> get_boxes(const int64_t* at, int64_t n, int rank) {
  std::vector<parallel::StateBox> out;
  const int64_t* end = at + n;
  while (at < end) {
    WEFT_CHECK(end - at >= 2 && at[1] >= 0 && end - at >= 2 + 3 * at[1], "rank ", rank,
               " reported partial boxes it did not send whole");
    parallel::StateBox b;
    b.local = int(at[0]);
    const int64_t d = at[1];
    at += 2;
    for (std::vector<int64_t>* v : {&b.start, &b.extent, &b.local_start}) {
      v->assign(at, at + d);
      at += d;
    }
    out.push_back(std::move(b));
  }
  return out;
}

}  // namespace

std::vector<HolderReport> exchange_reports(comm::Communicator& world, const HeldState& held,
                                           int64_t host, const std::vector<HolderReport>& offers) {
  constexpr int kFields = 14;
  const int n = world.size();
  // This rank's reports: a live one per piece (an invalid one when it holds nothing), then
  // its offers; and the locals lists and partial boxes of its partial pieces, concatenated.
  std::vector<HolderReport> own;
  for (size_t i = 0; i < held.pieces.size() && held.valid; ++i) {
    const HeldPiece& p = held.pieces[i];
    HolderReport r{1, held.epoch, p.rank, p.world, held.step};
    r.piece = int64_t(i);
    r.locals = p.locals;
    r.partial = p.partial;
    own.push_back(std::move(r));
  }
  if (own.empty()) own.push_back(HolderReport{0, held.epoch, held.rank, held.world, held.step});
  own[0].unfinished = held.unfinished;
  own[0].records_step = held.records_step;
  own.insert(own.end(), offers.begin(), offers.end());
  std::vector<int64_t> fixed, lists;
  for (const HolderReport& r : own) {
    const size_t before = lists.size();
    lists.insert(lists.end(), r.locals.begin(), r.locals.end());
    put_boxes(r.partial, lists);
    const int64_t boxes = int64_t(lists.size() - before - r.locals.size());
    const int64_t f[kFields] = {r.valid,
                                r.epoch,
                                r.rank,
                                r.world,
                                r.step,
                                host,
                                world.rank(),
                                r.source,
                                r.layout_hash,
                                r.piece,
                                int64_t(r.locals.size()),
                                boxes,
                                r.unfinished,
                                r.records_step};
    fixed.insert(fixed.end(), f, f + kFields);
  }
  const std::vector<std::vector<int64_t>> rows = gather_rows(world, fixed);
  // Every rank knows from the fixed part whether anybody has lists: then all exchange them.
  bool any_lists = false;
  for (const std::vector<int64_t>& row : rows)
    for (size_t k = 0; k + kFields <= row.size(); k += kFields)
      any_lists |= row[k + 10] > 0 || row[k + 11] > 0;
  std::vector<std::vector<int64_t>> list_rows(static_cast<size_t>(n));
  if (any_lists) list_rows = gather_rows(world, lists);
  std::vector<std::vector<HolderReport>> by_rank(static_cast<size_t>(n));
  for (int q = 0; q < n; ++q) {
    size_t at = 0;
    for (size_t k = 0; k + kFields <= rows[size_t(q)].size(); k += kFields) {
      const int64_t* f = rows[size_t(q)].data() + k;
      HolderReport h{f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8], f[9]};
      h.unfinished = f[12];
      h.records_step = f[13];
      WEFT_CHECK(f[10] >= 0 && at + size_t(f[10]) <= list_rows[size_t(q)].size(),
                 "rank ", q, " reported ", f[10], " locals it did not send");
      for (int64_t i = 0; i < f[10]; ++i) h.locals.push_back(int(list_rows[size_t(q)][at++]));
      WEFT_CHECK(f[11] >= 0 && at + size_t(f[11]) <= list_rows[size_t(q)].size(), "rank ", q,
                 " reported ", f[11], " values of partial boxes it did not send");
      h.partial = get_boxes(list_rows[size_t(q)].data() + at, f[11], q);
      at += size_t(f[11]);
      by_rank[size_t(q)].push_back(std::move(h));
    }
  }
  std::vector<HolderReport> reports;
  for (int q = 0; q < n; ++q) reports.push_back(by_rank[size_t(q)].at(0));
  for (int q = 0; q < n; ++q)
    reports.insert(reports.end(), by_rank[size_t(q)].begin() + 1, by_rank[size_t(q)].end());
  return reports;
}

bool snapshot_backs(const HeldState& held, const std::vector<HolderReport>& reports) {
  if (!held.valid || held.pieces.empty()) return false;
  for (const HeldPiece& p : held.pieces) {
    bool backed = false;
    for (const HolderReport& r : reports)
      backed = backed || (r.source != HolderReport::kLive && r.valid && r.epoch == held.epoch &&
                          r.rank == p.rank && r.world == p.world && r.step == held.step);
    if (!backed) return false;
  }
  return true;
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

namespace {

// Layout A over the new world: each part's boxes under its holder, a holder's parts one after
// the other in `parts` order; every other new rank holds nothing. Replica numbers are counted
// again over the new world (the old plans' count ranks of other worlds).
parallel::Layout parts_layout(const std::vector<Holders::Part>& parts,
                              const std::vector<int>& hosts) {
  parallel::Layout a;
  a.ranks.resize(hosts.size());
  a.hosts = hosts;
  for (const Holders::Part& p : parts) {
    parallel::RankLayout& to = a.ranks[size_t(p.holder)];
    const int base = int(to.locals.size());
    to.locals.insert(to.locals.end(), p.layout.locals.begin(), p.layout.locals.end());
    for (parallel::StateBox b : p.layout.boxes) {
      b.local += base;
      to.boxes.push_back(std::move(b));
    }
  }
  parallel::assign_replicas(a);
  return a;
}

// The boxes of slot `full` that live report `r` holds: all of them, or those of its listed
// locals, of a partly held one only the boxes it reported (each must lie in one of the
// slot's boxes of that local, at the same place in the tensor: InternalError otherwise).
parallel::RankLayout piece_layout(const parallel::RankLayout& full, const HolderReport& r) {
  if (r.locals.empty()) return full;
  parallel::RankLayout out = parallel::only_locals(full, r.locals);
  if (r.partial.empty()) return out;
  std::map<int, int> at;  // slot local -> index in out.locals
  for (size_t i = 0; i < r.locals.size(); ++i) at[r.locals[i]] = int(i);
  std::set<int> part;
  for (const parallel::StateBox& b : r.partial) {
    auto it = at.find(b.local);
    WEFT_CHECK(it != at.end(), "holder ", r.holder, " reported boxes of local ", b.local,
               " it does not list");
    bool inside = false;
    for (const parallel::StateBox& fb : full.boxes) {
      if (fb.local != b.local || fb.start.size() != b.start.size() ||
          b.extent.size() != b.start.size() || b.local_start.size() != b.start.size())
        continue;
      bool in = true;
      for (size_t d = 0; d < b.start.size() && in; ++d)
        in = b.extent[d] > 0 && b.start[d] >= fb.start[d] &&
             b.start[d] + b.extent[d] <= fb.start[d] + fb.extent[d] &&
             b.local_start[d] == b.start[d] - fb.start[d] + fb.local_start[d];
      inside = inside || in;
    }
    WEFT_CHECK(inside, "holder ", r.holder, " reported a box of local ", b.local,
               " outside the slot's boxes of it (world ", r.world, ", rank ", r.rank, ")");
    part.insert(it->second);
  }
  std::vector<parallel::StateBox> boxes;
  for (const parallel::StateBox& b : out.boxes)
    if (!part.count(b.local)) boxes.push_back(b);
  for (parallel::StateBox b : r.partial) {
    b.local = at[b.local];
    b.state = out.locals[size_t(b.local)].state;
    b.replica = 0, b.replicas = 1;
    boxes.push_back(std::move(b));
  }
  // Grouped by local tensor, in local order (RankLayout).
  std::stable_sort(
      boxes.begin(), boxes.end(),
      [](const parallel::StateBox& x, const parallel::StateBox& y) { return x.local < y.local; });
  out.boxes = std::move(boxes);
  return out;
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
  // finished it, some did not); snapshots are older steps. A group's pieces are copies of one
  // state (a move copies, it never trains), whatever layouts they are of.
  std::vector<std::pair<int64_t, int64_t>> groups;
  for (const HolderReport& r : reports)
    if (r.valid) groups.emplace_back(r.step, r.epoch);
  if (groups.empty()) {
    h.why_not = "no rank holds any state";
    return h;
  }
  std::sort(groups.rbegin(), groups.rend());
  groups.erase(std::unique(groups.begin(), groups.end()), groups.end());
  std::map<int, parallel::Layout> layouts;  // by world size
  auto slot = [&](int64_t w, int64_t rank) -> const parallel::RankLayout* {
    if (w < 1 || rank < 0 || rank >= w) return nullptr;
    auto it = layouts.find(int(w));
    if (it == layouts.end())
      it = layouts.emplace(int(w), parallel::layout_of(space, *plans.plan(int(w)))).first;
    return &it->second.ranks[size_t(rank)];
  };
  const std::vector<int> hosts = host_ids(reports, world);
  for (const auto& [step, epoch] : groups) {
    auto in_group = [&](const HolderReport& r) {
      return r.valid && r.epoch == epoch && r.step == step && r.holder >= 0 && r.holder < world;
    };
    std::vector<Holders::Part> parts;
    std::set<std::pair<int64_t, int64_t>> whole;  // layout slots some part holds whole
    // Every live piece: a rank's whole state, or what is left of a layout after a move.
    for (size_t q = 0; q < reports.size(); ++q) {
      const HolderReport& r = reports[q];
      if (r.source != HolderReport::kLive || !in_group(r)) continue;
      const parallel::RankLayout* full = slot(r.world, r.rank);
      if (!full) continue;
      parts.push_back({int(q), int(r.holder), piece_layout(*full, r)});
      if (r.locals.empty()) whole.insert({r.world, r.rank});
    }
    // A snapshot of each slot no live piece holds whole: the node's own first, then a
    // replica on another node, then one rebuilt from parity (the fewest bytes between hosts).
    for (int64_t source :
         {HolderReport::kSnapshot, HolderReport::kReplica, HolderReport::kRebuilt}) {
      for (size_t q = 0; q < reports.size(); ++q) {
        const HolderReport& r = reports[q];
        if (r.source != source || !in_group(r) || whole.count({r.world, r.rank})) continue;
        const parallel::RankLayout* full = slot(r.world, r.rank);
        if (!full || uint64_t(r.layout_hash) != checkpoint::snapshot_layout_hash(*full))
          continue;  // a snapshot of other boxes (another plan): never a source
        parts.push_back({int(q), int(r.holder), *full});
        whole.insert({r.world, r.rank});
      }
    }
    std::stable_sort(parts.begin(), parts.end(), [](const Holders::Part& x, const Holders::Part& y) {
      return std::tie(x.holder, x.report) < std::tie(y.holder, y.report);
    });
    parallel::Layout a = parts_layout(parts, hosts);
    std::string gap;
    if (parts.empty() || !covers(space, a, &gap)) {
      if (h.why_not.empty()) h.why_not = parts.empty() ? "no usable report" : gap;
      continue;
    }
    h.found = true;
    h.epoch = epoch;
    h.step = step;
    std::set<int64_t> worlds;
    for (const Holders::Part& p : parts) {
      const HolderReport& r = reports[size_t(p.report)];
      worlds.insert(r.world);
      h.mixed = h.mixed || !r.locals.empty();
      if (r.source == HolderReport::kLive) continue;
      h.snapshots++;
      h.replicas += r.source == HolderReport::kReplica;
      h.rebuilt += r.source == HolderReport::kRebuilt;
    }
    h.mixed = h.mixed || worlds.size() > 1;
    h.old_world = int(reports[size_t(parts[0].report)].world);
    h.parts = std::move(parts);
    h.a = std::move(a);
    return h;
  }
  return h;
}

namespace {

const char* source_name(int64_t source) {
  return source == HolderReport::kReplica   ? "a replica"
         : source == HolderReport::kRebuilt ? "rebuilt from parity"
                                            : "the node's own";
}

// Where a choice takes its state from, for the log line of a vote that failed.
std::string choice_text(const Holders& h) {
  if (!h.found)
    return str("no other source in memory covers the state (", h.why_not,
               "): from the durable checkpoint under checkpoint.dir if there is one, else from "
               "the seed");
  return str("step ", h.step, " (epoch ", h.epoch, ") from ", h.count(), " holders, ",
             h.snapshots, " of them in-memory snapshots (", h.snapshots - h.replicas - h.rebuilt,
             " own, ", h.replicas, " replica(s), ", h.rebuilt, " rebuilt from parity)");
}

}  // namespace

Holders choose_and_read(planner::PlanCache& plans, const parallel::StateSpace& space,
                        std::vector<HolderReport>& reports, int world_size,
                        comm::Communicator& world, const ReadSnapshot& read,
                        std::map<int, std::vector<core::Tensor>>& got,
                        std::vector<std::string>* notes) {
  Holders h = choose_holders(plans, space, reports, world_size);
  for (;;) {
    // Reads of an earlier choice that this one does not use are dropped (an older step's
    // group replaces them all).
    std::map<int, std::vector<core::Tensor>> kept;
    if (h.found)
      for (const Holders::Part& p : h.parts)
        if (auto it = got.find(p.report); it != got.end()) kept.emplace(p.report, std::move(it->second));
    got = std::move(kept);
    if (!h.found || h.snapshots == 0) return h;  // the same on every rank: no vote
    // This rank's snapshot parts, each read once; a failed read is voted on, not thrown:
    // the other ranks would wait for its part in the router until their timeout.
    core::Tensor failed = core::Tensor::zeros({int64_t(reports.size())}, core::DType::kI64);
    for (const Holders::Part& p : h.parts) {
      const HolderReport& r = reports[size_t(p.report)];
      if (p.holder != world.rank() || r.source == HolderReport::kLive || got.count(p.report))
        continue;
      try {
        got.emplace(p.report, read(r, p, h.step));
      } catch (const IoError& e) {
        std::fprintf(stderr, "weft train: rank %d: %s; the world chooses again without it\n",
                     world.rank(), e.what());
        std::fflush(stderr);
        failed.data<int64_t>()[p.report] = 1;
      }
    }
    comm::AllReduceOptions o;
    o.op = comm::ReduceOp::kMax;
    world.all_reduce(failed, o).wait();
    std::string which;
    for (size_t q = 0; q < reports.size(); ++q) {
      if (failed.data<int64_t>()[q] == 0) continue;
      HolderReport& r = reports[q];
      which += str(which.empty() ? "" : ", ", "old rank ", r.rank, "'s (world ", r.world, ") ",
                   source_name(r.source), " on rank ", r.holder);
      r.valid = 0;
      got.erase(int(q));
    }
    if (which.empty()) return h;
    const int64_t step = h.step;
    h = choose_holders(plans, space, reports, world_size);
    if (notes)
      notes->push_back(str("the in-memory snapshot(s) of step ", step, " chosen for this world "
                           "failed their read (", which, "; the reading rank's line names the "
                           "slot and block); chose again without them: ",
                           choice_text(h)));
  }
}

HeldState held_after_move(const Holders& h, const std::vector<HolderReport>& reports, int rank,
                          const std::vector<core::Tensor>& src, const parallel::Arrived& arrived,
                          int new_world, int new_rank) {
  HeldState held;
  held.epoch = h.epoch;
  held.step = h.step;
  auto keep = [&](HeldPiece p, size_t all) {
    if (p.tensors.empty()) return;
    if (p.locals.size() == all && p.partial.empty()) p.locals.clear();  // the whole slot
    held.pieces.push_back(std::move(p));
  };
  size_t at = 0;  // src index of the part's first local
  for (const Holders::Part& part : h.parts) {
    if (part.holder != rank) continue;
    const HolderReport& r = reports[size_t(part.report)];
    const size_t n = part.layout.locals.size();
    if (r.source == HolderReport::kLive) {
      HeldPiece p;
      p.rank = int(r.rank);
      p.world = int(r.world);
      for (size_t k = 0; k < n; ++k) {
        WEFT_CHECK(at + k < src.size(), "held_after_move: ", src.size(), " sources for rank ",
                   rank, "'s parts");
        if (!src[at + k].defined()) continue;
        p.locals.push_back(r.locals.empty() ? int(k) : r.locals[k]);
        p.tensors.push_back(src[at + k]);
        // A source held in part (an earlier stopped move's) stays so.
        for (const parallel::StateBox& b : r.partial)
          if (b.local == p.locals.back()) p.partial.push_back(b);
      }
      // A slot whose full local count differs from the part's is partial already.
      keep(std::move(p), r.locals.empty() ? n : size_t(-1));
    }
    at += n;
  }
  // What arrived of the new layout: whole tensors and the arrived boxes of partly filled
  // ones, whose sources may be freed already (the only copy of those boxes).
  HeldPiece got;
  got.rank = new_rank;
  got.world = new_world;
  for (size_t l = 0; l < arrived.tensors.size(); ++l)
    if (arrived.tensors[l].defined()) {
      got.locals.push_back(int(l));
      got.tensors.push_back(arrived.tensors[l]);
      if (l < arrived.partial.size())
        got.partial.insert(got.partial.end(), arrived.partial[l].begin(), arrived.partial[l].end());
    }
  keep(std::move(got), arrived.tensors.size());
  held.valid = !held.pieces.empty();
  return held;
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
    NoticeWaiter waiter(watch.path());  // wakes on a notice rather than at the next look
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
      waiter.wait(std::chrono::milliseconds(20));
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
