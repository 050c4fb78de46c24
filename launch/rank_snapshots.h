// In-memory snapshots, one worker's part (issue 15): every snapshot.every steps the rank's
// VPS state is copied into a shared-memory segment that the node's snapshot agent owns
// (launch/snapshot_agent.h), in the background while the next step's forward and backward
// run; and when a world forms, the snapshots the agent holds are offered to it like live
// state, so that the router restores from them what no survivor holds (live_resize.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "checkpoint/snapshot_offers.h"
#include "checkpoint/snapshot_premap.h"
#include "checkpoint/snapshot_protocol.h"
#include "checkpoint/snapshot_segment.h"
#include "checkpoint/snapshot_writer.h"
#include "core/config/job_spec.h"
#include "launch/live_resize.h"
#include "parallel/launch_env.h"
#include "parallel/trainer.h"
#include "parallel/vps.h"

namespace weft::launch {

class RankSnapshots {
 public:
  // Enabled when snapshot.every > 0. ConfigError("snapshot.every") when enabled and the
  // worker has no agent (WEFT_SNAPSHOT_SOCKET unset: not started by weft run) or the agent
  // cannot be reached.
  RankSnapshots(const core::JobSpec& spec, const parallel::LaunchEnv& env);
  ~RankSnapshots();
  bool enabled() const { return client_ != nullptr; }
  const std::string& job_id() const { return job_id_; }

  // The node's committed snapshots that this local rank serves to a new world: every
  // committed slot of the agent's segments, the segments dealt round-robin over the node's
  // `local_count` workers (each is offered once per node), known from their slot headers
  // alone: nothing is mapped in or verified until read() (checkpoint/snapshot_offers.h);
  // this rank's own segment through the last writer's mapping when it is dealt here.
  // They stay open until release_offers().
  // `epoch` is the forming world's (the agent may rebuild lost snapshots first).
  std::vector<HolderReport> offers(int local_rank, int local_count, int64_t epoch);
  // Old rank `rank`'s offered snapshot of `step` in `layout` (its layout in the world the
  // snapshot was taken in), as views of the slot in place (in a read-only mapping, or in the
  // last writer's for the rank's own segment: own_mapping_): that slot mapped in and
  // verified, nothing copied (checkpoint/snapshot_views.h): the router copies out what the
  // new layout needs. IoError naming the segment, slot and step for a corrupted or rewritten
  // snapshot (the world then chooses again without it: live_resize.h, choose_and_read).
  std::vector<core::Tensor> read(int rank, int64_t step, const parallel::RankLayout& layout);
  // After the router's move: the tensors of `moved` that are still snapshot views (a source
  // the router adopted whole as a destination) become copies in memory of `alloc`. Returns
  // the bytes copied. Then check_unchanged().
  int64_t own(std::vector<core::Tensor>& moved, memory::Allocator* alloc);
  // After own(): the slots read must not have been rewritten since they were verified, on
  // any rank of the move (`world`: every rank of it calls this after the same move, since a
  // rewritten slot's bytes went to other ranks too; null: this rank's slots only, when the
  // move's connections are gone). IoError on every rank naming the slot or its reader's rank
  // otherwise (checkpoint::agree_slots_unchanged).
  void check_unchanged(comm::Communicator* world);
  void release_offers();
  // The entry's offers and reads so far (tests: snapshot_rewrite_for_tests.h).
  const checkpoint::SnapshotOffers& offered() const { return offers_; }

  // A new world's trainer: reserves the segments of this node's ranks with the agent
  // (ConfigError naming snapshot.every when two slots each do not fit in the node's memory)
  // and makes the trainer wait for a copy in flight before its next update. `node` is this
  // node's index in the epoch; its ranks are this rank's - local_rank, `local_count` of them.
  // `background`: the reservation runs on a thread and the first snapshot due waits for it
  // (and throws its refusal): the agent allocates every page of the new slots, about 1 GB/s
  // here, which would otherwise hold a resize or a recovery before its first step. A fresh
  // start reserves in the foreground, so that a refusal comes before any training.
  void attach(parallel::ParallelTrainer& trainer, const parallel::StateSpace& space,
              int64_t epoch, int node, int local_rank, int local_count, bool background);
  // Lockstep snapshots: a snapshot is taken on every rank of a world or on none, and only
  // once every node's agent has sent the previous one to its peers, so that a replica or
  // parity is never more than one snapshot behind its source and the slots always hold a
  // step common to every rank. When pushes are slow the interval grows by itself, which
  // also bounds their cost per step.
  //
  // Before the step-end agreement, after every finished step: tells the agent of the
  // previous snapshot once committed, and says whether this rank is ready for a snapshot
  // due now: snapshot.every divides the steps done (or a snapshot due earlier is still
  // waiting), a background reservation is done (its refusal throws here: the job stops
  // naming the key), and with snapshot.redundancy the node's agent is idle.
  bool ready();
  // snapshot.every: auto. The interval this rank proposes after its ready() of this step
  // (0: none). Every rank proposes at the same step, once per world: the first snapshot of
  // the world (the probe, after kProbeSteps steps) has then been copied, and the interval is
  // the fewest steps at which a snapshot costs at most 1% of a step, a snapshot counted at
  // kCostOverCopy times its copy. The world takes the largest proposal (the step-end
  // agreement) and after_agreement() applies it.
  int64_t proposed_interval() const { return proposal_; }
  // After the agreement, on every rank alike: `take` (every rank was ready) starts the copy
  // of the state, in the background while the next step's forward and backward run;
  // `interval` > 0 is the world's agreed auto interval.
  void after_agreement(bool take, int64_t interval);

  // Auto: the probe snapshot comes after this many of a world's steps (the first, traced and
  // slower, is not timed), and a snapshot costs this many times its own copy. Measured
  // (docs/run.md): at 354M parameters on 2 cores a snapshot every step added 1.81x its copy
  // to the step (the copy competes with training for the cores and the memory bandwidth);
  // on a GPU the device-to-host copy is DMA, and the factor only makes the interval safer.
  static constexpr int kProbeSteps = 4;
  static constexpr double kCostOverCopy = 2.0;
  // The world ends: the copy in flight is finished and committed (the state it copies is
  // the last complete one), and the trainer is forgotten.
  void detach();
  // What the last finished snapshot cost: its copy on the background thread, and how long
  // the trainer waited for it.
  double last_copy_s() const { return writer_ ? writer_->last_copy_s() : 0; }
  double last_wait_s() const { return writer_ ? writer_->last_wait_s() : 0; }

 private:
  void notify_committed(const checkpoint::SnapshotMeta& m);
  // During training, after every step (a list of the agent's segments, 0.2 ms), when a
  // replica was committed since the last look: the peers' replica segments that this local rank would
  // offer, mapped and their committed slots mapped in (populate) on a thread of its own, each
  // slot once (its pages stay mapped when the agent rewrites it: they are the same tmpfs
  // pages), so that a recovery's read of one is the checksum pass alone. Mapping in a 403
  // MiB replica slot took 50-81 ms of a node-loss recovery's snapshot reads.
  void premap_replicas();

  checkpoint::PremappedSegments premapped_;
  std::future<void> premapping_;                // the thread mapping slots in, if any
  std::map<std::string, int64_t> premap_seen_;  // the newest committed sequence looked at
  int local_rank_ = 0, local_count_ = 1;
  void propose();  // auto: sets proposal_ from the probe's copy and the steps before it
  // Takes the background reservation's writer once it is done (`wait`: blocks until it is);
  // rethrows its failure.
  void settle(bool wait);

  const core::JobSpec& spec_;
  std::string job_id_;
  std::unique_ptr<checkpoint::SnapshotAgentClient> client_;
  parallel::ParallelTrainer* trainer_ = nullptr;
  const parallel::StateSpace* space_ = nullptr;
  parallel::RankLayout layout_;
  int64_t epoch_ = 0;
  int node_ = 0;
  bool due_ = false;     // a snapshot is due and not yet taken (the same on every rank)
  int64_t interval_ = 0;  // steps between snapshots (0: auto, not chosen yet)
  // Auto, per world: steps seen (ready() calls), their durations after the first, the step
  // count at which the probe was taken, and this step's proposal.
  int64_t seen_ = 0;
  std::chrono::steady_clock::time_point last_ready_;
  std::vector<double> step_s_;
  int64_t probe_at_ = -1;
  int64_t proposal_ = 0;
  std::string probe_text_;  // rank 0's measurement, for the line that says the choice
  bool waited_ = false;  // this world already logged a snapshot waiting for the agent
  std::unique_ptr<checkpoint::SnapshotWriter> writer_;
  // A background reservation in flight: the only user of client_ until settled.
  std::future<std::unique_ptr<checkpoint::SnapshotWriter>> pending_;
  std::optional<checkpoint::SnapshotMeta> committed_;  // not yet told to the agent
  checkpoint::SnapshotOffers offers_;  // offered snapshots, open while offered
  // The last world's writer's mapping of this rank's own segment, kept from detach() until
  // release_offers(): the slots it wrote are mapped in here already, so a read through it
  // is the checksum pass alone (403 MiB: 15 ms, against 31-51 ms more to map it in anew).
  std::shared_ptr<const checkpoint::SnapshotSegment> own_mapping_;
};

}  // namespace weft::launch
