// The snapshot agent's `reserve`: the segments of a rank, created only when they fit the node's
// memory (MemAvailable and free /dev/shm, less a margin), and the node memory it reads.
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include "base/check.h"
#include "launch/snapshot_agent_server.h"

namespace weft::launch::agent_server {

namespace fs = std::filesystem;

namespace {

// Pages of a segment not yet backed by memory: promised, but not counted as used by
// MemAvailable or by /dev/shm's statvfs.
int64_t untouched_bytes(const std::string& name) {
  struct stat st {};
  if (::stat(shm_path(name).c_str(), &st) != 0) return 0;
  return std::max<int64_t>(0, int64_t(st.st_size) - int64_t(st.st_blocks) * 512);
}

}  // namespace

json Agent::reserve(const ckpt::Reservation& r) {
  if (r.job != o_.job_id) return refusal(str("this agent serves job ", o_.job_id, ", not ", r.job));
  if (r.ranks.empty()) return refusal("bad request: reserve names no ranks");
  if (r.node < 0 || r.epoch < 0 || r.parity_bytes < 0 || r.parity_bytes > kMaxRankBytes)
    return refusal("bad request: node, epoch and parity_bytes must be >= 0 (parity at most 2^50)");
  std::set<int> seen;
  std::vector<std::string> names;
  std::vector<std::pair<std::string, int64_t>> fresh;  // to create: name, capacity
  // The replicas this node will hold (snapshot.redundancy: replica): its predecessor's ranks
  // in the ring, as many as its own and of about their size (every node runs as many workers
  // of one plan), less what it holds of that epoch already. Counted, created as they arrive.
  int64_t replica_bytes = 0;
  if (o_.redundancy == "replica") {
    for (const ckpt::RankSlot& s : r.ranks)
      replica_bytes += std::clamp<int64_t>(s.bytes, 0, kMaxRankBytes);
    if (replicas_)
      replica_bytes = std::max<int64_t>(0, replica_bytes - replicas_->capacity_of_epoch(r.epoch));
  }
  // Parity (snapshot.redundancy: ec): m/K of the node's own bytes, in three slots plus the
  // step being coded; counted as "two slots of" 2 m/K. K is the data fragments of the node's
  // group in the epoch's ring: k until that ring is known, fewer in a reduced epoch (a loss
  // left fewer than k + m nodes: more parity per node), none where it cannot be coded.
  int64_t own = 0;
  int K = o_.ec_k;
  if (o_.redundancy == "ec") {
    for (const ckpt::RankSlot& s : r.ranks) own += std::clamp<int64_t>(s.bytes, 0, kMaxRankBytes);
    if (parity_) K = parity_->data_fragments_of(r.epoch);
    replica_bytes = K > 0 ? 2 * (own / K + 1) * o_.ec_m : 0;
  }
  const bool reduced = parity_ && parity_->reduced(r.epoch);
  const bool first_of_epoch = parity_ && !parity_->prepare_asked(r.epoch);
  const int64_t extra = std::max(r.parity_bytes, replica_bytes);
  double need = 2 * double(extra);
  // ec: the segments this node would rebuild its group's previous node into, made ahead
  // once the reserve succeeds (below), and the decode's pieces: counted by the reserve that
  // asks for them, in this node's group of the epoch's ring (snapshot_parity.h).
  double ahead = 0;
  if (parity_ && !parity_->prepare_asked(r.epoch)) {
    int64_t largest = 0;
    for (const ckpt::RankSlot& s : r.ranks)
      largest = std::max(largest, std::clamp<int64_t>(s.bytes, 0, kMaxRankBytes));
    ahead = parity_->ahead_bytes_of(r.epoch, int(r.ranks.size()), largest);
  }
  need += ahead;
  std::string ranks_text;
  for (const ckpt::RankSlot& s : r.ranks) {
    if (s.world <= 0 || s.rank < 0 || s.rank >= s.world || !seen.insert(s.rank).second)
      return refusal(str("bad request: rank ", s.rank, " of world ", s.world,
                         " (each rank once, 0 <= rank < world)"));
    if (s.bytes <= 0)
      return refusal(str("bad request: rank ", s.rank, " asks for ", s.bytes, " bytes"));
    const std::string name =
        ckpt::segment_name(r.job, ckpt::SegmentKind::kData, r.node, r.epoch, s.rank);
    names.push_back(name);
    auto it = owned_.find(name);
    if (it == owned_.end() && fs::exists(shm_path(name))) {  // made under another node index
      auto seg = std::make_shared<ckpt::SnapshotSegment>(ckpt::SnapshotSegment::open(name, true));
      seg->set_owner(int(::getpid()), o_.guardian_pid);
      say(str("adopted ", name, " (named by a reserve)"));
      it = owned_.emplace(name, Owned{std::move(seg), r.epoch, s.rank}).first;
    }
    if (it != owned_.end()) {
      if (it->second.segment->capacity() < s.bytes)
        return refusal(
            str(name, " exists with ", it->second.segment->capacity(),
                " bytes per slot, fewer than the ", s.bytes,
                " asked for; it holds a snapshot "
                "of an earlier layout, so it is kept: remove it with `weft snapshot clean` "
                "if that snapshot is not needed"));
      continue;
    }
    if (s.bytes > kMaxRankBytes) {
      need = 1e30;  // refused below with the sizes named
    }
    need += snapshot_segment_bytes(s.bytes, data_slots());
    fresh.push_back({name, s.bytes});
    ranks_text += (ranks_text.empty() ? "" : ", ") + std::to_string(s.rank) + " (" +
                  bytes_text(double(s.bytes)) + ")";
  }
  if (!fresh.empty() || extra > 0 || ahead > 0) {
    const NodeMemory m = read_node_memory();
    int64_t promised = 0;
    for (const auto& [name, x] : owned_) promised += untouched_bytes(name);
    const int64_t margin = snapshot_memory_margin(m);
    const double room = double(std::min(m.available, m.shm_free) - promised - margin);
    // A reduced epoch's parity (and what a rebuild would use, made ahead) is what the loss
    // added, not what the job asked for at its start: when that is what does not fit, this
    // node holds no parity in the epoch (its peers' snapshots are not coded), and its own
    // snapshots are reserved as before; a refusal would stop them.
    const double parity_need = 2 * double(extra) + ahead;
    auto said = [&](const std::string& fits) {
      return str("parity of ", o_.ec_m, "/", K, " of its own ", bytes_text(double(own)),
                 " (the epoch has fewer than k + m = ", o_.ec_k + o_.ec_m,
                 " nodes: one group, K = ", K, "), two slots of ", bytes_text(double(extra)),
                 " plus ", bytes_text(ahead),
                 " made ahead for a rebuild: ", bytes_text(parity_need),
                 ", which with its own snapshots' ", bytes_text(need - parity_need), " ", fits,
                 " in the ", bytes_text(std::max(0.0, room)), " free (MemAvailable ",
                 bytes_text(double(m.available)), ", /dev/shm free ",
                 bytes_text(double(m.shm_free)), ", less ", bytes_text(double(promised)),
                 " promised and a margin of ", bytes_text(double(margin)), ")");
    };
    if (reduced && need > room && need - parity_need <= room) {
      parity_->decline(r.epoch, said("do not fit") +
                                    "; the snapshots of the nodes whose parity it would hold are "
                                    "not erasure-coded in this epoch (free memory, or add nodes)");
      need -= parity_need;
      ahead = 0;
    } else if (reduced && first_of_epoch && need <= room) {
      say(str("epoch ", r.epoch, ": this node holds its ", said("fit")));
    }
    if (need > room) {
      std::string sizes =
          need >= 1e29 ? std::string("more than 2^50 bytes per rank") : bytes_text(need);
      std::string msg = str(
          "in-memory snapshots do not fit on node ", r.node, ": the snapshots of epoch ", r.epoch,
          (fresh.empty() ? std::string() : ", rank(s) " + ranks_text), ", ", data_slots(),
          " slots each",
          extra > 0 ? str(", plus two slots of ", bytes_text(double(extra)),
                          r.parity_bytes >= replica_bytes
                              ? " of parity"
                          : o_.redundancy == "ec"
                              ? " of parity of other nodes' snapshots (snapshot.redundancy: ec)"
                              : " of replicas of the previous node's ranks (snapshot.redundancy: "
                                "replica)")
                    : "",
          ahead > 0 ? str(", plus ", bytes_text(ahead),
                          " for the segments a rebuild of the group's previous node would "
                          "write, made ahead with the decode's pieces (snapshot.redundancy: ec)")
                    : "",
          ", need ", sizes, " of shared memory, but this node can give ",
          bytes_text(std::max(0.0, room)), " (MemAvailable ", bytes_text(double(m.available)),
          ", /dev/shm free ", bytes_text(double(m.shm_free)), ", less ",
          bytes_text(double(promised)),
          " promised to snapshot segments not yet written and a margin of ",
          bytes_text(double(margin)),
          "); set snapshot.every: 0 (no in-memory snapshots), spread the job over "
          "more nodes (each rank's share shrinks), or free memory (/dev/shm's size= mount option "
          "caps it)");
      say("refused a reserve: " + msg);
      return {{"ok", false}, {"field", "snapshot.every"}, {"error", msg}};
    }
  }
  std::vector<std::string> made;
  try {
    for (const auto& [name, capacity] : fresh) {
      // create() allocates every page (a full /dev/shm fails here, not with a SIGBUS in a
      // worker mid-step) and leaves nothing behind when it fails; unless the worker allocates
      // them itself (r.allocate false: counted in the check above, not on this thread).
      std::shared_ptr<ckpt::SnapshotSegment> seg;
      try {
        seg = std::make_shared<ckpt::SnapshotSegment>(ckpt::SnapshotSegment::create(
            name, capacity, int(::getpid()), data_slots(), o_.guardian_pid, r.allocate));
      } catch (const IoError& e) {
        if (fs::exists(shm_path(name))) throw;  // made meanwhile by someone else
        throw ConfigError("snapshot.every",
                          str(e.what(),
                              "; the node's shared memory is full: set snapshot.every: "
                              "0, spread the job over more nodes, or free memory"));
      }
      made.push_back(name);
      const auto parts = ckpt::parse_segment_name(name);
      owned_[name] = {std::move(seg), r.epoch, parts ? parts->rank : -1};
      struct stat st {};
      ::stat(shm_path(name).c_str(), &st);
      say(str("reserved ", name, ": ", data_slots(), " slots of ", bytes_text(double(capacity)),
              " (", bytes_text(double(st.st_size)), " of shared memory",
              r.allocate ? "" : ", allocated by the worker", ")"));
    }
  } catch (const std::exception& e) {
    for (const std::string& name : made) {  // all or nothing
      ckpt::SnapshotSegment::unlink(name);
      owned_.erase(name);
    }
    say(str("reserve failed: ", e.what()));
    if (auto* c = dynamic_cast<const ConfigError*>(&e))
      return {{"ok", false}, {"field", c->field()}, {"error", e.what()}};
    return refusal(e.what());
  }
  // ec: what this node would rebuild into, were its group's previous node lost, made ahead
  // on the parity's thread (snapshot_parity.h, prepare).
  if (parity_) {
    int64_t largest = 0;
    for (const ckpt::RankSlot& s : r.ranks) largest = std::max(largest, s.bytes);
    parity_->prepare(r.epoch, int(r.ranks.size()), largest);
  }
  return {{"ok", true}, {"segments", names}};
}

}  // namespace weft::launch::agent_server

namespace weft::launch {

namespace ckpt = checkpoint;

NodeMemory read_node_memory() {
  NodeMemory m;
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (in >> key >> kib) {
    std::getline(in, unit);
    if (key == "MemTotal:") m.total = kib * 1024;
    if (key == "MemAvailable:") m.available = kib * 1024;
  }
  struct statvfs sv {};
  if (::statvfs("/dev/shm", &sv) == 0) m.shm_free = int64_t(sv.f_bavail) * int64_t(sv.f_frsize);
  return m;
}

// 5% of the node's memory, at least 256 MiB. The check runs while the workers are still
// starting: they keep growing after it (activation peaks, the data file's page cache), and
// the kernel reclaims and the OOM killer acts near its low watermarks (min_free_kbytes, well
// under 1% of memory). A snapshot must never be what pushes the node over; the workers' own
// peak is the worker's check (planner/memory_estimate, WEFT_MEMORY_GIB), not this one.
int64_t snapshot_memory_margin(const NodeMemory& m) {
  return std::max<int64_t>(int64_t(256) << 20, m.total / 20);
}

double snapshot_room(const NodeMemory& m) {
  return double(std::min(m.available, m.shm_free) - snapshot_memory_margin(m));
}

double snapshot_segment_bytes(int64_t capacity, int slots) {
  const double blocks =
      double((capacity + ckpt::kSnapshotBlockBytes - 1) / ckpt::kSnapshotBlockBytes);
  return 4096 + slots * (4096 + 4 * blocks + double(capacity));
}

}  // namespace weft::launch
