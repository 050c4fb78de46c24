// The snapshot agent: lock, adoption, clean-up of abandoned jobs, the Asio line server, the
// reserve memory check, epoch retirement on commit, and the background "on committed" stage.
#include "launch/snapshot_agent.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/read_until.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/streambuf.hpp>
#include <boost/asio/write.hpp>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <thread>

#include "base/check.h"
#include "base/error.h"
#include "checkpoint/snapshot_protocol.h"
#include "comm/store/auth.h"
#include "launch/snapshot_parity.h"
#include "launch/snapshot_replicas.h"

namespace weft::launch {

namespace asio = boost::asio;
namespace ckpt = checkpoint;
namespace fs = std::filesystem;
using json = nlohmann::json;
using Local = asio::local::stream_protocol;

namespace {

void say(const std::string& line) {
  std::string out = "[snapshot-agent] " + line + "\n";
  (void)!::write(2, out.data(), out.size());  // one write per line: lines never interleave
}

std::string bytes_text(double b) {
  const char* unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (b >= 1024 && u < 5) b /= 1024, ++u;
  char buf[48];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", b, unit[u]);
  return buf;
}

std::string shm_path(const std::string& name) {
  return "/dev/shm/" + (name.starts_with("/") ? name.substr(1) : name);
}

// The agent lock of a job on a node: held (flock) by its live agent.
std::string lock_path(const std::string& job, int node) {
  return "/dev/shm/weft-agent-" + job + "-n" + std::to_string(node) + ".lock";
}

// Removes the lock files of `job` nobody holds (its agents are gone).
void remove_stale_locks(const std::string& job) {
  std::error_code ec;
  const std::string prefix = "weft-agent-" + job + "-n";
  for (const fs::directory_entry& e : fs::directory_iterator("/dev/shm", ec)) {
    if (!e.path().filename().string().starts_with(prefix)) continue;
    int fd = ::open(e.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) ::unlink(e.path().c_str());
    ::close(fd);
  }
}

// Pages of a segment not yet backed by memory: promised, but not counted as used by
// MemAvailable or by /dev/shm's statvfs.
int64_t untouched_bytes(const std::string& name) {
  struct stat st {};
  if (::stat(shm_path(name).c_str(), &st) != 0) return 0;
  return std::max<int64_t>(0, int64_t(st.st_size) - int64_t(st.st_blocks) * 512);
}

// How long a new world's `list` waits for the parity's rebuilds (the worker's call allows
// longer: SnapshotAgentClient::list).
constexpr std::chrono::seconds kListWaitLimit{60};

// The largest payload a reserve may ask for per rank; anything above is refused by the
// memory check anyway, and this keeps the arithmetic far from overflow.
constexpr int64_t kMaxRankBytes = int64_t(1) << 50;

// ---- the "on committed" stage ----------------------------------------------------------

class CommittedStage {
 public:
  explicit CommittedStage(CommittedHandler h)
      : handler_(std::move(h)), thread_([this] { loop(); }) {}
  ~CommittedStage() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  // Queues a commit; an event of the same segment still waiting is replaced (the stage
  // only ever needs the newest snapshot of a segment).
  void post(CommittedEvent e) {
    {
      std::lock_guard<std::mutex> l(mu_);
      auto same = std::find_if(queue_.begin(), queue_.end(),
                               [&](const CommittedEvent& x) { return x.name == e.name; });
      if (same != queue_.end())
        *same = std::move(e);
      else
        queue_.push_back(std::move(e));
    }
    cv_.notify_one();
  }
  // Nothing queued and no handler running: every commit posted so far was sent to the
  // peers (or failed). Workers take their next snapshot only when every node's stage is
  // idle (lockstep snapshots: RankSnapshots::ready).
  bool idle() {
    std::lock_guard<std::mutex> l(mu_);
    return queue_.empty() && !busy_;
  }

 private:
  void loop() {
    for (;;) {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;  // what is queued is dropped: the segments stay for a restart
      CommittedEvent e = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
      l.unlock();
      if (handler_) {
        try {
          handler_(e);
        } catch (const std::exception& x) {
          say(str("on-committed stage failed for ", e.name, " step ", e.meta.step, ": ",
                  x.what()));
        }
      }
      std::lock_guard<std::mutex> done(mu_);
      busy_ = false;
    }
  }
  CommittedHandler handler_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<CommittedEvent> queue_;
  bool busy_ = false;  // the handler runs an event popped from queue_
  bool stop_ = false;
  std::thread thread_;  // last: starts once the members above exist
};

// ---- the agent -------------------------------------------------------------------------

struct Owned {
  std::shared_ptr<ckpt::SnapshotSegment> segment;
  int64_t epoch = 0;
  int rank = -1;
  int64_t commits = 0;     // `committed` messages since the agent started
  int64_t last_step = -1;  // the step of the latest
};

// Whether a segment holds a readable committed snapshot (an inconsistent one does not).
bool has_commit(const Owned& x) {
  try {
    return x.segment->latest().has_value();
  } catch (const std::exception&) {
    return false;
  }
}

class Agent {
 public:
  Agent(const SnapshotAgentOptions& o, CommittedHandler h)
      : o_(o),
        acceptor_(io_),
        signals_(io_, SIGINT, SIGTERM),
        waiting_timer_(io_),
        stage_([this, h = std::move(h)](const CommittedEvent& e) {
          if (replicas_) replicas_->push(e);
          if (parity_) parity_->push(e);
          if (h) h(e);
        }) {}
  ~Agent();
  int run();

 private:
  class Session;
  void take_lock();
  void adopt();
  void remove_abandoned();
  void listen();
  void accept();
  using Reply = std::function<void(const json&)>;
  // Answers one request line: at once, or (a new world's `list` while parity is still being
  // rebuilt or repaired) once that is done.
  void respond(const std::string& line, Reply reply);
  void poll_waiting();
  json handle(const std::string& line);
  json reserve(const ckpt::Reservation& r);
  json committed(const std::string& name, int64_t step);
  json list() const;
  json finish(const std::string& job);
  json peers(const json& req);
  void start_peers();
  void serve_peer(ckpt::PeerChannel& ch);
  // Slots of the node's own segments: three when they are copied to other nodes, so that a
  // lost node's replicas (a push behind its commits) always meet a step every survivor
  // still holds (docs/snapshot-format.md, "Why the steps meet"); two otherwise.
  int data_slots() const { return o_.redundancy == "none" ? 2 : 3; }
  void retire_older_than(int64_t epoch, int64_t step);
  void locate(CommittedEvent& e, int64_t epoch) const;
  static json refusal(const std::string& error) { return {{"ok", false}, {"error", error}}; }

  const SnapshotAgentOptions o_;
  asio::io_context io_;
  Local::acceptor acceptor_;
  asio::signal_set signals_;
  std::map<std::string, Owned> owned_;
  int lock_fd_ = -1;
  bool listening_ = false;
  bool finished_ = false;  // `finish` answered: exit once the reply is written
  // Replicas or parity (o_.listen set): pushes from the stage, receives on the transport's
  // threads (listener_), which stop before either goes.
  std::unique_ptr<SnapshotReplicas> replicas_;
  std::unique_ptr<SnapshotParity> parity_;
  std::unique_ptr<ckpt::PeerListener> listener_;
  // `list` requests of a new world waiting for the parity's rebuilds and repairs.
  struct Waiting {
    int64_t epoch = 0;
    std::chrono::steady_clock::time_point deadline;
    Reply reply;
  };
  std::vector<Waiting> waiting_;
  int64_t ring_epoch_ = -1;  // the newest ring `peers` gave
  asio::steady_timer waiting_timer_;
  CommittedStage stage_;   // last: its thread stops first
};

// One connection: read a line, answer it, read the next; `finish` stops the agent once its
// reply is written. A client that goes away just ends its session.
class Agent::Session : public std::enable_shared_from_this<Session> {
 public:
  Session(Agent& a, Local::socket s)
      : agent_(a), sock_(std::move(s)), in_(ckpt::kSnapshotMaxLineBytes) {}
  void read() {
    auto self = shared_from_this();
    asio::async_read_until(sock_, in_, '\n', [self](boost::system::error_code ec, size_t) {
      if (ec) return;  // closed, or a line over the limit: drop the connection
      std::istream is(&self->in_);
      std::string line;
      std::getline(is, line);
      self->agent_.respond(line, [self](const json& reply) { self->write(reply); });
    });
  }
  void write(const json& reply) {
    auto self = shared_from_this();
    out_ = reply.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
    const bool last = agent_.finished_;
    asio::async_write(sock_, asio::buffer(out_), [self, last](boost::system::error_code wec, size_t) {
      if (last)
        self->agent_.io_.stop();
      else if (!wec)
        self->read();
    });
  }

 private:
  Agent& agent_;
  Local::socket sock_;
  asio::streambuf in_;
  std::string out_;
};

void Agent::take_lock() {
  const std::string path = lock_path(o_.job_id, o_.node);
  lock_fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock_fd_ < 0)
    throw IoError(str("snapshot agent: cannot open its lock ", path, ": ", std::strerror(errno)));
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0)
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
  for (const std::string& job : removed_jobs) remove_stale_locks(job);
}

void Agent::listen() {
  const std::string& path = o_.socket;
  if (path.size() >= sizeof(sockaddr_un{}.sun_path))
    throw ConfigError("--socket",
                      str("the path is ", path.size(), " bytes; a Unix socket path must be under ",
                          sizeof(sockaddr_un{}.sun_path)));
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode))
      throw IoError(str("snapshot agent: ", path, " exists and is not a socket"));
    // A socket file: alive if something accepts on it; a leftover of a killed agent if not.
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::memcpy(a.sun_path, path.c_str(), path.size());
    const bool alive = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    ::close(fd);
    if (alive) throw IoError(str("snapshot agent: another process serves ", path));
    ::unlink(path.c_str());
  }
  acceptor_.open(Local());
  acceptor_.bind(Local::endpoint(path));
  acceptor_.listen();
  listening_ = true;
}

void Agent::accept() {
  acceptor_.async_accept([this](boost::system::error_code ec, Local::socket s) {
    if (ec) return;  // the acceptor was closed: the agent stops
    std::make_shared<Session>(*this, std::move(s))->read();
    accept();
  });
}

void Agent::respond(const std::string& line, Reply reply) {
  // {"op":"list","epoch":E}: a world of epoch E is forming. With parity, its snapshots are
  // checked (corrupt blocks repaired) and the lost nodes' rebuilt before they are listed.
  if (parity_ && !finished_) {
    try {
      const json req = json::parse(line);
      if (req.is_object() && req.value("op", std::string()) == "list" && req.contains("epoch") &&
          req["epoch"].is_number_integer()) {
        parity_->repair();
        waiting_.push_back({req["epoch"].get<int64_t>(),
                            std::chrono::steady_clock::now() + kListWaitLimit, std::move(reply)});
        if (waiting_.size() == 1) poll_waiting();
        return;
      }
    } catch (const std::exception&) {
      // handle() says what is wrong with it
    }
  }
  reply(handle(line));
}

void Agent::poll_waiting() {
  const auto now = std::chrono::steady_clock::now();
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    const bool ready = parity_->settled(it->epoch);
    if (!ready && now < it->deadline) {
      ++it;
      continue;
    }
    if (!ready)
      say(str("list for epoch ", it->epoch, ": the parity's rebuilds did not finish within ",
              kListWaitLimit.count(), " s (or the ring of that epoch never came); listing what "
              "is here"));
    Reply r = std::move(it->reply);
    it = waiting_.erase(it);
    r(list());
  }
  if (waiting_.empty()) return;
  waiting_timer_.expires_after(std::chrono::milliseconds(10));
  waiting_timer_.async_wait([this](boost::system::error_code ec) {
    if (!ec) poll_waiting();
  });
}

json Agent::handle(const std::string& line) {
  json req;
  try {
    req = json::parse(line);
  } catch (const std::exception& e) {
    return refusal(str("bad request: not JSON (", e.what(), ")"));
  }
  const std::string op = req.is_object() ? req.value("op", std::string()) : std::string();
  if (finished_)
    return refusal("the agent is finishing (the job ended); it serves no more requests");
  try {
    if (op == "reserve") return reserve(ckpt::reservation_from_json(req));
    if (op == "committed") {
      if (!req.contains("name") || !req["name"].is_string() || !req.contains("step") ||
          !req["step"].is_number_integer())
        return refusal("bad request: committed needs \"name\" (string) and \"step\" (integer)");
      return committed(req["name"].get<std::string>(), req["step"].get<int64_t>());
    }
    if (op == "list") return list();
    if (op == "idle") return {{"ok", true}, {"idle", stage_.idle()}};
    if (op == "peers") return peers(req);
    if (op == "endpoint")
      return {{"ok", true}, {"endpoint", listener_ ? listener_->endpoint() : std::string()}};
    if (op == "finish") {
      if (!req.contains("job") || !req["job"].is_string())
        return refusal("bad request: finish needs \"job\"");
      return finish(req["job"].get<std::string>());
    }
    return refusal("bad request: unknown op '" + op +
                   "' (reserve, committed, idle, list, peers, endpoint, finish)");
  } catch (const std::invalid_argument& e) {
    return refusal(str("bad request: ", op, ": ", e.what()));
  } catch (const std::exception& e) {
    say(str(op, " failed: ", e.what()));
    return refusal(e.what());
  }
}

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
  // Parity (snapshot.redundancy: ec): m/k of the node's own bytes, in three slots plus the
  // step being coded; counted as "two slots of" 2 m/k.
  if (o_.redundancy == "ec") {
    int64_t own = 0;
    for (const ckpt::RankSlot& s : r.ranks) own += std::clamp<int64_t>(s.bytes, 0, kMaxRankBytes);
    replica_bytes = 2 * (own / o_.ec_k + 1) * o_.ec_m;
  }
  const int64_t extra = std::max(r.parity_bytes, replica_bytes);
  double need = 2 * double(extra);
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
  if (!fresh.empty() || extra > 0) {
    const NodeMemory m = read_node_memory();
    int64_t promised = 0;
    for (const auto& [name, x] : owned_) promised += untouched_bytes(name);
    const int64_t margin = snapshot_memory_margin(m);
    const double room = double(std::min(m.available, m.shm_free) - promised - margin);
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
      // worker mid-step) and leaves nothing behind when it fails.
      std::shared_ptr<ckpt::SnapshotSegment> seg;
      try {
        seg = std::make_shared<ckpt::SnapshotSegment>(
            ckpt::SnapshotSegment::create(name, capacity, int(::getpid()), data_slots(),
                                          o_.guardian_pid));
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
              " (", bytes_text(double(st.st_size)), " of shared memory)"));
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
  return {{"ok", true}, {"segments", names}};
}

json Agent::committed(const std::string& name, int64_t step) {
  auto it = owned_.find(name);
  if (it == owned_.end())
    return refusal(name + " is not a segment this agent holds (reserve it first)");
  std::optional<ckpt::SnapshotSegment::View> v = it->second.segment->latest();
  if (!v) return refusal(name + " has no committed slot: commit() before sending committed");
  // The first commit of a segment is an event; so is a step going back (a restarted job
  // writing again from an older step). Every commit at snapshot.every: 1 would be a line
  // per step and rank: `list` shows the newest instead.
  Owned& x = it->second;
  if (x.commits++ == 0 || v->meta.step < x.last_step || v->meta.step != step)
    say(str("committed ", name, ": step ", v->meta.step, " (epoch ", v->meta.epoch, ", rank ",
            v->meta.rank, ", ", bytes_text(double(v->meta.payload_bytes)), ", sequence ",
            v->meta.sequence, ")", x.commits == 1 ? "; later commits are not logged" : "",
            v->meta.step != step ? str("; the worker said step ", step) : std::string()));
  x.last_step = v->meta.step;
  const int64_t epoch = x.epoch;
  CommittedEvent e{name, it->second.segment, v->meta};
  locate(e, epoch);
  stage_.post(std::move(e));
  retire_older_than(epoch, v->meta.step);
  return {{"ok", true}, {"step", v->meta.step}};
}

// The rank's place among the node's ranks of the epoch (erasure coding's local rank).
void Agent::locate(CommittedEvent& e, int64_t epoch) const {
  std::vector<int> ranks;
  for (const auto& [n, x] : owned_)
    if (x.epoch == epoch) ranks.push_back(x.rank);
  std::sort(ranks.begin(), ranks.end());
  e.locals = int(ranks.size());
  e.local = int(std::find(ranks.begin(), ranks.end(), e.meta.rank) - ranks.begin());
  if (e.local >= e.locals) e.local = -1;
}

// Once every segment of `epoch` here has a committed slot, the older epochs' segments are
// no longer this node's only complete snapshot: unlink them (a resize's old world).
void Agent::retire_older_than(int64_t epoch, int64_t step) {
  bool older = false;
  for (const auto& [name, x] : owned_) {
    if (x.epoch == epoch && !has_commit(x)) return;  // the newer epoch is not complete
    older = older || x.epoch < epoch;
  }
  // The replicas of older epochs go with the node's own snapshots of them: a recovery now
  // starts from this epoch's.
  if (replicas_)
    for (const std::string& name : replicas_->retire_older_than(epoch))
      say(str("removed replica ", name, ": epoch superseded by epoch ", epoch,
              ", complete here at step ", step));
  if (parity_)
    for (const std::string& name : parity_->retire_older_than(epoch))
      say(str("removed ", name, ": epoch superseded by epoch ", epoch, ", complete here at step ",
              step));
  if (!older) return;
  for (auto it = owned_.begin(); it != owned_.end();) {
    if (it->second.epoch >= epoch) {
      ++it;
      continue;
    }
    ckpt::SnapshotSegment::unlink(it->first);
    say(str("removed ", it->first, ": epoch ", it->second.epoch, " is superseded by epoch ", epoch,
            ", complete here at step ", step));
    it = owned_.erase(it);
  }
}

json Agent::list() const {
  json segments = json::array();
  for (const auto& [name, x] : owned_) {
    ckpt::SegmentInfo s{name,        x.epoch, x.rank, x.segment->capacity(), x.segment->owner_pid(),
                        std::nullopt};
    try {
      if (std::optional<ckpt::SnapshotSegment::View> v = x.segment->latest()) s.committed = v->meta;
    } catch (const std::exception&) {
      // An inconsistent newest slot: listed as holding nothing (`weft snapshot verify` says why).
    }
    segments.push_back(ckpt::to_json(s));
  }
  if (replicas_)
    for (const ckpt::SegmentInfo& s : replicas_->list()) segments.push_back(ckpt::to_json(s));
  if (parity_)
    for (const ckpt::SegmentInfo& s : parity_->list()) segments.push_back(ckpt::to_json(s));
  return {{"ok", true}, {"segments", segments}};
}

json Agent::finish(const std::string& job) {
  if (job != o_.job_id) return refusal(str("this agent serves job ", o_.job_id, ", not ", job));
  if (listener_) listener_->stop();  // nothing lands after the unlinks below
  if (replicas_) replicas_->stop();
  if (parity_) parity_->stop();
  std::set<std::string> names;
  for (const auto& [name, x] : owned_) names.insert(name);
  for (const std::string& name : ckpt::snapshot_segments(o_.job_id)) names.insert(name);
  for (const std::string& name : names) ckpt::SnapshotSegment::unlink(name);
  owned_.clear();
  if (replicas_) replicas_->clear();
  if (parity_) parity_->clear();
  say(str("finish: job ", job, " ended well; removed its ", names.size(), " segment(s); exiting"));
  finished_ = true;
  return {{"ok", true}, {"removed", std::vector<std::string>(names.begin(), names.end())}};
}

void Agent::start_peers() {
  if (o_.listen.empty()) return;
  ckpt::PeerAuth auth;
  auth.job = o_.job_id;
  auth.token = comm::auth::token_from_env();
  auth.insecure = o_.insecure;
  const auto timeout = ckpt::default_snapshot_call_timeout();
  if (auth.token.empty() && !o_.insecure &&
      !comm::auth::is_loopback(ckpt::split_endpoint(o_.listen).first))
    say(str("no job token (WEFT_JOB_TOKEN): peers are accepted from this machine only"));
  if (o_.redundancy == "ec") {
    parity_ = std::make_unique<SnapshotParity>(
        ParityOptions{auth, o_.ec_k, o_.ec_m, timeout, o_.guardian_pid}, say);
    parity_->adopt();
  } else {
    replicas_ = std::make_unique<SnapshotReplicas>(ReplicaOptions{auth, timeout, o_.guardian_pid},
                                                   say);
    replicas_->adopt();
  }
  const auto [host, port] = ckpt::split_endpoint(o_.listen);
  listener_ = std::make_unique<ckpt::PeerListener>(
      host, port, auth, [this](ckpt::PeerChannel& ch) { serve_peer(ch); }, say, timeout);
}

// A peer's connection (a transport thread): replica pushes, or parity's chunk, stripe and
// fetch requests, one after another.
void Agent::serve_peer(ckpt::PeerChannel& ch) {
  for (;;) {
    const json h = ch.receive_request();
    if (replicas_ && replicas_->serve(ch, h)) continue;
    if (parity_ && parity_->serve(ch, h)) continue;
    ch.send({{"ok", false},
             {"error", str("unknown op for snapshot.redundancy ", o_.redundancy)}});
    throw IoError("an unknown request: " + h.dump().substr(0, 200));
  }
}

// `peers`: the ring of an epoch. The node's newest snapshots of that epoch go to the new
// successor at once (the stage takes each segment's newest commit).
json Agent::peers(const json& req) {
  if (!listener_)
    return refusal(
        "this agent was started without --listen: it has no peers (it neither sends "
        "nor receives replicas)");
  if (!req.contains("job") || !req["job"].is_string() || req["job"] != o_.job_id)
    return refusal(str("bad request: peers needs \"job\" (this agent serves job ", o_.job_id, ")"));
  if (!req.contains("epoch") || !req["epoch"].is_number_integer() || !req.contains("node") ||
      !req["node"].is_number_integer() || !req.contains("nodes") || !req["nodes"].is_array())
    return refusal(
        "bad request: peers needs \"epoch\", \"node\" (integers) and \"nodes\" (an array)");
  ReplicaRing r;
  r.epoch = req["epoch"].get<int64_t>();
  r.node = req["node"].get<int>();
  for (const json& n : req["nodes"]) {
    if (!n.is_string()) return refusal("bad request: peers' \"nodes\" are \"host:port\" strings");
    ckpt::split_endpoint(n.get<std::string>());  // std::invalid_argument: a bad request
    r.nodes.push_back(n.get<std::string>());
  }
  if (r.epoch < 0 || r.node < 0 || r.node >= int(r.nodes.size()))
    return refusal(str("bad request: node ", r.node, " of ", r.nodes.size(), ", epoch ", r.epoch));
  if (r.epoch < ring_epoch_)
    return refusal(
        str("epoch ", r.epoch, " is older than the ring this agent has (epoch ", ring_epoch_, ")"));
  ring_epoch_ = r.epoch;
  const std::optional<int> next = r.successor();
  const std::string to = next && replicas_ ? r.nodes[size_t(*next)] : std::string();
  const int64_t epoch = r.epoch;
  if (replicas_) replicas_->set_ring(std::move(r));
  if (parity_) parity_->set_ring(std::move(r));
  for (const auto& [name, x] : owned_) {
    if (x.epoch != epoch) continue;
    try {
      if (std::optional<ckpt::SnapshotSegment::View> v = x.segment->latest()) {
        CommittedEvent e{name, x.segment, v->meta};
        locate(e, epoch);
        stage_.post(std::move(e));
      }
    } catch (const std::exception&) {
    }
  }
  json reply = {{"ok", true}};
  reply["successor"] = to.empty() ? json(nullptr) : json(to);
  return reply;
}

int Agent::run() {
  take_lock();
  adopt();
  remove_abandoned();
  // Peers (and the parity or replicas they adopt) before the Unix socket: a client's
  // connect succeeds as soon as the socket listens, and by then every adoption is done.
  start_peers();
  listen();
  signals_.async_wait([this](boost::system::error_code ec, int sig) {
    if (ec) return;
    say(str("got ", sig == SIGINT ? "SIGINT" : "SIGTERM", ": stopping; ", owned_.size(),
            " segment(s) kept for a restart"));
    io_.stop();
  });
  accept();
  say(str("serving job ", o_.job_id, " node ", o_.node, " at ", o_.socket, " (pid ", ::getpid(),
          o_.guardian_pid > 0 ? str(", guardian pid ", o_.guardian_pid) : std::string(", no guardian"),
          ", ", owned_.size(), " segment(s) adopted)",
          listener_ ? str("; peers reach it at ", listener_->endpoint()) : std::string()));
  io_.run();
  return 0;
}

Agent::~Agent() {
  if (listener_) listener_->stop();
  if (replicas_) replicas_->stop();  // a push in flight is cut: the stage's thread ends now
  if (parity_) parity_->stop();
  boost::system::error_code ignored;
  acceptor_.close(ignored);
  if (listening_) ::unlink(o_.socket.c_str());
  if (lock_fd_ >= 0) {
    ::unlink(lock_path(o_.job_id, o_.node).c_str());  // before the unlock: no window unlocked
    ::close(lock_fd_);
  }
}

}  // namespace

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

std::optional<ckpt::SnapshotSegment::View> newest_unsent(const CommittedEvent& e, int64_t epoch,
                                                        const std::map<std::string, int64_t>& sent) {
  std::optional<ckpt::SnapshotSegment::View> v;
  try {
    v = e.segment->latest();
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (!v || v->meta.epoch != epoch) return std::nullopt;
  if (auto it = sent.find(e.name); it != sent.end() && it->second == v->meta.sequence)
    return std::nullopt;
  return v;
}

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

int run_snapshot_agent(const SnapshotAgentOptions& o, CommittedHandler on_committed) {
  std::signal(SIGPIPE, SIG_IGN);
  Agent agent(o, std::move(on_committed));
  return agent.run();
}

}  // namespace weft::launch
