// In-memory snapshots, one worker's part (rank_snapshots.h).
#include "launch/rank_snapshots.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "base/env.h"
#include "base/error.h"
#include "base/log.h"
#include "checkpoint/job_id.h"
#include "checkpoint/snapshot_views.h"
#include "core/config/limits.h"

namespace weft::launch {
namespace {

// The committed segments of `job_id` that local rank `local_rank` of `local_count` offers:
// dealt round-robin in name order (offers() and premap_replicas() deal alike).
std::vector<checkpoint::SegmentInfo> dealt_to(std::vector<checkpoint::SegmentInfo> all,
                                              const std::string& job_id, int local_rank,
                                              int local_count) {
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  std::vector<checkpoint::SegmentInfo> out;
  int dealt = 0;
  for (auto& e : all) {
    if (!e.committed || e.committed->job_id != job_id) continue;
    if (dealt++ % std::max(1, local_count) == local_rank) out.push_back(std::move(e));
  }
  return out;
}

}  // namespace

RankSnapshots::RankSnapshots(const core::JobSpec& spec, const parallel::LaunchEnv& env)
    : spec_(spec) {
  if (!spec.snapshot.enabled()) return;
  const std::string socket = env_string("WEFT_SNAPSHOT_SOCKET", "");
  if (socket.empty())
    throw ConfigError("snapshot.every",
                      "in-memory snapshots are kept by the node's snapshot agent, which weft run "
                      "starts beside its workers; launch with `weft run ... -- weft train`, or "
                      "start `weft snapshot-agent` and set WEFT_SNAPSHOT_SOCKET, or set "
                      "snapshot.every to 0");
  job_id_ = checkpoint::this_job_id();
  try {
    client_ = std::make_unique<checkpoint::SnapshotAgentClient>();
    client_->connect(socket);
  } catch (const IoError& e) {
    throw ConfigError("snapshot.every", std::string("the node's snapshot agent (") + socket +
                                            ") cannot be reached: " + e.what());
  }
  (void)env;
}

RankSnapshots::~RankSnapshots() {
  if (premapping_.valid()) premapping_.wait();
  try {
    settle(true);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "weft train: snapshot segments not reserved: %s\n", e.what());
  }
}

void RankSnapshots::settle(bool wait) {
  if (!pending_.valid()) return;
  if (!wait && pending_.wait_for(std::chrono::seconds(0)) != std::future_status::ready) return;
  writer_ = pending_.get();
}

std::vector<HolderReport> RankSnapshots::offers(int local_rank, int local_count, int64_t epoch) {
  using Clock = std::chrono::steady_clock;
  auto ms_since = [](Clock::time_point t) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
  };
  const Clock::time_point t_clear = Clock::now();
  offers_.clear();  // an earlier entry's (own_mapping_ stays: this entry reads through it)
  std::vector<HolderReport> out;
  if (!client_) return out;
  try {
    settle(true);  // the agent's client is this thread's again
  } catch (const std::exception& e) {
    std::fprintf(stderr, "weft train: snapshot segments not reserved: %s\n", e.what());
  }
  const double settle_ms = ms_since(t_clear);
  const Clock::time_point t_list = Clock::now();
  double list_ms = 0, open_ms = 0;
  std::vector<checkpoint::SegmentInfo> all;
  try {
    all = client_->list(epoch);
    list_ms = ms_since(t_list);
  } catch (const IoError& e) {
    // A worker without its agent's list offers nothing; the others may still cover the state.
    std::fprintf(stderr, "weft train: snapshot agent not listed: %s\n", e.what());
    return out;
  }
  const size_t listed = all.size();
  int opened = 0, premapped_used = 0;
  for (const auto& e : dealt_to(std::move(all), job_id_, local_rank, local_count)) {
    // From the slot headers only: the choice uses one slot per old rank, and only the chosen
    // ones are mapped in and verified, when they are read (snapshot_offers.h). A corrupt
    // block is found then, and the world chooses again without it (choose_and_read).
    try {
      const Clock::time_point t = Clock::now();
      // A replica segment mapped during training (premap_replicas), whole.
      const std::shared_ptr<const checkpoint::SnapshotSegment> ahead = premapped_.mapping(e.name);
      premapped_used += ahead != nullptr;
      const std::vector<checkpoint::SnapshotMeta> metas =
          own_mapping_ && own_mapping_->name() == e.name ? offers_.add(own_mapping_, job_id_, true)
          : ahead                                        ? offers_.add(ahead, job_id_, true)
                                                         : offers_.add(e.name, job_id_);
      open_ms += ms_since(t);
      opened++;
      for (const checkpoint::SnapshotMeta& m : metas) {
        HolderReport r;
        r.valid = 1;
        r.epoch = m.epoch;
        r.rank = m.rank;
        r.world = m.world;
        r.step = m.step;
        r.source = m.kind == checkpoint::SegmentKind::kReplica ? HolderReport::kReplica
                   : m.kind == checkpoint::SegmentKind::kRebuilt ? HolderReport::kRebuilt
                                                                 : HolderReport::kSnapshot;
        r.layout_hash = int64_t(m.layout_hash);
        out.push_back(r);
      }
    } catch (const IoError& err) {
      std::fprintf(stderr, "weft train: snapshot %s not offered: %s\n", e.name.c_str(),
                   err.what());
    }
  }
  WEFT_DEBUG("resize", "offers for epoch ", epoch, ": ", settle_ms,
             " ms clearing the last offers and settling the reservation; listed ", listed, " segments in ",
             list_ms, " ms; opened ", opened, " of them in ", open_ms, " ms (", premapped_used,
             " mapped in during training) and offered ", out.size(),
             " committed slots from their headers (nothing else mapped in or verified)");
  return out;
}

std::vector<core::Tensor> RankSnapshots::read(int rank, int64_t step,
                                              const parallel::RankLayout& layout) {
  const int64_t bytes = offers_.bytes_read();
  const double map_s = offers_.map_seconds(), copy_s = offers_.copy_seconds();
  std::vector<core::Tensor> out;
  try {
    out = offers_.read(rank, step, layout);
  } catch (const IoError& e) {
    // Under ec the node's own snapshots have parity on the other nodes: a corrupt block found
    // here is repaired by the agent from it (only now, for the slot the world chose: a new
    // world's list checks nothing), and the slot read again. A replica or a rebuilt
    // snapshot has no parity, and a slot rewritten meanwhile has no corrupt block.
    const std::string name = offers_.segment_of(rank, step);
    const std::optional<checkpoint::SegmentName> p = checkpoint::parse_segment_name(name);
    if (spec_.snapshot.redundancy != "ec" || !p || p->kind != checkpoint::SegmentKind::kData) throw;
    int64_t repaired = 0;
    try {
      repaired = client_->repair(name, step);
    } catch (const IoError& r) {
      throw IoError(str(e.what(), "; not repaired from parity: ", r.what()));
    }
    if (repaired == 0) throw;
    std::fprintf(stderr,
                 "weft train: %s; the node's agent repaired %lld corrupt block(s) from "
                 "parity: read again\n",
                 e.what(), static_cast<long long>(repaired));
    std::fflush(stderr);
    out = offers_.read(rank, step, layout);
  }
  constexpr double kMiB = 1 << 20;
  WEFT_DEBUG("resize", "read old rank ", rank, "'s snapshot of step ", step, ": ",
             double(offers_.bytes_read() - bytes) / kMiB, " MiB mapped in in ",
             (offers_.map_seconds() - map_s) * 1e3, " ms, verified in place in ",
             (offers_.copy_seconds() - copy_s) * 1e3, " ms, no copy (this world's reads: ",
             double(offers_.bytes_read()) / kMiB, " MiB so far, of the ", offers_.size(),
             " slots this worker offered)");
  return out;
}

int64_t RankSnapshots::own(std::vector<core::Tensor>& moved, memory::Allocator* alloc) {
  const auto t = std::chrono::steady_clock::now();
  const int64_t bytes = checkpoint::own_snapshot_views(moved, alloc);
  if (bytes > 0)
    WEFT_DEBUG(
        "resize", "copied ", double(bytes) / double(1 << 20),
        " MiB of snapshot views that the router adopted whole out of their segments in ",
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count(),
        " ms");
  return bytes;
}

void RankSnapshots::check_unchanged(comm::Communicator* world) {
  checkpoint::agree_slots_unchanged(offers_, world);
}

void RankSnapshots::release_offers() {
  offers_.clear();
  own_mapping_.reset();  // views still alive keep their own handle on it
}

void RankSnapshots::attach(parallel::ParallelTrainer& trainer, const parallel::StateSpace& space,
                           int64_t epoch, int node, int local_rank, int local_count,
                           bool background) {
  detach();
  trainer_ = &trainer;
  space_ = &space;
  epoch_ = epoch;
  node_ = node;
  local_rank_ = local_rank;
  local_count_ = std::max(1, local_count);
  due_ = waited_ = false;
  // snapshot.every: auto chooses again in every world (its ranks' state and steps differ).
  interval_ = spec_.snapshot.every == core::SnapshotSpec::kAuto ? 0 : spec_.snapshot.every;
  seen_ = 0;
  step_s_.clear();
  probe_at_ = -1;
  proposal_ = 0;
  probe_text_.clear();
  layout_ = parallel::layout_of(space, trainer.plan(), trainer.rank());
  // One reservation names every rank of this node (the agent retires a node's older epoch
  // only once all of them have committed in the new one); each worker sends the same one.
  checkpoint::Reservation res;
  res.job = job_id_;
  res.node = node;
  res.epoch = epoch;
  const int first = trainer.rank() - local_rank, count = std::max(1, local_count);
  int mine = -1;
  for (int r = first; r < first + count && r < trainer.world().size(); ++r) {
    if (r == trainer.rank()) mine = int(res.ranks.size());
    const parallel::RankLayout l =
        r == trainer.rank() ? layout_ : parallel::layout_of(space, trainer.plan(), r);
    res.ranks.push_back({r, trainer.world().size(), checkpoint::snapshot_payload_bytes(l)});
  }
  WEFT_CHECK(mine >= 0, "rank ", trainer.rank(), " is not among its node's ranks");
  // In the background (a world entered live), the agent only counts the new slots and this
  // worker's own thread allocates its segment's pages at the lowest CPU priority: the agent
  // allocating them at full priority (1.77 GiB per node, 1.7 s, at the node-loss bench's 106M
  // state) ran through the new world's first step on the cores that step needs (docs/run.md,
  // "The first step"). At nice 19 the allocation yields to the step, and the first snapshot
  // due waits for it (settle). A fresh start allocates in the agent, before training.
  res.allocate = !background;
  auto reserve = [client = client_.get(), res, mine] {
    if (!res.allocate) (void)::setpriority(PRIO_PROCESS, id_t(::syscall(SYS_gettid)), 19);
    const std::vector<std::string> names = client->segment(res);  // ConfigError: does not fit
    checkpoint::SnapshotSegment seg =
        checkpoint::SnapshotSegment::open(names.at(size_t(mine)), true);
    if (!res.allocate) {
      try {
        const auto t0 = std::chrono::steady_clock::now();
        seg.allocate_slots();
        WEFT_DEBUG(
            "resize", "rank ", res.ranks.at(size_t(mine)).rank, ": ", seg.name(),
            "'s pages allocated at nice 19 in ",
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() * 1e3,
            " ms");
      } catch (const IoError& e) {
        throw ConfigError("snapshot.every",
                          str(e.what(),
                              "; the node's shared memory is full: set snapshot.every: "
                              "0, spread the job over more nodes, or free memory"));
      }
    }
    return std::make_unique<checkpoint::SnapshotWriter>(std::move(seg));
  };
  if (background)
    pending_ = std::async(std::launch::async, reserve);
  else
    writer_ = reserve();
  // The state before a step is the snapshot's until that step's first update: wait there.
  // (writer_ changes only on this thread, in after_step and detach.)
  trainer.set_before_update([this] {
    if (!writer_) return;
    if (std::optional<checkpoint::SnapshotMeta> m = writer_->wait()) committed_ = m;
  });
}

void RankSnapshots::notify_committed(const checkpoint::SnapshotMeta& m) {
  try {
    client_->committed(writer_->segment().name(), m.step);
  } catch (const IoError& e) {
    // The snapshot is committed in shared memory whatever the agent heard; its cleanup of
    // older epochs waits for the next message.
    std::fprintf(stderr, "weft train: snapshot agent not told of step %lld: %s\n",
                 (long long)m.step, e.what());
  }
}

bool RankSnapshots::ready() {
  proposal_ = 0;
  if (!trainer_) return false;
  const int64_t done = trainer_->current_step();
  const auto now = std::chrono::steady_clock::now();
  if (seen_++ > 0) step_s_.push_back(std::chrono::duration<double>(now - last_ready_).count());
  last_ready_ = now;
  if (interval_ > 0 && done % interval_ == 0) due_ = true;
  if (interval_ == 0 && probe_at_ < 0 && seen_ == kProbeSteps) due_ = true;  // auto's probe
  if (done == spec_.train.steps) due_ = false;  // the job ends: nothing to recover into
  settle(due_);
  if (committed_) notify_committed(*std::exchange(committed_, std::nullopt));
  premap_replicas();
  if (interval_ == 0 && probe_at_ >= 0 && done == probe_at_ + 1) propose();
  if (!due_ || !writer_) return false;
  if (spec_.snapshot.redundancy == "none") return true;
  bool idle = false;
  try {
    idle = client_->idle();
  } catch (const IoError& e) {
    // An agent that does not answer (restarting, stopped) sends nothing either: waiting for
    // it would stop every snapshot of the job; the slots' own copy still protects the node.
    std::fprintf(stderr, "weft train: snapshot agent not asked whether it is idle: %s\n",
                 e.what());
    return true;
  }
  if (!idle && !std::exchange(waited_, true))
    std::fprintf(stderr,
                 "weft train: rank %d: the snapshot due after step %lld waits: the node's agent "
                 "is still sending the previous one to its peers (snapshot.redundancy %s); "
                 "later waits are not logged\n",
                 trainer_->rank(), (long long)done, spec_.snapshot.redundancy.c_str());
  return idle;
}

void RankSnapshots::premap_replicas() {
  if (spec_.snapshot.redundancy != "replica" || pending_.valid()) return;
  if (premapping_.valid() &&
      premapping_.wait_for(std::chrono::seconds(0)) != std::future_status::ready)
    return;  // the last one still runs: the next snapshot looks again
  std::vector<checkpoint::SegmentInfo> all;
  try {
    all = client_->list(epoch_);
  } catch (const IoError&) {
    return;  // the recovery maps them in itself
  }
  std::vector<std::string> names;
  bool news = false;  // a replica committed since the last look
  std::map<std::string, int64_t> seen;
  for (const auto& e : dealt_to(std::move(all), job_id_, local_rank_, local_count_)) {
    const std::optional<checkpoint::SegmentName> p = checkpoint::parse_segment_name(e.name);
    if (!p || p->kind != checkpoint::SegmentKind::kReplica) continue;
    names.push_back(e.name);
    seen[e.name] = e.committed->sequence;
    auto it = premap_seen_.find(e.name);
    news = news || it == premap_seen_.end() || it->second != e.committed->sequence;
  }
  premap_seen_ = std::move(seen);
  if (!news) return;
  premapping_ = std::async(std::launch::async, [this, names] { premapped_.map_in(names); });
}

void RankSnapshots::propose() {
  // The steps before the probe's copy ran beside one: their median is the plain step.
  if (step_s_.size() < 2 || !writer_) {
    proposal_ = 1;
    return;
  }
  std::vector<double> s(step_s_.begin(), step_s_.end() - 1);
  std::nth_element(s.begin(), s.begin() + std::ptrdiff_t(s.size() / 2), s.end());
  const double step = s[s.size() / 2], cost = kCostOverCopy * writer_->last_copy_s();
  proposal_ = std::clamp<int64_t>(int64_t(std::ceil(cost / (0.01 * step))), 1, core::limits::kMaxSteps);
  char text[256];
  std::snprintf(text, sizeof text,
                "rank 0's snapshot of %.1f MiB copied in %.1f ms beside a %.1f ms step, counted "
                "at %.0fx its copy, asked for every %lld",
                double(writer_->segment().capacity()) / double(1 << 20),
                writer_->last_copy_s() * 1e3, step * 1e3, kCostOverCopy, (long long)proposal_);
  probe_text_ = text;
}

void RankSnapshots::after_agreement(bool take, int64_t interval) {
  if (!trainer_) return;
  if (interval > 0 && interval_ == 0) {
    interval_ = interval;
    if (trainer_->rank() == 0)
      std::printf("snapshot.every auto: a snapshot every %lld steps in this world, the fewest at "
                  "which one costs at most 1%% of a step (%s; the world takes its ranks' "
                  "largest)\n",
                  (long long)interval_, probe_text_.c_str());
  }
  if (!take) return;
  if (interval_ == 0 && probe_at_ < 0) probe_at_ = trainer_->current_step();
  WEFT_CHECK(due_ && writer_, "a snapshot agreed on a rank that was not ready for it");
  due_ = false;
  checkpoint::SnapshotMeta meta;
  meta.job_id = job_id_;
  meta.kind = checkpoint::SegmentKind::kData;
  meta.owner_node = node_;
  meta.epoch = epoch_;
  meta.step = trainer_->current_step();
  meta.rank = trainer_->rank();
  meta.world = trainer_->world().size();
  meta.layout_hash = checkpoint::snapshot_layout_hash(layout_);
  writer_->start(meta, trainer_->state_tensors(*space_, layout_));
}

void RankSnapshots::detach() {
  if (!trainer_) return;
  std::optional<checkpoint::SnapshotMeta> m;
  try {
    settle(true);
    if (writer_) m = writer_->wait();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "weft train: snapshot not committed: %s\n", e.what());
  }
  if (m) committed_ = m;
  if (committed_) notify_committed(*std::exchange(committed_, std::nullopt));
  trainer_->set_before_update({});
  trainer_ = nullptr;
  // Its mapping outlives it until the next world has read what it offers (own_mapping_).
  if (writer_ && !writer_->in_flight())
    own_mapping_ =
        std::make_shared<const checkpoint::SnapshotSegment>(writer_->take_segment());
  writer_.reset();
}

}  // namespace weft::launch
