// In-memory snapshots, one worker's part (rank_snapshots.h).
#include "launch/rank_snapshots.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "base/env.h"
#include "base/error.h"
#include "base/log.h"
#include "checkpoint/job_id.h"
#include "core/config/limits.h"

namespace weft::launch {

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
  release_offers();
  std::vector<HolderReport> out;
  if (!client_) return out;
  try {
    settle(true);  // the agent's client is this thread's again
  } catch (const std::exception& e) {
    std::fprintf(stderr, "weft train: snapshot segments not reserved: %s\n", e.what());
  }
  using Clock = std::chrono::steady_clock;
  auto ms_since = [](Clock::time_point t) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
  };
  const Clock::time_point t_list = Clock::now();
  double list_ms = 0, map_ms = 0, verify_ms = 0;
  int64_t mapped = 0;
  std::vector<checkpoint::SegmentInfo> all;
  try {
    all = client_->list(epoch);
    list_ms = ms_since(t_list);
  } catch (const IoError& e) {
    // A worker without its agent's list offers nothing; the others may still cover the state.
    std::fprintf(stderr, "weft train: snapshot agent not listed: %s\n", e.what());
    return out;
  }
  std::sort(all.begin(), all.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  int dealt = 0;
  for (const auto& e : all) {
    if (!e.committed || e.committed->job_id != job_id_) continue;
    if (dealt++ % std::max(1, local_count) != local_rank) continue;
    const std::string& entry = e.name;
    try {
      Clock::time_point t = Clock::now();
      auto seg = std::make_shared<checkpoint::SnapshotSegment>(
          checkpoint::SnapshotSegment::open(e.name, false));
      map_ms += ms_since(t);
      // Every committed slot: the newer may be of a step some other rank never finished
      // (killed mid-step, or mid-copy), an older one is then the step everybody has.
      for (int slot = 0; slot < seg->slots(); ++slot) {
        std::optional<checkpoint::SnapshotSegment::View> v = seg->slot(slot);
        if (!v || v->meta.job_id != job_id_) continue;
        const auto key = std::make_pair(v->meta.rank, v->meta.step);
        if (offered_.count(key)) continue;  // two epochs' segments of one rank at one step
        // Verified before it is offered (crc32c runs at about twice memcpy's speed): a rank
        // that found a corrupt block while the router waits on it would stall the world.
        // Only the offered slot's pages (populate says why).
        t = Clock::now();
        seg->populate(*v);
        map_ms += ms_since(t);
        mapped += v->meta.payload_bytes;
        t = Clock::now();
        const std::vector<int64_t> bad = seg->corrupt_blocks(*v);
        verify_ms += ms_since(t);
        if (!bad.empty()) {
          std::fprintf(stderr,
                       "weft train: snapshot %s (slot %d, step %lld) not offered: %zu corrupt "
                       "block(s), the first at byte %lld\n",
                       entry.c_str(), slot, (long long)v->meta.step, bad.size(),
                       (long long)(bad[0] * checkpoint::kSnapshotBlockBytes));
          continue;
        }
        HolderReport r;
        r.valid = 1;
        r.epoch = v->meta.epoch;
        r.rank = v->meta.rank;
        r.world = v->meta.world;
        r.step = v->meta.step;
        r.source = v->meta.kind == checkpoint::SegmentKind::kReplica ? HolderReport::kReplica
                   : v->meta.kind == checkpoint::SegmentKind::kRebuilt ? HolderReport::kRebuilt
                                                                       : HolderReport::kSnapshot;
        r.layout_hash = int64_t(v->meta.layout_hash);
        offered_.emplace(key, Offered{seg, slot});
        out.push_back(r);
      }
    } catch (const IoError& e) {
      std::fprintf(stderr, "weft train: snapshot %s not offered: %s\n", entry.c_str(), e.what());
    }
  }
  WEFT_DEBUG("resize", "offers for epoch ", epoch, ": listed ", all.size(), " segments in ",
             list_ms, " ms; mapped ", mapped >> 20, " MiB of their committed slots in ", map_ms,
             " ms, verified it in ", verify_ms, " ms; ", out.size(), " offered");
  return out;
}

std::vector<core::Tensor> RankSnapshots::read(int rank, int64_t step,
                                              const parallel::RankLayout& layout) {
  auto it = offered_.find({rank, step});
  if (it == offered_.end())
    throw InternalError("rank " + std::to_string(rank) + "'s snapshot of step " +
                        std::to_string(step) + " was not offered by this worker");
  const checkpoint::SnapshotSegment& seg = *it->second.segment;
  std::optional<checkpoint::SnapshotSegment::View> v = seg.slot(it->second.slot);
  if (!v || v->meta.step != step || v->meta.rank != rank)
    throw IoError(seg.name() + ": the snapshot of step " + std::to_string(step) +
                  " was replaced while the world formed");
  return checkpoint::read_snapshot(seg, *v, layout);
}

void RankSnapshots::release_offers() { offered_.clear(); }

void RankSnapshots::attach(parallel::ParallelTrainer& trainer, const parallel::StateSpace& space,
                           int64_t epoch, int node, int local_rank, int local_count,
                           bool background) {
  detach();
  trainer_ = &trainer;
  space_ = &space;
  epoch_ = epoch;
  node_ = node;
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
  auto reserve = [client = client_.get(), res, mine] {
    const std::vector<std::string> names = client->segment(res);  // ConfigError: does not fit
    return std::make_unique<checkpoint::SnapshotWriter>(
        checkpoint::SnapshotSegment::open(names.at(size_t(mine)), true));
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
  writer_.reset();
}

}  // namespace weft::launch
