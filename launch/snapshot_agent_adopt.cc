// The snapshot agent's start: the agent lock of its job and node, adoption of the segments a
// dead predecessor left, and removal of other jobs' abandoned segments.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <set>
#include <thread>

#include "base/check.h"
#include "checkpoint/snapshot_agent_files.h"
#include "launch/snapshot_agent_server.h"

namespace weft::launch::agent_server {

namespace fs = std::filesystem;

void Agent::take_lock() {
  const std::string path = lock_path(o_.job_id, o_.node);
  if (o_.lock_fd >= 0) {  // taken by weft run, which chose this index by taking it
    if (!ckpt::holds_agent_lock(o_.lock_fd, o_.job_id, o_.node))
      throw IoError(str("snapshot agent: --lock-fd ", o_.lock_fd, " does not hold ", path,
                        " (another agent serves job ", o_.job_id, " on node ", o_.node,
                        ", or the descriptor is not that lock); start it without --lock-fd"));
    ::fcntl(o_.lock_fd, F_SETFD, FD_CLOEXEC);
    lock_fd_ = o_.lock_fd;
    return;
  }
  // A sweep of stale agent files (checkpoint/snapshot_agent_files.h) holds a lock for
  // microseconds and then unlinks the file: a held lock is retried for a moment.
  lock_fd_ = ckpt::take_agent_lock(o_.job_id, o_.node, std::chrono::milliseconds(500));
  if (lock_fd_ < 0)
    throw IoError(str("snapshot agent: another agent serves job ", o_.job_id, " on node ", o_.node,
                      " (it holds ", path, "); stop it first"));
}

void Agent::adopt() {
  for (const std::string& name : ckpt::snapshot_segments(o_.job_id)) {
    std::optional<ckpt::SegmentName> p = ckpt::parse_segment_name(name);
    if (!p || p->kind != ckpt::SegmentKind::kData) continue;
    const bool this_index = p->owner_node == o_.node;
    std::shared_ptr<ckpt::SnapshotSegment> seg;
    try {
      seg = std::make_shared<ckpt::SnapshotSegment>(ckpt::SnapshotSegment::open(name, true));
    } catch (const std::exception& e) {
      if (!this_index) continue;  // another node's, perhaps being made: not ours to judge
      // Not a segment (its creator died before it was one): this job's and node's, so no
      // other process can be making it now.
      ckpt::SnapshotSegment::unlink(name);
      say(str("removed ", name, ": it is not a snapshot segment (", e.what(), ")"));
      continue;
    }
    // The node's index names its segments, and a resize renumbers the nodes while weft run
    // restarts its agent with the index it first had: the segments of a later epoch carry
    // another index. They are this node's when their guardian is this agent's (the same
    // weft run) and their owner is dead; left unadopted, a new world would not find them
    // here and would take the same state from a replica or rebuild it from parity. A segment
    // of this index guarded by another live weft run is another node's on this machine that
    // has this index now.
    const bool ours = seg->guarded_by(o_.guardian_pid);
    if (this_index ? (!ours && !seg->guardian_gone()) : (!ours || !seg->owner_gone())) continue;
    const int was = seg->owner_pid();
    seg->set_owner(int(::getpid()), o_.guardian_pid);  // live again: not abandoned
    std::string state;
    try {
      std::optional<ckpt::SnapshotSegment::View> v = seg->latest();
      state = v ? str("committed step ", v->meta.step) : std::string("nothing committed");
    } catch (const std::exception& e) {  // kept: its other slot may still be read
      state = str("its newest slot is unreadable: ", e.what());
    }
    say(str("adopted ", name, " (epoch ", p->epoch, ", rank ", p->rank, ", ", state,
            ", left by pid ", was,
            this_index ? std::string()
                       : str("; this node's as node ", p->owner_node, " of epoch ", p->epoch,
                             ", by its guardian pid ", o_.guardian_pid),
            ")"));
    owned_[name] = {std::move(seg), p->epoch, p->rank};
  }
}

void Agent::remove_abandoned() {
  std::set<std::string> removed_jobs;
  for (const std::string& name : ckpt::snapshot_segments()) {
    std::optional<ckpt::SegmentName> p = ckpt::parse_segment_name(name);
    if (!p || p->job_id == o_.job_id) continue;
    struct stat st {};
    if (::stat(("/dev/shm" + name).c_str(), &st) != 0 ||
        double(::time(nullptr) - st.st_ctime) < o_.abandoned_after_s)
      continue;  // gone meanwhile, or too young to judge
    int owner = 0, guardian = 0;
    try {
      ckpt::SnapshotSegment seg = ckpt::SnapshotSegment::open(name, false);
      if (!seg.owner_gone()) continue;  // alive, or in another pid namespace: not ours to judge
      owner = seg.owner_pid();
      guardian = seg.guardian_pid();
      if (!seg.guardian_gone()) {
        // Its agent died and the weft run that restarts it lives: the successor adopts this
        // segment within a monitor tick. Removing it now would lose that job's snapshot.
        say(str("kept ", name, " of job ", p->job_id, ": its owner, pid ", owner,
                ", is gone but its guardian, pid ", guardian, ", lives (it restarts the owner)"));
        continue;
      }
    } catch (const std::exception&) {
      continue;  // not readable (perhaps being created)
    }
    ckpt::SnapshotSegment::unlink(name);
    removed_jobs.insert(p->job_id);
    say(str("removed ", name, ": abandoned (job ", p->job_id, ": its owner, pid ", owner,
            guardian > 0 ? str(", and its guardian, pid ", guardian, ", are gone)")
                         : std::string(", is gone; no guardian recorded)")));
  }
  // Their agents are gone: so are their sockets and locks.
  for (const std::string& job : removed_jobs) ckpt::remove_stale_agent_files(job);
}

}  // namespace weft::launch::agent_server

namespace weft::launch {

namespace ckpt = checkpoint;

void adopt_orphans(const std::string& job, const std::vector<ckpt::SegmentKind>& kinds,
                   int guardian_pid,
                   const std::function<void(const std::string&, const ckpt::SegmentName&,
                                            std::shared_ptr<ckpt::SnapshotSegment>, int)>& take,
                   const std::function<void(const std::string&)>& log) {
  for (const std::string& name : ckpt::snapshot_segments(job)) {
    const std::optional<ckpt::SegmentName> p = ckpt::parse_segment_name(name);
    if (!p || std::find(kinds.begin(), kinds.end(), p->kind) == kinds.end()) continue;
    try {
      auto seg = std::make_shared<ckpt::SnapshotSegment>(ckpt::SnapshotSegment::open(name, true));
      if (!seg->owner_gone()) continue;  // another live agent's (several nodes on one machine)
      // Its agent is dead but another node's live weft run guards it: that node's restarted
      // agent takes it over.
      if (!seg->guarded_by(guardian_pid) && !seg->guardian_gone()) continue;
      const int was = seg->owner_pid();
      seg->set_owner(int(::getpid()), guardian_pid);
      take(name, *p, std::move(seg), was);
    } catch (const std::exception& e) {
      log(str(name, " not adopted: ", e.what()));
    }
  }
}

}  // namespace weft::launch
