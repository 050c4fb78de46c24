// Internal to launch/: the snapshot agent's server, shared by its files (snapshot_agent.cc: the
// line server, commits, retirement, list and finish; snapshot_agent_adopt.cc: the lock,
// adoption and clean-up of abandoned jobs; snapshot_agent_reserve.cc: reserve's memory check;
// snapshot_agent_peers.cc: replicas and parity over TCP). Not an interface.
#pragma once

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "base/check.h"
#include "base/error.h"
#include "checkpoint/snapshot_protocol.h"
#include "launch/snapshot_agent.h"
#include "launch/snapshot_parity.h"
#include "launch/snapshot_replicas.h"

namespace weft::launch::agent_server {

namespace asio = boost::asio;
namespace ckpt = checkpoint;
using json = nlohmann::json;
using Local = asio::local::stream_protocol;

// One line to stderr, prefixed "[snapshot-agent]".
void say(const std::string& line);
std::string bytes_text(double b);
std::string shm_path(const std::string& name);
// The agent lock of a job on a node: held (flock) by its live agent.
std::string lock_path(const std::string& job, int node);

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
bool has_commit(const Owned& x);

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
  json finish(const std::string& job, bool node_only);
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

}  // namespace weft::launch::agent_server
