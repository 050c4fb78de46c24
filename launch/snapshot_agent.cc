// The snapshot agent: the Asio line server, commits and epoch retirement, list, finish, and
// the agent's run; its lock and adoption, reserve's memory check and its peers live beside it
// (snapshot_agent_server.h).
#include "launch/snapshot_agent.h"

#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/post.hpp>
#include <boost/asio/read_until.hpp>
#include <boost/asio/streambuf.hpp>
#include <boost/asio/write.hpp>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <set>

#include "base/check.h"
#include "checkpoint/snapshot_agent_files.h"
#include "launch/snapshot_agent_server.h"

namespace weft::launch::agent_server {

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
std::string lock_path(const std::string& job, int node) { return ckpt::agent_lock_path(job, node); }

// Whether a segment holds a readable committed snapshot (an inconsistent one does not).
bool has_commit(const Owned& x) {
  try {
    return x.segment->latest().has_value();
  } catch (const std::exception&) {
    return false;
  }
}

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
  // {"op":"list","epoch":E}: a world of epoch E is forming. With parity, the lost nodes'
  // snapshots are rebuilt before they are listed. {"op":"repair",...}: a worker's read found
  // corrupt blocks; answered once the parity's thread has repaired them (or could not).
  if (parity_ && !finished_) {
    try {
      const json req = json::parse(line);
      const std::string op = req.is_object() ? req.value("op", std::string()) : std::string();
      if (op == "repair" && req.contains("segment") && req["segment"].is_string() &&
          req.contains("step") && req["step"].is_number_integer()) {
        // Answered on the io thread: the parity's thread only posts the reply.
        parity_->repair(req["segment"].get<std::string>(), req["step"].get<int64_t>(),
                        [this, reply = std::move(reply)](const json& r) {
                          asio::post(io_, [reply, r] { reply(r); });
                        });
        return;
      }
      if (op == "list" && req.contains("epoch") && req["epoch"].is_number_integer()) {
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
  // Every 2 ms: a list answered up to one period after the rebuild it waits for ends is that
  // much later on every survivor's recovery path (10 ms cost 5 on average); a look is a
  // mutex and a few compares.
  waiting_timer_.expires_after(std::chrono::milliseconds(2));
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
    if (op == "repair")  // the parity's is answered in respond()
      return refusal(parity_
                         ? "bad request: repair needs \"segment\" (string) and \"step\" (integer)"
                         : "repair: this agent keeps no parity (snapshot.redundancy is not ec)");
    if (op == "idle") return {{"ok", true}, {"idle", stage_.idle()}};
    if (op == "peers") return peers(req);
    if (op == "endpoint")
      return {{"ok", true}, {"endpoint", listener_ ? listener_->endpoint() : std::string()}};
    if (op == "finish") {
      if (!req.contains("job") || !req["job"].is_string())
        return refusal("bad request: finish needs \"job\"");
      const std::string scope = req.value("scope", std::string("job"));
      if (scope != "job" && scope != "node")
        return refusal("bad request: finish's \"scope\" is \"job\" or \"node\", not \"" + scope +
                       "\"");
      return finish(req["job"].get<std::string>(), scope == "node");
    }
    return refusal("bad request: unknown op '" + op +
                   "' (reserve, committed, idle, list, repair, peers, endpoint, finish)");
  } catch (const std::invalid_argument& e) {
    return refusal(str("bad request: ", op, ": ", e.what()));
  } catch (const std::exception& e) {
    say(str(op, " failed: ", e.what()));
    return refusal(e.what());
  }
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

json Agent::finish(const std::string& job, bool node_only) {
  if (job != o_.job_id) return refusal(str("this agent serves job ", o_.job_id, ", not ", job));
  if (listener_) listener_->stop();  // nothing lands after the unlinks below
  if (replicas_) replicas_->stop();
  if (parity_) parity_->stop();
  std::set<std::string> names;
  for (const auto& [name, x] : owned_) names.insert(name);
  for (const std::string& name : ckpt::snapshot_segments(o_.job_id)) {
    // A node leaving a job that goes on: what this agent made or adopted (each segment
    // records its owner), not what another node's agent on this machine holds.
    if (node_only) {
      try {
        if (ckpt::SnapshotSegment::open(name, false).owner_pid() != int(::getpid())) continue;
      } catch (const std::exception&) {
        continue;  // gone meanwhile, or being made by another agent
      }
    }
    names.insert(name);
  }
  for (const std::string& name : names) ckpt::SnapshotSegment::unlink(name);
  owned_.clear();
  if (replicas_) replicas_->clear();
  if (parity_) parity_->clear();
  say(node_only
          ? str("finish: this node left job ", job, " (its hand-over confirmed); removed the ",
                names.size(), " segment(s) this agent held; exiting")
          : str("finish: job ", job, " ended well; removed its ", names.size(),
                " segment(s); exiting"));
  finished_ = true;
  return {{"ok", true}, {"removed", std::vector<std::string>(names.begin(), names.end())}};
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

}  // namespace weft::launch::agent_server

namespace weft::launch {

namespace ckpt = checkpoint;

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

int run_snapshot_agent(const SnapshotAgentOptions& o, CommittedHandler on_committed) {
  std::signal(SIGPIPE, SIG_IGN);
  agent_server::Agent agent(o, std::move(on_committed));
  return agent.run();
}

}  // namespace weft::launch
